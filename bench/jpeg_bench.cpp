// Google Benchmark suite for the per-image cost of the JPEG pipeline on one thread, with the
// decode ceiling in the same run, on 300 files of the generated photo-like default dataset held in
// memory (no file system, no loader):
//   BM_Ceiling      full-size tjDecompress2 to RGB, what every loader that decodes whole images
//                   pays;
//   BM_DecodeCrop   JpegDecoder's decode of just the RandomResizedCrop box (rows down to its
//                   bottom, its columns, the smallest SIMD DCT scale that covers 224x224);
//                   /1 with the discard hook (DecodeOptions::discard_outside_crop, the
//                   default), /0 without, /2 with the hook and the own entropy decoder
//                   (DecodeOptions::own_entropy_decoder), /3 the same with a JpegEntropyIndex
//                   that a first pass over the files (epoch 0's crops, not timed) filled: the
//                   later epochs' decode (issue 35, step 3);
//   BM_ImageWriter  the whole sample: that decode, then libyuv's resize to 224x224, flip and
//                   split into CHW planes.
// A ratio BM_Ceiling time / BM_ImageWriter time above 1 is how much less work the pipeline does
// per image than a full decode.
// Run: build/bench/jpeg-bench [--benchmark_repetitions=5]
// The dataset is the one conveyor-bench generates (CONVEYOR_CACHE, else ~/.cache/conveyor); this
// generates it when it is missing.
#include <benchmark/benchmark.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cache_dir.h"
#include "codec/jpeg_segments.h"
#include "conveyor/conveyor.h"
#include "synthetic.h"

namespace conveyor {
namespace {

constexpr size_t kFiles = 300;

// The first kFiles files of the default dataset, spread over its classes, in memory; loaded
// afresh for each benchmark run (from the page cache after the first).
class JpegFiles : public benchmark::Fixture {
 public:
  void SetUp(const benchmark::State&) override {
    GeneratorOptions g;
    g.images_per_class = 150;  // conveyor-bench's default dataset: 1,500 images
    const std::string root = bench::default_dataset_dir(g.images_per_class);
    generate_image_folder(root, g);  // reuses a complete dataset
    auto source = ImageSource::image_folder(root, ImageTransform::train(224));
    const auto& items = source->items();
    files.clear();
    for (size_t i = 0; i < kFiles && i < items.size(); ++i) {
      files.emplace_back();
      read_file(items[i * items.size() / kFiles].path, files.back());
    }
  }
  void TearDown(const benchmark::State&) override { files.clear(); }

 protected:
  std::vector<std::vector<uint8_t>> files;
};

BENCHMARK_DEFINE_F(JpegFiles, Ceiling)(benchmark::State& state) {
  const auto& all = files;
  tjhandle handle = tjInitDecompress();
  std::vector<uint8_t> pixels;
  size_t i = 0;
  for (auto _ : state) {
    const auto& f = all[i++ % all.size()];
    int width = 0, height = 0, sub = 0, cs = 0;
    if (tjDecompressHeader3(handle, f.data(), f.size(), &width, &height, &sub, &cs) != 0 ||
        (pixels.resize(static_cast<size_t>(width) * height * 3),
         tjDecompress2(handle, f.data(), f.size(), pixels.data(), width, 0, height, TJPF_RGB, 0)) !=
            0) {
      state.SkipWithError(tjGetErrorStr2(handle));
      break;
    }
    benchmark::DoNotOptimize(pixels.data());
  }
  tjDestroy(handle);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_REGISTER_F(JpegFiles, Ceiling)->MinTime(2.0);

BENCHMARK_DEFINE_F(JpegFiles, DecodeCrop)(benchmark::State& state) {
  const auto& all = files;
  const ImageTransform transform = ImageTransform::train(224);
  DecodeOptions o;  // as ImageWriter decodes
  o.channels = 4;
  o.fast_upsampling = true;
  o.discard_outside_crop = state.range(0) != 0;  // /1: the discard hook (the default), /0: off
  o.own_entropy_decoder = state.range(0) >= 2;   // /2: the hook and the own entropy decoder
  if (state.range(0) == 3) o.entropy_index = std::make_shared<JpegEntropyIndex>();  // /3: indexed
  JpegDecoder decoder(DecodeLimits{}, o);
  size_t i = 0;
  if (o.entropy_index) {
    for (; i < all.size(); ++i) {  // epoch 0, untimed: every file's entry
      const JpegHeader h = decoder.begin(all[i].data(), all[i].size());
      const CropBox b = choose_crop(transform, h.width, h.height, 0, 0, i);
      decoder.finish_region(b.x, b.y, b.width, b.height, 224, 224);
    }
    state.counters["index_bytes_per_file"] =
        static_cast<double>(o.entropy_index->bytes()) / static_cast<double>(all.size());
  }
  for (auto _ : state) {
    const size_t k = i++;
    const auto& f = all[k % all.size()];
    const JpegHeader h = decoder.begin(f.data(), f.size());
    const CropBox b = choose_crop(transform, h.width, h.height, 0, k / all.size(), k % all.size());
    benchmark::DoNotOptimize(decoder.finish_region(b.x, b.y, b.width, b.height, 224, 224).pixels);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_REGISTER_F(JpegFiles, DecodeCrop)->Arg(1)->Arg(0)->Arg(2)->Arg(3)->MinTime(2.0);

// Writes the files in turn, one per iteration, each epoch its own crops; counts the DCT scales
// used into `scales` (9 entries) when given.
void write_in_turn(benchmark::State& state, ImageWriter& writer,
                   const std::vector<std::vector<uint8_t>>& all,
                   std::vector<uint64_t>* scales = nullptr) {
  std::vector<std::byte> out(3 * 224 * 224);
  size_t i = 0;
  for (auto _ : state) {
    const size_t k = i++;
    const auto& f = all[k % all.size()];
    SampleContext ctx{0, k % all.size(), 0, k / all.size()};
    writer.write(f.data(), f.size(), ctx, out.data());
    if (scales != nullptr) ++(*scales)[static_cast<size_t>(writer.last_scale())];
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK_DEFINE_F(JpegFiles, ImageWriter)(benchmark::State& state) {
  ImageWriter writer(ImageTransform::train(224));
  write_in_turn(state, writer, files);
}
BENCHMARK_REGISTER_F(JpegFiles, ImageWriter)->MinTime(2.0);

// DCT scaling, end to end (ImageWriter::write: the crop's decode, the resize to 224x224, flip
// and layout), for RandomResizedCrop 224 on photo-like files of three sizes, with and without
// restart markers every 4 MCUs (crop-proportional decoding), under three policies:
//   full  8/8 only, a resize does all the shrinking;
//   simd  1/8, 2/8, 4/8, 8/8 (the default);
//   any   every M/8.
// Arguments: size (0: 512x384, 1: 1024x768, 2: 2048x1536), policy (0 full, 1 simd, 2 any),
// restart markers (0, 1). 24 files per size, each re-encoded at quality 90 from a photo-like
// JPEG, so both codings hold the same pixels.
// Run: build/bench/jpeg-bench --benchmark_filter=DctScaling --benchmark_repetitions=3
const std::vector<std::vector<uint8_t>>& scaling_files(int size, bool restarts) {
  static std::vector<std::vector<uint8_t>> files[3][2];
  auto& out = files[size][restarts ? 1 : 0];
  if (!out.empty()) return out;
  const int width = 512 << size, height = 384 << size;
  DecodeOptions o;
  JpegDecoder decoder(DecodeLimits{}, o);
  for (uint64_t seed = 0; seed < 24; ++seed) {
    const std::vector<uint8_t> photo = make_photo_jpeg(width, height, 100 + seed);
    const DecodedImage image = decoder.decode(photo.data(), photo.size());
    std::vector<uint8_t> rgb;
    for (int r = 0; r < image.height; ++r) {
      const uint8_t* row = image.pixels + image.stride * static_cast<size_t>(r);
      rgb.insert(rgb.end(), row, row + static_cast<size_t>(image.width) * 3);
    }
    EncodeOptions e;
    e.restart_interval = restarts ? 4 : 0;
    out.push_back(encode_jpeg(rgb.data(), image.width, image.height, e));
  }
  return out;
}

void BM_DctScaling(benchmark::State& state) {
  const int size = static_cast<int>(state.range(0));
  const int policy = static_cast<int>(state.range(1));
  const auto& all = scaling_files(size, state.range(2) != 0);
  ImageTransform t = ImageTransform::train(224);
  t.dct_scales = policy == 0 ? kFullDctScale : policy == 1 ? kSimdDctScales : kAllDctScales;
  ImageWriter writer(t);
  std::vector<uint64_t> scales(9, 0);
  write_in_turn(state, writer, all, &scales);
  const double n = static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  for (int m = 1; m <= 8; ++m) {
    state.counters["at" + std::to_string(m) + "/8"] = static_cast<double>(scales[m]) / n;
  }
  state.SetLabel(std::string(policy == 0   ? "full"
                             : policy == 1 ? "simd"
                                           : "any") +
                 (state.range(2) ? " restarts" : ""));
}
BENCHMARK(BM_DctScaling)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}, {0, 1}})
    ->MinTime(1.0)
    ->Unit(benchmark::kMicrosecond);

// Finding a file's restart intervals: the scan for markers (a file without a segment index)
// against reading conveyor-prepare's index, on the 512x384 files with restart markers every 4
// MCUs (192 intervals). Argument: 0 scan, 1 index.
void BM_SegmentLayout(benchmark::State& state) {
  std::vector<std::vector<uint8_t>> files = scaling_files(0, true);
  if (state.range(0) != 0) {
    for (auto& f : files) {
      std::vector<uint8_t> indexed;
      if (!detail::add_segment_index(f.data(), f.size(), indexed)) {
        state.SkipWithError("a file could not take a segment index");
        return;
      }
      f = std::move(indexed);
    }
  }
  detail::SegmentLayout layout;
  size_t i = 0;
  for (auto _ : state) {
    const auto& f = files[i++ % files.size()];
    if (!detail::read_segment_layout(f.data(), f.size(), layout) ||
        layout.indexed != (state.range(0) != 0)) {
      state.SkipWithError("unexpected layout");
      break;
    }
    benchmark::DoNotOptimize(layout.ends.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(state.range(0) != 0 ? "index" : "scan");
}
BENCHMARK(BM_SegmentLayout)->Arg(0)->Arg(1)->MinTime(0.5)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace conveyor

BENCHMARK_MAIN();
