// gpudecode_gpu_test: GpuCropDecoder on a GPU with hardware JPEG engines (issue 24). Every test
// skips, with gpu_decode_status()'s reason, where GPU decode is unavailable (no libnvjpeg.so.13,
// no CUDA device, no hardware engine).
// - The pixels against the CPU path (ImageWriter) on photo-like files, for RandomResizedCrop and
//   the evaluation crop, CHW and HWC: max abs diff <= GpuCropDecoder::kMaxAbsDiff and PSNR >=
//   kMinPsnr per row (the figures are printed for the GPU check's log). Same bytes twice.
// - A mixed batch: the files the hardware refuses go to the CPU and their rows are left as they
//   were; the others are decoded as above.
// - A corrupt file fails only its own sample, naming the file; a truncated one goes to the CPU,
//   whose decoder raises it (through the loader's on_error) naming the file.
// - A CUDA error in the decode (a kernel writing to an unmapped address) fails the batch with
//   the error's name, and the process lives on (in a death-test child: the error is sticky).
// - A file whose entropy-coded data is corrupt (header and EOI intact) never becomes a row: the
//   strict handle refuses it (to the CPU, whose decoder raises it, or failed); a batch nvJPEG
//   refuses has finished on its stream when decode() returns, and the next batch decodes.
// - The crop kernel reports its own launch error, never one left pending by earlier work.
// - Buffers are allocated up front for max_batch regions of the expected size: decoding such
//   batches grows nothing; a larger region grows the region buffer once.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "conveyor/cuda.h"
#include "conveyor/datasets.h"
#include "conveyor/gpu_decode.h"
#include "conveyor/jpeg.h"
#include "crop_kernel.h"
#include "crop_plan.h"
#include "synthetic.h"  // make_photo_jpeg

namespace conveyor {
namespace {

struct Difference {
  int max_abs = 0;
  double psnr = INFINITY;
};
Difference compare(const uint8_t* a, const uint8_t* b, size_t n) {
  Difference d;
  double squared = 0;
  for (size_t i = 0; i < n; ++i) {
    const int e = std::abs(int{a[i]} - int{b[i]});
    d.max_abs = std::max(d.max_abs, e);
    squared += double(e) * e;
  }
  if (squared > 0) d.psnr = 10 * std::log10(255.0 * 255.0 / (squared / double(n)));
  return d;
}

class GpuDecode : public ::testing::Test {
 protected:
  void SetUp() override {
    status_ = gpu_decode_status();
    if (!status_.available) GTEST_SKIP() << status_.reason;
    std::printf("GPU decode on cuda:%d, %u engines x %u cores, %s\n", status_.device,
                status_.engines, status_.cores_per_engine, status_.library.c_str());
  }

  // The batch's rows on the GPU, decoded by `decoder`, back on the host; rows it did not write
  // keep the byte 0x5A.
  static std::vector<uint8_t> decode_rows(GpuCropDecoder& decoder, const std::vector<GpuJpeg>& in,
                                          int side, GpuDecodeResult& result) {
    const at::Tensor rows =
        at::full({static_cast<int64_t>(in.size()), 3, side, side}, 0x5A,
                 at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, 0)));
    result = decoder.decode(in.data(), in.size(), rows.data_ptr<uint8_t>(),
                            c10::cuda::getCurrentCUDAStream(0).stream());
    const at::Tensor host = rows.cpu().contiguous();
    return std::vector<uint8_t>(host.data_ptr<uint8_t>(), host.data_ptr<uint8_t>() + host.numel());
  }

  static std::vector<uint8_t> cpu_row(ImageWriter& writer, const GpuJpeg& j) {
    const int side = writer.transform().size;
    std::vector<uint8_t> row(static_cast<size_t>(side) * side * 3);
    writer.write(j.data, j.size, j.context, reinterpret_cast<std::byte*>(row.data()));
    return row;
  }

  GpuDecodeStatus status_;
};

std::vector<std::vector<uint8_t>> photos(size_t n, uint64_t seed) {
  std::vector<std::vector<uint8_t>> files;
  for (size_t i = 0; i < n; ++i) {
    const int w = i % 3 == 0 ? 375 : 500 + static_cast<int>(i % 5) * 17;
    const int h = i % 3 == 0 ? 500 : 375;
    files.push_back(make_photo_jpeg(w, h, seed + i, 90));
  }
  return files;
}

std::vector<GpuJpeg> batch_of(const std::vector<std::vector<uint8_t>>& files, uint64_t epoch) {
  std::vector<GpuJpeg> batch;
  for (size_t i = 0; i < files.size(); ++i) {
    batch.push_back(GpuJpeg{files[i].data(), files[i].size(), SampleContext{0, i, 7, epoch},
                            "photo" + std::to_string(i) + ".jpg"});
  }
  return batch;
}

TEST_F(GpuDecode, PixelsMatchTheCpuPathWithinTheStatedTolerance) {
  const std::vector<std::vector<uint8_t>> files = photos(64, 100);
  for (ImageTransform t : {ImageTransform::train(224), ImageTransform::eval(224, 256)}) {
    for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
      t.layout = layout;
      GpuDecodeOptions o;
      o.transform = t;
      o.max_batch = 64;
      GpuCropDecoder decoder(o);
      ImageWriter writer(t);
      const std::vector<GpuJpeg> batch = batch_of(files, 2);
      GpuDecodeResult result;
      const std::vector<uint8_t> rows = decode_rows(decoder, batch, t.size, result);
      EXPECT_TRUE(result.to_cpu.empty()) << result.to_cpu.size() << " baseline photos refused";
      EXPECT_TRUE(result.failed.empty()) << result.failed.front().message;
      const size_t row_bytes = static_cast<size_t>(t.size) * t.size * 3;
      int worst_abs = 0;
      double worst_psnr = INFINITY, sum_psnr = 0;
      for (size_t i = 0; i < batch.size(); ++i) {
        const std::vector<uint8_t> cpu = cpu_row(writer, batch[i]);
        const Difference d = compare(cpu.data(), rows.data() + i * row_bytes, row_bytes);
        EXPECT_LE(d.max_abs, GpuCropDecoder::kMaxAbsDiff) << batch[i].name;
        EXPECT_GE(d.psnr, GpuCropDecoder::kMinPsnr) << batch[i].name;
        worst_abs = std::max(worst_abs, d.max_abs);
        worst_psnr = std::min(worst_psnr, d.psnr);
        sum_psnr += std::isinf(d.psnr) ? 99.0 : d.psnr;
      }
      std::printf(
          "GPU vs CPU path, %s %s, %zu photos: max abs diff %d, PSNR worst %.1f dB, "
          "mean %.1f dB\n",
          t.mode == ImageTransform::Mode::kRandomResizedCrop ? "RandomResizedCrop" : "eval",
          layout == ImageLayout::kHWC ? "HWC" : "CHW", batch.size(), worst_abs, worst_psnr,
          sum_psnr / double(batch.size()));
      // Bit-exact per decoder: the same batch decodes to the same bytes again.
      GpuDecodeResult again;
      EXPECT_EQ(decode_rows(decoder, batch, t.size, again), rows);
    }
  }
}

TEST_F(GpuDecode, FilesTheHardwareRefusesGoToTheCpuAndTheirRowsAreUntouched) {
  std::vector<uint8_t> rgb(160 * 120 * 3);
  std::mt19937 rng(9);
  for (uint8_t& v : rgb) v = static_cast<uint8_t>(rng() % 64 + 96);
  auto encoded = [&](EncodeOptions::Color color, int h, int v, bool progressive) {
    EncodeOptions e;
    e.color = color;
    e.h_samp = h;
    e.v_samp = v;
    e.progressive = progressive;
    return encode_jpeg(rgb.data(), 160, 120, e);
  };
  using C = EncodeOptions::Color;
  std::vector<std::vector<uint8_t>> files = photos(4, 500);
  files.push_back(encoded(C::kYCbCr, 2, 2, true));   // progressive
  files.push_back(encoded(C::kCmyk, 1, 1, false));   // CMYK
  files.push_back(encoded(C::kYCbCr, 4, 1, false));  // 4:1:1
  files.push_back(encoded(C::kYcck, 2, 2, false));   // YCCK
  files.push_back(encoded(C::kYCbCr, 4, 2, false));  // 4:1:0
  files.push_back(encoded(C::kYCbCr, 2, 1, false));  // 4:2:2 baseline: hardware
  files.push_back(encoded(C::kGray, 1, 1, false));   // grayscale baseline: hardware
  const ImageTransform t = ImageTransform::train(64);
  GpuDecodeOptions o;
  o.transform = t;
  GpuCropDecoder decoder(o);
  ImageWriter writer(t);
  const std::vector<GpuJpeg> batch = batch_of(files, 0);
  GpuDecodeResult result;
  const std::vector<uint8_t> rows = decode_rows(decoder, batch, t.size, result);
  EXPECT_TRUE(result.failed.empty());
  std::vector<size_t> expected_cpu;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!hardware_route(files[i].data(), files[i].size()).hardware) expected_cpu.push_back(i);
  }
  EXPECT_EQ(result.to_cpu, expected_cpu);
  const size_t row_bytes = static_cast<size_t>(t.size) * t.size * 3;
  for (size_t i = 0; i < files.size(); ++i) {
    const uint8_t* row = rows.data() + i * row_bytes;
    if (std::find(result.to_cpu.begin(), result.to_cpu.end(), i) != result.to_cpu.end()) {
      EXPECT_TRUE(std::all_of(row, row + row_bytes, [](uint8_t b) { return b == 0x5A; }))
          << "row " << i << " was written though its file went to the CPU";
      continue;
    }
    const std::vector<uint8_t> cpu = cpu_row(writer, batch[i]);
    const Difference d = compare(cpu.data(), row, row_bytes);
    EXPECT_LE(d.max_abs, GpuCropDecoder::kMaxAbsDiff) << "file " << i;
    EXPECT_GE(d.psnr, GpuCropDecoder::kMinPsnr) << "file " << i;
  }
}

TEST_F(GpuDecode, ACorruptFileFailsOnlyItsOwnSampleNamingTheFile) {
  std::vector<std::vector<uint8_t>> files = photos(4, 900);
  std::vector<uint8_t> bad = files[1];
  for (size_t i = 2; i < 200 && i < bad.size(); ++i) bad[i] = static_cast<uint8_t>(i * 37);
  files[1] = bad;                        // a broken header
  files[2].resize(files[2].size() / 2);  // cut short
  const ImageTransform t = ImageTransform::train(96);
  GpuDecodeOptions o;
  o.transform = t;
  GpuCropDecoder decoder(o);
  ImageWriter writer(t);
  std::vector<GpuJpeg> batch = batch_of(files, 1);
  batch[1].name = "/data/broken-header.jpg";
  batch[2].name = "/data/cut-short.jpg";
  GpuDecodeResult result;
  const std::vector<uint8_t> rows = decode_rows(decoder, batch, t.size, result);
  ASSERT_EQ(result.failed.size(), 1u);
  EXPECT_EQ(result.failed[0].position, 1u);
  EXPECT_NE(result.failed[0].message.find("/data/broken-header.jpg"), std::string::npos)
      << result.failed[0].message;
  EXPECT_NE(result.failed[0].message.find("NVJPEG_STATUS_"), std::string::npos)
      << result.failed[0].message;
  EXPECT_EQ(result.to_cpu, std::vector<size_t>{2});
  // The CPU path raises the truncated file (the loader's on_error then names it).
  EXPECT_THROW(cpu_row(writer, batch[2]), JpegError);
  const size_t row_bytes = static_cast<size_t>(t.size) * t.size * 3;
  for (size_t i : {size_t{0}, size_t{3}}) {
    const std::vector<uint8_t> cpu = cpu_row(writer, batch[i]);
    EXPECT_GE(compare(cpu.data(), rows.data() + i * row_bytes, row_bytes).psnr,
              GpuCropDecoder::kMinPsnr)
        << batch[i].name;
  }
}

// The kernel writes to an address no allocation holds: CUDA reports cudaErrorIllegalAddress,
// which is sticky (the context is lost), so the test runs in a fresh child process. The batch
// fails with GpuDecodeError naming the error and the batch's first file; the process goes on.
TEST_F(GpuDecode, ACudaErrorFailsTheBatchNotTheProcessInAChildProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::vector<std::vector<uint8_t>> files = photos(2, 40);
        GpuDecodeOptions o;
        o.transform = ImageTransform::train(64);
        GpuCropDecoder decoder(o);
        std::vector<GpuJpeg> batch = batch_of(files, 0);
        batch[0].name = "/data/first-of-the-batch.jpg";
        auto* unmapped = reinterpret_cast<uint8_t*>(uintptr_t{1} << 46);
        try {
          decoder.decode(batch.data(), batch.size(), unmapped,
                         c10::cuda::getCurrentCUDAStream(0).stream());
          std::fprintf(stderr, "no error\n");
          std::exit(1);
        } catch (const GpuDecodeError& e) {
          std::fprintf(stderr, "GpuDecodeError %s: %s\n", e.error_name().c_str(), e.what());
          const std::string what = e.what();
          std::exit(e.error_name() == "cudaErrorIllegalAddress" &&
                            what.find("/data/first-of-the-batch.jpg") != std::string::npos
                        ? 0
                        : 2);
        }
      },
      ::testing::ExitedWithCode(0), "GpuDecodeError cudaErrorIllegalAddress");
}

TEST_F(GpuDecode, ABatchLargerThanMaxBatchIsRefused) {
  const std::vector<std::vector<uint8_t>> files = photos(3, 7);
  GpuDecodeOptions o;
  o.transform = ImageTransform::train(32);
  o.max_batch = 2;
  GpuCropDecoder decoder(o);
  const std::vector<GpuJpeg> batch = batch_of(files, 0);
  GpuDecodeResult result;
  EXPECT_THROW(decode_rows(decoder, batch, 32, result), std::invalid_argument);
}

// A baseline photo whose entropy-coded data is scrambled in the middle of its scan; the header,
// the tables and the EOI are intact, and no byte of the scan becomes a marker (0xFF).
std::vector<uint8_t> corrupt_scan(std::vector<uint8_t> file) {
  size_t sos = 0;
  for (size_t i = 2; i + 3 < file.size(); ++i) {
    if (file[i] == 0xFF && file[i + 1] == 0xDA) {
      sos = i;
      break;
    }
  }
  EXPECT_GT(sos, 0u) << "no SOS marker";
  const size_t scan = sos + 2 + (size_t{file[sos + 2]} << 8 | file[sos + 3]);
  const size_t end = file.size() - 2;  // the EOI
  std::mt19937 rng(77);
  for (size_t i = scan + (end - scan) / 4; i < scan + (end - scan) * 3 / 4; ++i) {
    if (file[i] == 0xFF || file[i - 1] == 0xFF) continue;  // stuffed zeros and markers stay
    file[i] = static_cast<uint8_t>(rng() % 0xFF);          // never 0xFF
  }
  return file;
}

// The photo cut in the middle of its scan: no EOI.
std::vector<uint8_t> truncated_scan(std::vector<uint8_t> file) {
  file.resize(file.size() / 2);
  return file;
}

// Two damaged scans in a batch of four photos, the whole image resized (so that the CPU path
// decodes every row: a crop above the damage would decode only its own rows, and never see it):
// - cut short (no EOI): the GPU route sends it to the CPU before nvJPEG sees it, and the CPU path
//   refuses it, so it never becomes a row;
// - scrambled in the middle without a marker: the entropy-coded data of a baseline JPEG has no
//   redundancy to check when its Huffman tables fill their code space, so neither decoder has to
//   notice (on an H200, driver 580, nvJPEG 13, the hardware decoded it and libjpeg-turbo accepted
//   it: wrong pixels from both, docs/design.md's GPU decode). What holds for it is the rest: a row
//   the hardware refuses is never written, the stream is idle after the call, and the next call is
//   healthy.
TEST_F(GpuDecode, ACorruptScanNeverBecomesARowAndTheStreamIsIdleAfterARefusedBatch) {
  ImageTransform t = ImageTransform::train(96);
  t.mode = ImageTransform::Mode::kResize;
  GpuDecodeOptions o;
  o.transform = t;
  GpuCropDecoder decoder(o);
  std::printf("nvJPEG handle strict (NVJPEG_FLAGS_BITSTREAM_STRICT): %s\n",
              decoder.status().strict ? "yes" : "no");
  EXPECT_TRUE(decoder.status().strict) << "the hardware backend refused the strict flag";
  ImageWriter writer(t);
  CudaStream stream(0);
  const at::Tensor rows = at::full({4, 3, t.size, t.size}, 0x5A,
                                   at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  for (const bool cut : {true, false}) {
    std::vector<std::vector<uint8_t>> files = photos(4, 300);
    files[2] = cut ? truncated_scan(files[2]) : corrupt_scan(files[2]);
    const char* what = cut ? "the scan cut short" : "the scrambled scan";
    std::vector<GpuJpeg> batch = batch_of(files, 3);
    batch[2].name = "/data/corrupt-scan.jpg";
    bool cpu_refused = false;
    try {
      (void)cpu_row(writer, batch[2]);
    } catch (const JpegError&) {
      cpu_refused = true;
    }
    rows.fill_(0x5A);
    const GpuDecodeResult result = decoder.decode(batch.data(), batch.size(),
                                                  rows.data_ptr<uint8_t>(), stream.native_handle());
    const bool to_cpu =
        std::find(result.to_cpu.begin(), result.to_cpu.end(), 2u) != result.to_cpu.end();
    const bool failed =
        std::any_of(result.failed.begin(), result.failed.end(),
                    [](const GpuDecodeResult::Failure& f) { return f.position == 2; });
    std::printf("%s: GPU %s, CPU %s; %zu of 4 to the CPU\n", what,
                to_cpu   ? "sent it to the CPU"
                : failed ? "failed it"
                         : "DECODED it",
                cpu_refused ? "refuses it" : "accepts it", result.to_cpu.size());
    if (cut) {
      EXPECT_TRUE(cpu_refused) << what << ": the CPU path must refuse it";
      EXPECT_TRUE(to_cpu || failed) << what << ": it became a row on the GPU";
    }
    stream.synchronize();
    if (to_cpu || failed) {
      EXPECT_TRUE(rows[2].cpu().eq(0x5A).all().item<bool>()) << what << ": its row was written";
    }
    if (result.to_cpu.size() == batch.size()) {
      // nvJPEG refused the whole call (BAD_JPEG): nothing of it may still run on the stream.
      EXPECT_EQ(cudaStreamQuery(stream.native_handle()), cudaSuccess);
    }
    // The next call (nvjpegDecodeBatchedInitialize, a region buffer that may grow) is healthy.
    files[2] = photos(1, 301)[0];
    batch = batch_of(files, 3);
    const GpuDecodeResult next = decoder.decode(batch.data(), batch.size(),
                                                rows.data_ptr<uint8_t>(), stream.native_handle());
    EXPECT_TRUE(next.to_cpu.empty() && next.failed.empty()) << "after " << what;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

// An error left pending on the thread by earlier, unrelated work is not the crop kernel's: its
// launch succeeds, the row is written, and the earlier error is still there for its owner.
TEST_F(GpuDecode, TheCropKernelReportsItsOwnLaunchErrorNeverAnEarlierOne) {
  const int width = 64, height = 48, side = 32;
  const gpudecode::CropPlan plan =
      gpudecode::plan_crop(width, height, 0, 0, width, height, false, side, 1u << 8, false);
  std::vector<uint8_t> region(static_cast<size_t>(width) * height * 3, 200);
  DeviceBuffer roi(region.size(), 0), row(static_cast<size_t>(side) * side * 3, 0);
  DeviceBuffer jobs(sizeof(gpudecode::CropJob), 0);
  const gpudecode::CropJob job{plan, static_cast<const uint8_t*>(roi.data()),
                               static_cast<size_t>(width) * 3, static_cast<uint8_t*>(row.data())};
  ASSERT_EQ(cudaMemcpy(roi.data(), region.data(), region.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(jobs.data(), &job, sizeof(job), cudaMemcpyHostToDevice), cudaSuccess);
  void* p = nullptr;
  ASSERT_NE(cudaMalloc(&p, size_t{1} << 60), cudaSuccess);  // leaves cudaErrorMemoryAllocation
  CudaStream stream(0);
  EXPECT_EQ(gpudecode::launch_crop_rows(static_cast<const gpudecode::CropJob*>(jobs.data()), 1,
                                        side, stream.native_handle()),
            cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);  // still the earlier work's
  stream.synchronize();
  std::vector<uint8_t> out(row.size());
  ASSERT_EQ(cudaMemcpy(out.data(), row.data(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  // The row the kernel's own arithmetic gives (crop_pixel on the host): libyuv's bilinear, whose
  // 7-bit horizontal weights make a constant 200 a little darker, not 200 everywhere.
  std::vector<uint8_t> want(out.size());
  for (int oy = 0; oy < side; ++oy) {
    for (int ox = 0; ox < side; ++ox) {
      uint8_t rgb[3];
      gpudecode::crop_pixel(region.data(), static_cast<size_t>(width) * 3, plan, ox, oy, rgb);
      for (int c = 0; c < 3; ++c) want[gpudecode::output_offset(plan, ox, oy, c)] = rgb[c];
    }
  }
  EXPECT_EQ(out, want);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b >= 196 && b <= 200; }));
}

TEST_F(GpuDecode, BuffersAreAllocatedUpFrontAndGrowOnlyPastTheExpectedSize) {
  GpuDecodeOptions o;
  o.transform = ImageTransform::eval(64, 72);  // the central crop: most of each image
  o.max_batch = 8;
  o.expected_width = 512;
  o.expected_height = 512;
  GpuCropDecoder decoder(o);
  const std::vector<std::vector<uint8_t>> files = photos(8, 60);  // 500 x 375 and 375 x 500
  GpuDecodeResult result;
  for (int round = 0; round < 3; ++round) {
    (void)decode_rows(decoder, batch_of(files, static_cast<uint64_t>(round)), 64, result);
    EXPECT_TRUE(result.to_cpu.empty() && result.failed.empty());
  }
  EXPECT_EQ(decoder.buffer_growths(), 0u) << "regions within the expected size grew the buffer";
  std::vector<std::vector<uint8_t>> large(8, make_photo_jpeg(1600, 1200, 5, 90));
  (void)decode_rows(decoder, batch_of(large, 0), 64, result);
  EXPECT_TRUE(result.to_cpu.empty() && result.failed.empty());
  EXPECT_EQ(decoder.buffer_growths(), 1u);
  (void)decode_rows(decoder, batch_of(large, 1), 64, result);
  EXPECT_EQ(decoder.buffer_growths(), 1u) << "the grown buffer did not stay";
}

}  // namespace
}  // namespace conveyor
