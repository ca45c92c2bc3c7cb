// GPU decode in the loader (issue 24, LoaderOptions::gpu_decode).
//
// GpuDecodeLoader runs everywhere: the engine's routing, the decode thread, the CPU fallbacks
// and the device rows' hand-over to the copy stage, with a device decoder whose "device" is host
// memory (simulated_device_decoder.h) behind a host-side copy engine. That decoder writes the CPU
// path's bytes, so every batch must equal a CPU-only loader's batch exactly: a row in the wrong
// place, a row the copy stage did not take from the device, or a sample decoded twice shows.
// GpuDecodeLoaderGpu needs a GPU with hardware JPEG engines (and skips, saying why, without one):
// the real nvJPEG path against the CPU path within GpuCropDecoder's tolerance, also while the
// training thread captures CUDA graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/serialize/archive.h>

#include "conveyor/decode_balance.h"
#include "conveyor/gpu_decode.h"
#include "png_writer.h"
#include "simulated_device_decoder.h"
#include "test_support.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;
using testing::finishes_within;
using testing::InstantCopyEngine;
using testing::LateCopyEngine;
using testing::load_from_string;
using testing::save_to_string;
using testing::SimulatedDeviceDecoders;

// Photo-like files of a few sizes, and every few files one the hardware refuses.
struct Corpus {
  std::vector<std::vector<uint8_t>> files;
  std::vector<int64_t> labels;
  std::set<size_t> refused;  // indices hardware_route() sends to the CPU
};

Corpus make_corpus(size_t n, uint64_t seed, bool mixed = true) {
  Corpus c;
  std::vector<uint8_t> rgb(96 * 72 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 7 + seed) % 251);
  for (size_t i = 0; i < n; ++i) {
    std::vector<uint8_t> file;
    if (mixed && i % 7 == 3) {
      EncodeOptions e;
      const size_t kind = (i / 7) % 4;
      e.progressive = kind == 0;
      e.color = kind == 1   ? EncodeOptions::Color::kCmyk
                : kind == 2 ? EncodeOptions::Color::kYcck
                            : EncodeOptions::Color::kYCbCr;
      if (kind == 3) e.h_samp = 4, e.v_samp = 1;  // 4:1:1
      file = encode_jpeg(rgb.data(), 96, 72, e);
    } else if (mixed && i % 11 == 5) {
      EncodeOptions e;
      e.color = EncodeOptions::Color::kGray;  // the hardware takes gray
      file = encode_jpeg(rgb.data(), 96, 72, e);
    } else {
      file = make_photo_jpeg(80 + static_cast<int>(i % 5) * 8, 64 + static_cast<int>(i % 3) * 8,
                             seed + i, 85);
    }
    if (!hardware_route(file.data(), file.size()).hardware) c.refused.insert(i);
    c.files.push_back(std::move(file));
    c.labels.push_back(static_cast<int64_t>(i % 10));
  }
  return c;
}

std::shared_ptr<ImageSource> source_of(const Corpus& c, int size = 32) {
  ImageTransform t = ImageTransform::train(size);
  return ImageSource::in_memory(c.files, c.labels, t);
}

LoaderOptions options(size_t batch, size_t workers, size_t chunk, GpuDecode gpu) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.chunk_size = chunk;
  o.seed = 11;
  o.gpu_decode = gpu;
  return o;
}

GpuDecode with_threads(GpuDecode mode, size_t threads, size_t max_batch) {
  mode.threads = threads;
  mode.max_batch = max_batch;
  return mode;
}

GpuDecode simulated(GpuDecode mode, std::shared_ptr<const DeviceDecoderFactory> decoders) {
  mode.decoder = std::move(decoders);
  return mode;
}

// The batches of `epochs` epochs, tensors on the CPU.
std::vector<Batch> run(DataLoader& loader, int epochs) {
  std::vector<Batch> out;
  for (int e = 0; e < epochs; ++e) {
    for (Batch& b : loader) out.push_back(b);
  }
  return out;
}

void expect_same_batches(const std::vector<Batch>& got, const std::vector<Batch>& want,
                         const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].indices, want[i].indices) << where << ", batch " << i;
    EXPECT_EQ(got[i].epoch, want[i].epoch) << where << ", batch " << i;
    ASSERT_EQ(got[i].fields.size(), want[i].fields.size()) << where;
    for (size_t f = 0; f < got[i].fields.size(); ++f) {
      EXPECT_TRUE(got[i].fields[f].equal(want[i].fields[f]))
          << where << ": batch " << i << " field " << got[i].names[f] << " differs";
    }
  }
}

// A CPU-only loader's batches: RandomSampler(5), or the sequential order.
std::vector<Batch> cpu_reference(const Corpus& c, size_t batch, int epochs,
                                 ErrorPolicy policy = ErrorPolicy::kRaise,
                                 bool sequential = false) {
  LoaderOptions o = options(batch, 2, 0, GpuDecode::off());
  o.on_error = policy;
  DataLoader loader(source_of(c), o,
                    sequential ? SequentialSampler::make() : RandomSampler::make(5));
  return run(loader, epochs);
}

// Each mode, with several worker counts and chunk sizes, and both copy engines: the batches are
// the CPU path's, byte for byte, every sample is decoded once per epoch, the GPU decoded what it
// was sent and the hardware takes, and the counts add up.
TEST(GpuDecodeLoader, EveryModeDeliversTheCpuPathsBatches) {
  const Corpus c = make_corpus(90, 3);
  const std::vector<Batch> want = cpu_reference(c, 16, 2);
  struct Case {
    GpuDecode mode;
    size_t workers, chunk;
    bool late_copies;
  };
  const std::vector<Case> cases = {
      {GpuDecode::fixed_share(0.5), 2, 4, false},
      {GpuDecode::fixed_share(0.5), 3, 5, true},
      {GpuDecode::hardware_only(), 1, 16, false},
      {GpuDecode::hardware_only(), 2, 3, true},
      {GpuDecode::automatic(), 2, 4, false},
      {GpuDecode::automatic(), 3, 8, true},
      {GpuDecode::fixed_share(0.0), 2, 4, false},
      {with_threads(GpuDecode::fixed_share(0.7), 1, 8), 2, 3, true},
      {with_threads(GpuDecode::automatic(), 3, 4), 2, 4, true},
      {with_threads(GpuDecode::hardware_only(), 3, 512), 1, 5, false},
  };
  for (const Case& k : cases) {
    const std::string where = "mode " + std::to_string(static_cast<int>(k.mode.mode)) + " share " +
                              std::to_string(k.mode.share) + ", " + std::to_string(k.workers) +
                              " workers, chunk " + std::to_string(k.chunk);
    SCOPED_TRACE(where);
    auto decoders = std::make_shared<SimulatedDeviceDecoders>();
    std::unique_ptr<CopyEngine> engine;
    if (k.late_copies) {
      engine = std::make_unique<LateCopyEngine>(2ms);
    } else {
      engine = std::make_unique<InstantCopyEngine>();
    }
    DataLoader loader(source_of(c), options(16, k.workers, k.chunk, simulated(k.mode, decoders)),
                      RandomSampler::make(5), std::move(engine));
    EXPECT_NE(loader.mode().find("GPU decode: simulated device decoder on cpu"), std::string::npos)
        << loader.mode();
    expect_same_batches(run(loader, 2), want, where);
    const LoaderStats s = loader.stats();
    EXPECT_TRUE(s.gpu_decode.active);
    EXPECT_EQ(s.gpu_decode.gpu_images + s.gpu_decode.cpu_images, s.samples);
    EXPECT_EQ(s.gpu_decode.gpu_images, decoders->record()->decoded.size());
    EXPECT_EQ(s.gpu_decode.failed_batches, 0u);
    EXPECT_EQ(decoders->record()->decoders, k.mode.threads);  // one per decode thread
    EXPECT_LE(decoders->record()->largest_call, std::max(k.mode.max_batch, k.chunk) + k.chunk);
    for (const auto& [epoch, index] : decoders->record()->decoded) {
      EXPECT_EQ(c.refused.count(index), 0u) << "the device decoded a file it refuses";
    }
    if (k.mode.mode == GpuDecode::Mode::kShare) {
      // Exactly the samples the share sends there, less those the hardware refuses.
      std::set<std::pair<uint64_t, size_t>> expected;
      size_t refused = 0;
      for (uint64_t e = 0; e < 2; ++e) {
        for (size_t i = 0; i < c.files.size(); ++i) {
          if (fixed_share_decoder(k.mode.share, 11, e, i) != Decoder::kGpu) continue;
          if (c.refused.count(i)) {
            ++refused;
          } else {
            expected.emplace(e, i);
          }
        }
      }
      EXPECT_EQ(decoders->record()->decoded, expected);
      EXPECT_EQ(s.gpu_decode.refused, refused);
    } else {
      EXPECT_GT(s.gpu_decode.gpu_images, 0u);
      EXPECT_GT(s.gpu_decode.cpu_images, 0u);
      EXPECT_GT(s.gpu_decode.gpu_ns_per_image, 0.0);
      EXPECT_GT(s.gpu_decode.cpu_ns_per_image, 0.0);
    }
    EXPECT_GT(s.gpu_decode.gpu_idle_seconds + s.gpu_decode.gpu_busy_seconds, 0.0);
  }
}

// A source of three fields, the image in the middle: a label, the image, and a weight, each
// written from an ImageSource's sample. It offers the image field to a device decoder through the
// capability (or, with `offer` false, does not).
class ThreeFieldSource : public SampleSource {
 public:
  ThreeFieldSource(std::shared_ptr<ImageSource> images, bool offer)
      : images_(std::move(images)), offer_(offer) {}
  size_t size() const override { return images_->size(); }
  std::vector<FieldSpec> fields() const override {
    FieldSpec pixels = images_->fields()[0];
    pixels.name = "pixels";
    return {{"label", c10::ScalarType::Long, {}}, pixels, {"weight", c10::ScalarType::Float, {}}};
  }
  void prepare(size_t workers) override { images_->prepare(workers); }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    std::byte* image_fields[2] = {fields[1], fields[0]};  // the ImageSource's: image, label
    images_->write_sample(ctx, image_fields);
    write_weight(ctx, fields);
  }
  std::string describe(size_t index) const override { return images_->describe(index); }
  std::optional<EncodedImageField> encoded_image_field() const override {
    if (!offer_) return std::nullopt;
    return EncodedImageField{1, images_->transform()};
  }
  Encoded read_encoded(const SampleContext& ctx, std::vector<uint8_t>& buffer,
                       std::byte* const* fields) override {
    std::byte* image_fields[2] = {nullptr, fields[0]};  // the image is the caller's to write
    const Encoded encoded = images_->read_encoded(ctx, buffer, image_fields);
    write_weight(ctx, fields);
    return encoded;
  }

 private:
  static void write_weight(const SampleContext& ctx, std::byte* const* fields) {
    const float weight = 0.25f * static_cast<float>(ctx.index);
    std::memcpy(fields[2], &weight, sizeof weight);
  }
  std::shared_ptr<ImageSource> images_;
  bool offer_;
};

// GPU decode finds the field it may write through the source's capability, wherever it is among
// the fields: a source of three fields, the image second, gets the CPU path's batches, field for
// field, with the images decoded on the device; mode() names the field.
// The codec seam routes (issue 32): PNG files among JPEGs go to the CPU before they are queued
// to the device, which is never given one; every batch is the CPU path's.
TEST(GpuDecodeLoader, FilesThatAreNotJpegsGoToTheCpuBeforeTheDevice) {
  Corpus c = make_corpus(40, 9, false);
  std::set<size_t> pngs;
  for (size_t i = 2; i < c.files.size(); i += 6) {
    testing::PngSpec s;
    s.width = 70 + static_cast<int>(i);
    s.height = 50;
    s.color_type = i % 12 == 2 ? 6 : 2;
    c.files[i] = testing::make_png(s, i).bytes;
    pngs.insert(i);
  }
  const std::vector<Batch> want = cpu_reference(c, 8, 2);
  auto decoders = std::make_shared<SimulatedDeviceDecoders>();
  DataLoader loader(source_of(c), options(8, 2, 4, simulated(GpuDecode::hardware_only(), decoders)),
                    RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
  EXPECT_NE(loader.mode().find("GPU decode: simulated device decoder on cpu"), std::string::npos)
      << loader.mode();
  expect_same_batches(run(loader, 2), want, "PNGs among JPEGs");
  const LoaderStats s = loader.stats();
  EXPECT_EQ(s.gpu_decode.cpu_images, 2 * pngs.size());
  EXPECT_EQ(s.gpu_decode.gpu_images, 2 * (c.files.size() - pngs.size()));
  EXPECT_EQ(decoders->record()->given.size(), 2 * (c.files.size() - pngs.size()));
  for (const auto& [epoch, index] : decoders->record()->given) {
    EXPECT_EQ(pngs.count(index), 0u) << "the device was given the PNG at " << index;
  }
}

TEST(GpuDecodeLoader, AnyFieldTheSourceOffersIsDecodedOnTheDevice) {
  const Corpus c = make_corpus(40, 6);
  LoaderOptions cpu = options(8, 2, 0, GpuDecode::off());
  DataLoader reference(std::make_shared<ThreeFieldSource>(source_of(c), true), cpu,
                       RandomSampler::make(5));
  const std::vector<Batch> want = run(reference, 2);
  for (GpuDecode mode :
       {GpuDecode::hardware_only(), GpuDecode::fixed_share(0.5), GpuDecode::automatic()}) {
    SCOPED_TRACE("mode " + std::to_string(static_cast<int>(mode.mode)));
    auto decoders = std::make_shared<SimulatedDeviceDecoders>();
    DataLoader loader(std::make_shared<ThreeFieldSource>(source_of(c), true),
                      options(8, 2, 3, simulated(mode, decoders)), RandomSampler::make(5),
                      std::make_unique<LateCopyEngine>(1ms));
    EXPECT_NE(loader.mode().find("GPU decode: simulated device decoder on cpu"), std::string::npos)
        << loader.mode();
    EXPECT_NE(loader.mode().find("field \"pixels\""), std::string::npos) << loader.mode();
    expect_same_batches(run(loader, 2), want, "three fields");
    const LoaderStats s = loader.stats();
    EXPECT_TRUE(s.gpu_decode.active);
    EXPECT_GT(s.gpu_decode.gpu_images, 0u);
    EXPECT_EQ(s.gpu_decode.gpu_images, decoders->record()->decoded.size());
    EXPECT_EQ(s.gpu_decode.gpu_images + s.gpu_decode.cpu_images, s.samples);
  }
}

// A source that does not offer a field, or offers one that is not an image row of its transform
// (or not one of its fields at all), is decoded on the CPU, and the status says why: never a
// process stopped by a check.
class MisfitSource : public ThreeFieldSource {
 public:
  MisfitSource(std::shared_ptr<ImageSource> images, size_t field)
      : ThreeFieldSource(images, true), transform_(images->transform()), field_(field) {}
  std::optional<EncodedImageField> encoded_image_field() const override {
    return EncodedImageField{field_, transform_};
  }

 private:
  ImageTransform transform_;
  size_t field_;
};

TEST(GpuDecodeLoader, ASourceWithoutAFittingFieldIsDecodedOnTheCpuAndSaysWhy) {
  const Corpus c = make_corpus(24, 7);
  LoaderOptions cpu = options(8, 2, 0, GpuDecode::off());
  DataLoader reference(std::make_shared<ThreeFieldSource>(source_of(c), false), cpu,
                       RandomSampler::make(5));
  const std::vector<Batch> want = run(reference, 1);
  struct Case {
    std::shared_ptr<SampleSource> source;
    std::string why;
  };
  const std::vector<Case> cases = {
      {std::make_shared<ThreeFieldSource>(source_of(c), false),
       "the source has no field a device decoder may write (SampleSource::encoded_image_field)"},
      {std::make_shared<MisfitSource>(source_of(c), 2),
       "the source's encoded image field \"weight\" is not a uint8 image"},
      {std::make_shared<MisfitSource>(source_of(c), 3),
       "the source's encoded image field is number 3, and the source has 3 fields"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.why);
    auto decoders = std::make_shared<SimulatedDeviceDecoders>();
    DataLoader loader(k.source, options(8, 2, 3, simulated(GpuDecode::hardware_only(), decoders)),
                      RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
    expect_same_batches(run(loader, 1), want, k.why);
    const GpuDecodeStats s = loader.stats().gpu_decode;
    EXPECT_FALSE(s.active);
    EXPECT_EQ(s.status.rfind("GPU decode unused: ", 0), 0u) << s.status;
    EXPECT_NE(s.status.find(k.why), std::string::npos) << s.status;
    EXPECT_NE(loader.mode().find(k.why), std::string::npos) << loader.mode();
    EXPECT_EQ(decoders->record()->calls, 0u);
  }
}

// Rows decoded on the device do not cross PCIe: the copy takes from the host only the rows the CPU
// wrote (the copy engines' accounting, host_rows()). hw-only on files the hardware takes: no host
// byte of the image field; a mixed split: exactly the CPU's rows; the other fields whole.
TEST(GpuDecodeLoader, OnlyTheRowsTheCpuWroteAreCopiedFromTheHost) {
  struct Case {
    GpuDecode mode;
    bool mixed_files;
    bool late;
  };
  for (const Case& k :
       {Case{GpuDecode::hardware_only(), false, false},
        Case{GpuDecode::hardware_only(), false, true},
        Case{GpuDecode::fixed_share(0.5), true, false}, Case{GpuDecode::automatic(), true, true}}) {
    SCOPED_TRACE("mode " + std::to_string(static_cast<int>(k.mode.mode)) +
                 (k.mixed_files ? ", mixed files" : "") + (k.late ? ", late copies" : ""));
    const Corpus c = make_corpus(45, 9, k.mixed_files);
    auto accounting = std::make_shared<testing::CopyAccounting>();
    std::unique_ptr<CopyEngine> engine;
    if (k.late) {
      engine = std::make_unique<LateCopyEngine>(1ms, accounting);
    } else {
      engine = std::make_unique<InstantCopyEngine>(accounting);
    }
    DataLoader loader(
        source_of(c),
        options(8, 2, 4, simulated(k.mode, std::make_shared<SimulatedDeviceDecoders>())),
        RandomSampler::make(5), std::move(engine));
    expect_same_batches(run(loader, 1), cpu_reference(c, 8, 1), "host rows");
    const LoaderStats s = loader.stats();
    const uint64_t row = 3 * 32 * 32;
    EXPECT_EQ(accounting->host(0), s.gpu_decode.cpu_images * row);
    EXPECT_EQ(accounting->device(0), s.gpu_decode.gpu_images * row);
    EXPECT_EQ(accounting->host(1), 45u * sizeof(int64_t));  // the labels, whole
    EXPECT_EQ(accounting->device(1), 0u);
    if (!k.mixed_files && k.mode.share == 1.0) {  // hw-only on files the hardware takes
      EXPECT_EQ(accounting->host(0), 0u) << "the image field crossed PCIe";
      EXPECT_EQ(s.gpu_decode.gpu_images, 45u);
    } else {
      EXPECT_GT(accounting->host(0), 0u);
      EXPECT_GT(accounting->device(0), 0u);
    }
  }
}

// The GPU path's steps on the CPU (the simulated decoder's kGpuMath: the region nvJPEG decodes
// around each crop, the ROI's place in it, the crop kernel's math), through the loader: at 8/8
// they are the CPU path's bytes exactly, for random crops and flips of photos and for center
// crops of one-pixel grids off the MCU grid, so a region read one pixel off fails here.
TEST(GpuDecodeLoader, TheGpuPathsCropIsTheCpuPathsToTheByteAtFullScale) {
  Corpus c;
  for (size_t i = 0; i < 40; ++i) {
    c.files.push_back(
        i % 2 ? make_grid_jpeg(83 + static_cast<int>(i % 5) * 6, 61 + static_cast<int>(i % 3) * 4)
              : make_photo_jpeg(90 + static_cast<int>(i % 4) * 10, 70, 200 + i, 90));
    c.labels.push_back(static_cast<int64_t>(i));
  }
  for (ImageTransform t : {ImageTransform::train(32), ImageTransform::eval(32, 61)}) {
    t.dct_scales = kFullDctScale;
    for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
      t.layout = layout;
      SCOPED_TRACE(
          std::string(t.mode == ImageTransform::Mode::kRandomResizedCrop ? "train" : "eval") +
          (layout == ImageLayout::kHWC ? ", HWC" : ", CHW"));
      const auto source = [&] { return ImageSource::in_memory(c.files, c.labels, t); };
      DataLoader reference(source(), options(8, 2, 0, GpuDecode::off()), RandomSampler::make(5));
      auto decoders = std::make_shared<SimulatedDeviceDecoders>(
          0us, std::set<size_t>{}, false, SimulatedDeviceDecoders::Pixels::kGpuMath);
      DataLoader loader(source(), options(8, 2, 4, simulated(GpuDecode::hardware_only(), decoders)),
                        RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
      expect_same_batches(run(loader, 2), run(reference, 2), "the GPU path's math");
      EXPECT_EQ(loader.stats().gpu_decode.gpu_images, 80u);
    }
  }
}

// A decode thread takes every chunk queued for the device into one call, up to max_batch images
// (and less than a chunk more): the engines get batches, not chunks.
TEST(GpuDecodeLoader, ADecodeCallTakesTheQueuedChunksUpToMaxBatch) {
  const Corpus c = make_corpus(96, 17, /*mixed=*/false);
  auto decoders = std::make_shared<SimulatedDeviceDecoders>(1ms);  // slow: chunks queue up
  DataLoader loader(
      source_of(c),
      options(32, 2, 4, simulated(with_threads(GpuDecode::hardware_only(), 1, 16), decoders)),
      RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
  expect_same_batches(run(loader, 1), cpu_reference(c, 32, 1), "hw-only, one thread");
  const auto& record = *decoders->record();
  EXPECT_GT(record.largest_call, 4u) << "every call held one chunk";
  EXPECT_LE(record.largest_call, 16u + 4u);
  EXPECT_LT(record.calls, 96u / 4u);  // fewer calls than chunks
  EXPECT_EQ(loader.stats().gpu_decode.gpu_images, 96u);
}

// A fixed share is a pure function of (seed, epoch, index): the same samples go to the device
// whatever the workers and chunk size, and an epoch resumed from a checkpoint sends its remaining
// samples where the uninterrupted run did (and so has the same bytes).
TEST(GpuDecodeLoader, AFixedShareSendsEachSampleWhereItWentBeforeAcrossResume) {
  const Corpus c = make_corpus(60, 8);
  const GpuDecode share = GpuDecode::fixed_share(0.6);
  auto whole = std::make_shared<SimulatedDeviceDecoders>();
  DataLoader uninterrupted(source_of(c), options(8, 2, 3, simulated(share, whole)),
                           RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
  const std::vector<Batch> want = run(uninterrupted, 1);

  std::string checkpoint;
  {
    auto first = std::make_shared<SimulatedDeviceDecoders>();
    DataLoader loader(source_of(c), options(8, 3, 5, simulated(share, first)),
                      RandomSampler::make(5), std::make_unique<LateCopyEngine>(1ms));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next());
    checkpoint = save_to_string(loader);
  }
  auto second = std::make_shared<SimulatedDeviceDecoders>();
  DataLoader resumed(source_of(c), options(8, 1, 8, simulated(share, second)),
                     RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
  load_from_string(resumed, checkpoint);
  std::vector<Batch> rest;
  for (Batch& b : resumed) rest.push_back(b);
  expect_same_batches(rest, std::vector<Batch>(want.begin() + 3, want.end()), "resumed");
  // The resumed run's device decodes are the uninterrupted run's, less the first 3 batches'.
  std::set<size_t> first_batches;
  for (size_t i = 0; i < 3; ++i)
    first_batches.insert(want[i].indices.begin(), want[i].indices.end());
  std::set<std::pair<uint64_t, size_t>> expected;
  for (const auto& d : whole->record()->decoded) {
    if (!first_batches.count(d.second)) expected.insert(d);
  }
  EXPECT_EQ(second->record()->decoded, expected);
}

// Resume works in every mode: a checkpoint taken mid-epoch (with other workers and chunks)
// continues with the batches an uninterrupted run has next, every sample once.
TEST(GpuDecodeLoader, ResumeContinuesTheEpochInEveryMode) {
  const Corpus c = make_corpus(56, 12);
  const std::vector<Batch> want = cpu_reference(c, 8, 1);
  for (GpuDecode mode :
       {GpuDecode::fixed_share(0.3), GpuDecode::hardware_only(), GpuDecode::automatic()}) {
    SCOPED_TRACE("mode " + std::to_string(static_cast<int>(mode.mode)) + " share " +
                 std::to_string(mode.share));
    std::string checkpoint;
    {
      DataLoader loader(
          source_of(c),
          options(8, 2, 3, simulated(mode, std::make_shared<SimulatedDeviceDecoders>())),
          RandomSampler::make(5), std::make_unique<LateCopyEngine>(1ms));
      for (int i = 0; i < 4; ++i) ASSERT_TRUE(loader.next());
      checkpoint = save_to_string(loader);
    }
    DataLoader resumed(
        source_of(c),
        options(8, 3, 8, simulated(mode, std::make_shared<SimulatedDeviceDecoders>())),
        RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
    load_from_string(resumed, checkpoint);
    std::vector<Batch> rest;
    for (Batch& b : resumed) rest.push_back(b);
    expect_same_batches(rest, std::vector<Batch>(want.begin() + 4, want.end()), "resumed");
  }
}

// A corrupt file and a truncated one sent to the device: under kRaise the batch fails with a
// SampleError naming the file and the sample, as on the CPU; under kSkip they are counted and
// substituted, and the batches are the CPU path's.
TEST(GpuDecodeLoader, BadFilesSentToTheDeviceFollowTheErrorPolicy) {
  Corpus c = make_corpus(40, 21, /*mixed=*/false);
  std::vector<uint8_t>& broken = c.files[9];
  for (size_t i = 2; i < 300 && i < broken.size(); ++i) broken[i] = static_cast<uint8_t>(i * 37);
  c.files[17].resize(c.files[17].size() / 2);
  const GpuDecode all = GpuDecode::hardware_only();
  {
    auto decoders = std::make_shared<SimulatedDeviceDecoders>();
    LoaderOptions o = options(8, 2, 4, simulated(all, decoders));
    DataLoader loader(source_of(c), o, SequentialSampler::make(),
                      std::make_unique<InstantCopyEngine>());
    std::vector<size_t> failed;
    for (;;) {
      try {
        std::optional<Batch> b = loader.next();
        if (!b) break;
      } catch (const SampleError& e) {
        failed.push_back(e.index());
        EXPECT_NE(std::string(e.what()).find("sample " + std::to_string(e.index())),
                  std::string::npos)
            << e.what();
        EXPECT_NE(e.path().find(std::to_string(e.index())), std::string::npos) << e.path();
      }
    }
    EXPECT_EQ(failed, (std::vector<size_t>{9, 17}));
  }
  {
    auto decoders = std::make_shared<SimulatedDeviceDecoders>();
    LoaderOptions o = options(8, 2, 4, simulated(all, decoders));
    o.on_error = ErrorPolicy::kSkip;
    DataLoader loader(source_of(c), o, RandomSampler::make(5),
                      std::make_unique<LateCopyEngine>(1ms));
    expect_same_batches(run(loader, 1), cpu_reference(c, 8, 1, ErrorPolicy::kSkip), "skip");
    const LoaderStats s = loader.stats();
    EXPECT_EQ(s.skipped, 2u);
    std::set<size_t> skipped;
    for (const SkippedSample& k : s.skipped_samples) skipped.insert(k.index);
    EXPECT_EQ(skipped, (std::set<size_t>{9, 17}));
    EXPECT_EQ(s.gpu_decode.refused, 2u);  // both left to the CPU path, which named them
  }
}

// A failure of the device decode call itself (a CUDA or nvJPEG error, not sticky) is not a file's:
// every image of the call is decoded on the CPU instead, so every batch arrives with the CPU path's
// pixels and nothing is skipped for it; a really corrupt file among them still meets on_error,
// once.
TEST(GpuDecodeLoader, AFailedDecodeCallIsDecodedOnTheCpuAndOnlyABadFileMeetsThePolicy) {
  Corpus c = make_corpus(48, 30, /*mixed=*/false);
  std::vector<uint8_t>& broken = c.files[10];  // in batch 1, decoded by the failing call 1
  for (size_t i = 2; i < 300 && i < broken.size(); ++i) broken[i] = static_cast<uint8_t>(i * 37);
  // One GPU job per batch (chunk = batch), one decode thread, one job per call (max_batch = a
  // chunk), in order: decode call 1 is batch 1's.
  const auto gpu = [](std::shared_ptr<SimulatedDeviceDecoders> decoders) {
    return options(8, 1, 8, simulated(with_threads(GpuDecode::hardware_only(), 1, 8), decoders));
  };
  {
    auto decoders = std::make_shared<SimulatedDeviceDecoders>(0us, std::set<size_t>{1});
    LoaderOptions o = gpu(decoders);
    o.on_error = ErrorPolicy::kSkip;
    DataLoader loader(source_of(c), o, SequentialSampler::make(),
                      std::make_unique<InstantCopyEngine>());
    expect_same_batches(run(loader, 1),
                        cpu_reference(c, 8, 1, ErrorPolicy::kSkip, /*sequential=*/true), "skip");
    const LoaderStats s = loader.stats();
    EXPECT_EQ(s.gpu_decode.failed_batches, 1u);
    EXPECT_EQ(s.skipped, 1u);
    EXPECT_EQ(s.errors, 1u);
    ASSERT_EQ(s.skipped_samples.size(), 1u);
    EXPECT_EQ(s.skipped_samples[0].index, 10u);
    EXPECT_EQ(s.samples, 48u);
    EXPECT_EQ(s.gpu_decode.gpu_images + s.gpu_decode.cpu_images, 48u);
    EXPECT_GE(s.gpu_decode.cpu_images, 8u);  // the failed call's images
  }
  {
    auto decoders = std::make_shared<SimulatedDeviceDecoders>(0us, std::set<size_t>{1});
    DataLoader loader(source_of(c), gpu(decoders), SequentialSampler::make(),
                      std::make_unique<InstantCopyEngine>());
    const std::vector<Batch> want = cpu_reference(c, 8, 1, ErrorPolicy::kSkip, true);
    size_t good = 0;
    std::vector<size_t> failed;
    for (size_t i = 0;; ++i) {
      try {
        std::optional<Batch> b = loader.next();
        if (!b) break;
        EXPECT_TRUE(b->images().equal(want[b->sequence].images())) << "batch " << b->sequence;
        ++good;
      } catch (const SampleError& e) {
        failed.push_back(e.index());
        EXPECT_EQ(i, 1u);
        EXPECT_EQ(std::string(e.what()).find("cudaErrorIllegalAddress"), std::string::npos)
            << "the call's error reached the user: " << e.what();
      }
    }
    EXPECT_EQ(good, 5u);
    EXPECT_EQ(failed, std::vector<size_t>{10});  // the corrupt file, named as on the CPU
    EXPECT_EQ(loader.stats().errors, 1u);
    EXPECT_EQ(loader.stats().gpu_decode.failed_batches, 1u);
  }
}

// A copy stage whose copies fail once the simulated device is lost (a sticky error), as a real copy
// stream on that device would: start() and check() throw "the copy stream failed".
class LosableCopyEngine : public CopyEngine {
 public:
  explicit LosableCopyEngine(std::shared_ptr<SimulatedDeviceDecoders::Record> record)
      : record_(std::move(record)) {}
  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent* event, std::function<void()> on_finished) override {
    if (record_->device_lost.load()) {
      on_finished();
      throw std::runtime_error(
          "conveyor: cudaMemcpyAsync of a batch to cuda:0 failed "
          "(cudaErrorIllegalAddress)");
    }
    return inner_.start(host, on_device, event, std::move(on_finished));
  }
  c10::Device device() const override { return inner_.device(); }
  void check() override {
    if (record_->device_lost.load()) {
      throw std::runtime_error("conveyor: the copy stream failed (cudaErrorIllegalAddress)");
    }
  }

 private:
  std::shared_ptr<SimulatedDeviceDecoders::Record> record_;
  InstantCopyEngine inner_;
};

// A decode call that fails with a sticky CUDA error loses the device: the loader raises that
// error, naming GPU decode and the error, not the copy stream's failure that follows it; and again
// on the next call, never a hang.
TEST(GpuDecodeLoader, AStickyErrorOfGpuDecodeIsRaisedAsGpuDecodesNotTheCopyStreams) {
  const Corpus c = make_corpus(64, 31, /*mixed=*/false);
  auto decoders = std::make_shared<SimulatedDeviceDecoders>(0us, std::set<size_t>{1}, true);
  LoaderOptions o =
      options(8, 1, 8, simulated(with_threads(GpuDecode::hardware_only(), 1, 8), decoders));
  const std::vector<Batch> want = cpu_reference(c, 8, 1, ErrorPolicy::kRaise, true);
  finishes_within(60s, "a sticky error of GPU decode", [&] {
    DataLoader loader(source_of(c), o, SequentialSampler::make(),
                      std::make_unique<LosableCopyEngine>(decoders->record()));
    size_t delivered = 0;
    std::string error;
    bool gpu_decode_error = false;
    for (;;) {
      try {
        std::optional<Batch> b = loader.next();
        ASSERT_TRUE(b) << "the epoch ended after the device was lost";
        EXPECT_TRUE(b->images().equal(want[b->sequence].images())) << "batch " << b->sequence;
        ++delivered;
      } catch (const GpuDecodeError& e) {
        error = e.what();
        gpu_decode_error = e.context_lost() && e.error_name() == "cudaErrorIllegalAddress";
        break;
      } catch (const std::exception& e) {
        error = e.what();
        break;
      }
    }
    EXPECT_TRUE(gpu_decode_error) << error;
    EXPECT_NE(error.find("GPU decode (simulated device decoder on cpu"), std::string::npos)
        << error;
    EXPECT_NE(error.find("lost the device"), std::string::npos) << error;
    EXPECT_NE(error.find("cudaErrorIllegalAddress"), std::string::npos) << error;
    EXPECT_LE(delivered, 1u + o.prefetch_factor);  // batch 1's call lost it
    EXPECT_THROW(loader.next(), GpuDecodeError);   // and the loader stays failed
  });
}

// Breaking out of epochs and destroying the loader while the decode thread is mid-chunk: no
// hang, nothing delivered twice, and the next epoch's batches are whole.
TEST(GpuDecodeLoader, BreakingOffAndDestroyingMidEpochWithDeviceJobsInFlight) {
  const Corpus c = make_corpus(64, 40);
  const std::vector<Batch> want = cpu_reference(c, 8, 3);
  for (GpuDecode mode : {GpuDecode::fixed_share(0.7), GpuDecode::automatic()}) {
    finishes_within(60s, "break and destroy with GPU decode", [&] {
      auto decoders = std::make_shared<SimulatedDeviceDecoders>(2ms);
      DataLoader loader(source_of(c), options(8, 2, 4, simulated(mode, decoders)),
                        RandomSampler::make(5), std::make_unique<LateCopyEngine>(1ms));
      for (Batch& b : loader) {  // epoch 0: one batch, then break
        EXPECT_TRUE(b.images().equal(want[0].images()));
        break;
      }
      std::vector<Batch> epoch1;
      for (Batch& b : loader) epoch1.push_back(b);  // a whole epoch after the break
      expect_same_batches(epoch1, std::vector<Batch>(want.begin() + 8, want.begin() + 16),
                          "the epoch after a break");
      loader.start_epoch();
      ASSERT_TRUE(loader.next());  // epoch 2 under way: destroyed mid-epoch
    });
  }
}

// Where GPU decode cannot run, the loader decodes everything on the CPU, as with kOff, and says
// why: a loader on the CPU, a source without an encoded image field, and nvJPEG on a copy stage
// whose device is not a CUDA device (or, on this machine, whatever gpu_decode_status() says).
TEST(GpuDecodeLoader, WhereItCannotRunTheCpuDecodesAndTheLoaderSaysWhy) {
  const Corpus c = make_corpus(24, 50);
  const std::vector<Batch> want = cpu_reference(c, 8, 1);
  {
    DataLoader loader(source_of(c), options(8, 2, 0, GpuDecode::automatic()),
                      RandomSampler::make(5));
    expect_same_batches(run(loader, 1), want, "CPU device");
    EXPECT_NE(loader.mode().find("GPU decode unused: batches go to the CPU"), std::string::npos)
        << loader.mode();
    EXPECT_FALSE(loader.stats().gpu_decode.active);
    EXPECT_EQ(loader.stats().gpu_decode.status.rfind("GPU decode unused", 0), 0u);
  }
  {
    DataLoader loader(source_of(c), options(8, 2, 0, GpuDecode::hardware_only()),
                      RandomSampler::make(5), std::make_unique<InstantCopyEngine>());
    expect_same_batches(run(loader, 1), want, "nvJPEG without a CUDA device");
    const GpuDecodeStats s = loader.stats().gpu_decode;
    EXPECT_FALSE(s.active);
    EXPECT_EQ(s.status.rfind("GPU decode unavailable: ", 0), 0u) << s.status;
    EXPECT_EQ(s.gpu_images, 0u);
    EXPECT_NE(loader.mode().find(s.status), std::string::npos);
  }
  {
    DataLoader loader(
        std::make_shared<PatternSource>(20, 64),
        options(4, 2, 0,
                simulated(GpuDecode::hardware_only(), std::make_shared<SimulatedDeviceDecoders>())),
        SequentialSampler::make(), std::make_unique<InstantCopyEngine>());
    EXPECT_EQ(run(loader, 1).size(), 5u);
    EXPECT_NE(loader.mode().find("the source has no field a device decoder may write"),
              std::string::npos)
        << loader.mode();
    EXPECT_FALSE(loader.stats().gpu_decode.active);
  }
  {
    LoaderOptions o = options(8, 2, 0, GpuDecode::off());
    DataLoader loader(source_of(c), o, RandomSampler::make(5),
                      std::make_unique<InstantCopyEngine>());
    expect_same_batches(run(loader, 1), want, "off");
    EXPECT_EQ(loader.stats().gpu_decode.status, "off");
    EXPECT_EQ(loader.mode().find("GPU decode"), std::string::npos) << loader.mode();
  }
}

// ---------------------------------------------------------------------------------------------
// On a GPU with hardware JPEG engines: nvJPEG's hardware backend in the loader.

class GpuDecodeLoaderGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuDecodeStatus status = gpu_decode_status();
    if (!status.available) GTEST_SKIP() << status.reason;
  }
  // torch keeps the pinned staging block of a CUDA tensor's item() (the tests' comparisons) for
  // reuse; compute-sanitizer's leak check counts it unless it is handed back here.
  void TearDown() override { at::getHostAllocator(at::kCUDA)->empty_cache(); }
};

struct Difference {
  int max_abs = 0;
  double psnr = INFINITY;
};
Difference compare(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = (a.to(at::kInt) - b.to(at::kInt)).abs();
  Difference out;
  out.max_abs = d.max().item<int>();
  const double mse = d.to(at::kDouble).pow(2).mean().item<double>();
  if (mse > 0) out.psnr = 10 * std::log10(255.0 * 255.0 / mse);
  return out;
}

// Every mode on cuda:0 against the CPU path on a mixed corpus (photos of 500 x 375 and the
// kinds the hardware refuses): the same samples, labels and crops, each image within the stated
// tolerance, refused files decoded on the CPU, and a fixed share bit-exact from run to run.
TEST_F(GpuDecodeLoaderGpu, BatchesMatchTheCpuPathWithinTheTolerance) {
  Corpus c;
  for (size_t i = 0; i < 96; ++i) {
    c.files.push_back(make_photo_jpeg(i % 3 == 0 ? 375 : 500, i % 3 == 0 ? 500 : 375, 70 + i, 90));
    c.labels.push_back(static_cast<int64_t>(i % 10));
  }
  const Corpus odd = make_corpus(32, 4);
  for (size_t i = 0; i < odd.files.size(); ++i) {
    c.files.push_back(odd.files[i]);
    c.labels.push_back(odd.labels[i]);
  }
  auto source = [&] {
    return ImageSource::in_memory(c.files, c.labels, ImageTransform::train(224));
  };
  LoaderOptions cpu = options(32, 4, 0, GpuDecode::off());
  DataLoader reference(source(), cpu, RandomSampler::make(5));
  const std::vector<Batch> want = run(reference, 1);
  for (GpuDecode mode :
       {GpuDecode::hardware_only(), GpuDecode::fixed_share(0.5), GpuDecode::automatic()}) {
    LoaderOptions o = options(32, 4, 8, mode);
    o.device = c10::Device("cuda:0");
    std::vector<Batch> runs[2];
    GpuDecodeStats stats;
    for (auto& r : runs) {
      DataLoader loader(source(), o, RandomSampler::make(5));
      ASSERT_NE(loader.mode().find("GPU decode: nvJPEG hardware backend on cuda:0"),
                std::string::npos)
          << loader.mode();
      for (Batch& b : loader) r.push_back(b);
      stats = loader.stats().gpu_decode;
    }
    ASSERT_EQ(runs[0].size(), want.size());
    int worst_abs = 0;
    double worst_psnr = INFINITY;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(runs[0][i].indices, want[i].indices);
      EXPECT_TRUE(runs[0][i].labels().cpu().equal(want[i].labels()));
      const at::Tensor got = runs[0][i].images().cpu();
      for (int64_t r = 0; r < got.size(0); ++r) {
        const Difference d = compare(got[r], want[i].images()[r]);
        EXPECT_LE(d.max_abs, GpuCropDecoder::kMaxAbsDiff) << "batch " << i << " row " << r;
        EXPECT_GE(d.psnr, GpuCropDecoder::kMinPsnr) << "batch " << i << " row " << r;
        worst_abs = std::max(worst_abs, d.max_abs);
        worst_psnr = std::min(worst_psnr, d.psnr);
      }
      if (mode.mode == GpuDecode::Mode::kShare) {
        EXPECT_TRUE(runs[0][i].images().equal(runs[1][i].images())) << "not bit-exact, batch " << i;
      }
    }
    EXPECT_GT(stats.gpu_images, 0u);
    EXPECT_GT(stats.refused, 0u);
    std::printf(
        "GPU decode in the loader, %s: %llu images on the GPU, %llu on the CPU (%llu refused), "
        "max abs diff %d, worst PSNR %.1f dB\n",
        stats.status.c_str(), static_cast<unsigned long long>(stats.gpu_images),
        static_cast<unsigned long long>(stats.cpu_images),
        static_cast<unsigned long long>(stats.refused), worst_abs, worst_psnr);
  }
}

// The training thread captures CUDA graphs (in the default, global mode, where another thread's
// cudaMalloc, cudaFree or stream synchronization breaks the capture) while the loader's decode
// threads decode the next batches: every capture succeeds, and the batches are the CPU path's
// within the tolerance.
TEST_F(GpuDecodeLoaderGpu, AGraphCapturedOnTheTrainingThreadWhileTheLoaderDecodes) {
  Corpus c;
  for (size_t i = 0; i < 96; ++i) {
    c.files.push_back(make_photo_jpeg(500, 375, 300 + i, 90));
    c.labels.push_back(static_cast<int64_t>(i % 10));
  }
  auto source = [&] {
    return ImageSource::in_memory(c.files, c.labels, ImageTransform::train(224));
  };
  DataLoader reference(source(), options(16, 2, 0, GpuDecode::off()), RandomSampler::make(5));
  const std::vector<Batch> want = run(reference, 1);
  LoaderOptions o = options(16, 2, 0, with_threads(GpuDecode::hardware_only(), 2, 16));
  o.device = c10::Device("cuda:0");
  DataLoader loader(source(), o, RandomSampler::make(5));
  const at::Tensor x = at::ones({1 << 16}, at::TensorOptions().device(at::kCUDA));
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  size_t batches = 0, captures = 0;
  for (Batch& b : loader) {
    for (int k = 0; k < 4; ++k) {
      at::cuda::CUDAGraph graph;
      at::Tensor y;
      bool captured = false;
      {
        const c10::cuda::CUDAStreamGuard guard(side);
        graph.capture_begin();
        y = x;
        for (int op = 0; op < 100; ++op) y = y * 1.0001f + 0.5f;
        // Kept open a few milliseconds, so that the decode threads' calls fall inside it.
        std::this_thread::sleep_for(5ms);
        try {
          graph.capture_end();  // throws where another thread's call invalidated the capture
          captured = true;
        } catch (const std::exception& e) {
          ADD_FAILURE() << "a capture broke, batch " << batches << ": " << e.what();
        }
      }
      if (captured) graph.replay();
      captures += captured ? 1 : 0;
    }
    ASSERT_LT(batches, want.size());
    EXPECT_EQ(b.indices, want[batches].indices);
    const at::Tensor got = b.images().cpu();
    for (int64_t r = 0; r < got.size(0); ++r) {
      const Difference d = compare(got[r], want[batches].images()[r]);
      EXPECT_LE(d.max_abs, GpuCropDecoder::kMaxAbsDiff) << "batch " << batches << " row " << r;
    }
    ++batches;
  }
  EXPECT_EQ(batches, want.size());
  EXPECT_GT(loader.stats().gpu_decode.gpu_images, 0u);
  std::printf("%zu graphs captured while GPU decode ran, %zu batches right\n", captures, batches);
}

// Where the crop's region is read, to the pixel, on the hardware: one-pixel grids whose center
// crops start off the MCU grid and are kept at 8/8 (a crop as large as the output). The decoders'
// rounding stays far below the tolerance there, while a region read one pixel off in either
// direction changes every pixel by 255 (a PSNR of 30 dB, and an average difference, would not
// see one wrong row or column; this sees any).
TEST_F(GpuDecodeLoaderGpu, AOnePixelGridIsCroppedWhereTheCpuCropsIt) {
  Corpus c;
  for (size_t i = 0; i < 48; ++i) {
    c.files.push_back(make_grid_jpeg(83 + static_cast<int>(i % 4) * 6, 61));
    c.labels.push_back(static_cast<int64_t>(i));
  }
  auto source = [&] {
    return ImageSource::in_memory(c.files, c.labels, ImageTransform::eval(32, 61));
  };
  DataLoader reference(source(), options(16, 2, 0, GpuDecode::off()), SequentialSampler::make());
  const std::vector<Batch> want = run(reference, 1);
  LoaderOptions o = options(16, 2, 8, GpuDecode::hardware_only());
  o.device = c10::Device("cuda:0");
  DataLoader loader(source(), o, SequentialSampler::make());
  ASSERT_NE(loader.mode().find("GPU decode: nvJPEG hardware backend on cuda:0"), std::string::npos)
      << loader.mode();
  const std::vector<Batch> got = run(loader, 1);
  ASSERT_EQ(got.size(), want.size());
  int worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const at::Tensor g = got[i].images().cpu();
    for (int64_t r = 0; r < g.size(0); ++r) {
      const Difference d = compare(g[r], want[i].images()[r]);
      EXPECT_LE(d.max_abs, GpuCropDecoder::kMaxAbsDiff) << "batch " << i << " row " << r;
      worst = std::max(worst, d.max_abs);
    }
  }
  EXPECT_EQ(loader.stats().gpu_decode.gpu_images, 48u);
  std::printf("one-pixel grids on the GPU: max abs diff %d against the CPU path\n", worst);
}

}  // namespace
}  // namespace conveyor
