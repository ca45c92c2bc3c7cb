// gpudecode_test: the parts of GPU decode that run without a GPU (issue 24).
// - The crop kernel's math (crop_plan.h, the code the kernel runs) against the CPU path: against
//   libyuv's ARGBScale and ARGBMirror byte for byte on random images of every size relation, and
//   against ImageWriter on JPEGs decoded at full scale (byte for byte where ImageWriter decodes at
//   8/8; within the stated tolerance where it decodes at a smaller DCT scale).
// - The routing: which files of every kind the hybrid sends to the CPU, from their headers.
// - The status: why GPU decode is unavailable here, and the library's entry points.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <libyuv.h>

#include "conveyor/cuda.h"
#include "conveyor/datasets.h"
#include "conveyor/gpu_decode.h"
#include "conveyor/jpeg.h"
#include "crop_plan.h"
#include "nvjpeg_api.h"
#include "synthetic.h"  // make_photo_jpeg, make_grid_jpeg

namespace conveyor {
namespace {

using gpudecode::CropPlan;
using gpudecode::plan_crop;
using gpudecode::ResizePath;

// The output of crop_pixel over a plan, laid out as the plan says.
std::vector<uint8_t> run_plan(const uint8_t* roi, size_t pitch, const CropPlan& p) {
  std::vector<uint8_t> out(static_cast<size_t>(p.side) * p.side * 3);
  for (int oy = 0; oy < p.side; ++oy) {
    for (int ox = 0; ox < p.side; ++ox) {
      uint8_t rgb[3];
      gpudecode::crop_pixel(roi, pitch, p, ox, oy, rgb);
      for (int c = 0; c < 3; ++c) out[gpudecode::output_offset(p, ox, oy, c)] = rgb[c];
    }
  }
  return out;
}

struct Difference {
  int max_abs = 0;
  double psnr = INFINITY;
  size_t differing = 0;
};
Difference compare(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  Difference d;
  double squared = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int e = std::abs(int{a[i]} - int{b[i]});
    d.max_abs = std::max(d.max_abs, e);
    d.differing += e != 0;
    squared += double(e) * e;
  }
  if (squared > 0) d.psnr = 10 * std::log10(255.0 * 255.0 / (squared / double(a.size())));
  return d;
}

const char* path_name(ResizePath p) {
  switch (p) {
    case ResizePath::kCopy:
      return "copy";
    case ResizePath::kBox:
      return "box";
    case ResizePath::kPoint:
      return "point";
    case ResizePath::kVertical:
      return "vertical";
    case ResizePath::kHorizontal:
      return "horizontal";
    case ResizePath::kBilinearDown:
      return "bilinear-down";
    case ResizePath::kBilinearUp:
      return "bilinear-up";
  }
  return "?";
}

// libyuv's resize (the CPU path's ARGBScale, kFilterBilinear, on RGBX) and mirror of a w x h
// region, split into CHW planes as ImageWriter splits them.
std::vector<uint8_t> libyuv_row(const std::vector<uint8_t>& rgbx, int w, int h, int side,
                                bool flip) {
  std::vector<uint8_t> scaled(static_cast<size_t>(side) * side * 4);
  std::vector<uint8_t> mirrored(scaled.size());
  const uint8_t* pixels = rgbx.data();
  int stride = w * 4;
  if (w != side || h != side) {
    libyuv::ARGBScale(pixels, stride, w, h, scaled.data(), side * 4, side, side,
                      libyuv::kFilterBilinear);
    pixels = scaled.data();
    stride = side * 4;
  }
  if (flip) {
    libyuv::ARGBMirror(pixels, stride, mirrored.data(), side * 4, side, side);
    pixels = mirrored.data();
    stride = side * 4;
  }
  const size_t plane = static_cast<size_t>(side) * side;
  std::vector<uint8_t> out(plane * 3);
  for (int y = 0; y < side; ++y) {
    for (int x = 0; x < side; ++x) {
      for (int c = 0; c < 3; ++c) {
        out[c * plane + static_cast<size_t>(y) * side + x] =
            pixels[static_cast<size_t>(y) * stride + static_cast<size_t>(x) * 4 + c];
      }
    }
  }
  return out;
}

// Random regions of every size relation to the output (smaller, larger, equal on one axis, whole
// multiples), each resized by libyuv and by the plan: the same bytes.
TEST(CropPlan, ResizeAndMirrorMatchLibyuvByteForByte) {
  std::mt19937 rng(24);
  struct Case {
    int w, h, side;
  };
  std::vector<Case> cases_to_run;
  for (int side : {1, 2, 3, 5, 8, 16, 31, 64, 224}) {
    for (int w : {side, 2 * side, 3 * side, side / 2 + 1, side + 1, 4 * side}) {
      for (int h : {side, 2 * side, 3 * side, side / 2 + 1, std::max(side - 1, 1)}) {
        cases_to_run.push_back({w, h, side});
      }
    }
  }
  for (int k = 0; k < 300; ++k) {  // and random sizes
    const int side = 1 + static_cast<int>(rng() % 64u);
    cases_to_run.push_back({1 + static_cast<int>(rng() % static_cast<unsigned>(4 * side + 8)),
                            1 + static_cast<int>(rng() % static_cast<unsigned>(4 * side + 8)),
                            side});
  }
  size_t cases = 0;
  std::map<std::string, size_t> by_path;
  for (const Case& c : cases_to_run) {
    const int w = c.w, h = c.h, side = c.side;
    std::vector<uint8_t> rgbx(static_cast<size_t>(w) * h * 4), rgb(static_cast<size_t>(w) * h * 3);
    for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
      for (int c = 0; c < 4; ++c) rgbx[i * 4 + c] = static_cast<uint8_t>(rng());
      for (int c = 0; c < 3; ++c) rgb[i * 3 + c] = rgbx[i * 4 + c];
    }
    for (bool flip : {false, true}) {
      const CropPlan plan = plan_crop(w, h, 0, 0, w, h, flip, side, kFullDctScale, false);
      ASSERT_EQ(plan.factor, 1);
      ASSERT_EQ(plan.scaled_w, w);
      ASSERT_EQ(plan.scaled_h, h);
      const std::vector<uint8_t> expected = libyuv_row(rgbx, w, h, side, flip);
      const std::vector<uint8_t> actual = run_plan(rgb.data(), static_cast<size_t>(w) * 3, plan);
      const Difference d = compare(expected, actual);
      ASSERT_EQ(d.max_abs, 0) << w << "x" << h << " -> " << side << (flip ? " flipped" : "")
                              << ", path " << path_name(plan.path) << ": " << d.differing
                              << " bytes differ";
      ++cases;
      ++by_path[path_name(plan.path)];
    }
  }
  for (const char* p :
       {"copy", "box", "point", "vertical", "horizontal", "bilinear-down", "bilinear-up"}) {
    EXPECT_GT(by_path[p], 0u) << "no case took libyuv's " << p << " path";
  }
  EXPECT_GT(cases, 400u);
}

// The HWC layout holds the same pixels as CHW, interleaved.
TEST(CropPlan, HwcIsChwInterleaved) {
  std::mt19937 rng(5);
  const int w = 97, h = 61, side = 24;
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (uint8_t& v : rgb) v = static_cast<uint8_t>(rng());
  const CropPlan chw = plan_crop(w, h, 3, 5, 80, 50, true, side, kFullDctScale, false);
  const CropPlan hwc = plan_crop(w, h, 3, 5, 80, 50, true, side, kFullDctScale, true);
  const uint8_t* roi = rgb.data() + (static_cast<size_t>(chw.roi_y) * w + chw.roi_x) * 3;
  const std::vector<uint8_t> a = run_plan(roi, static_cast<size_t>(w) * 3, chw);
  const std::vector<uint8_t> b = run_plan(roi, static_cast<size_t>(w) * 3, hwc);
  const size_t plane = static_cast<size_t>(side) * side;
  for (size_t i = 0; i < plane; ++i) {
    for (size_t c = 0; c < 3; ++c) ASSERT_EQ(a[c * plane + i], b[i * 3 + c]) << i << " " << c;
  }
}

// What the GPU path computes from a full-scale decode of the file (libjpeg-turbo standing in for
// nvJPEG), for sample ctx: choose_crop's box, the plan, the region nvJPEG decodes
// (decoded_region: whole MCUs around the plan's ROI, written at its own pitch, as nvJPEG's ROI
// decode writes it), and the kernel's math from the ROI's place in that region (roi_offset, moved
// by `shift` bytes to show that a misplaced ROI is seen).
std::vector<uint8_t> gpu_math_row(const std::vector<uint8_t>& jpeg, const ImageTransform& t,
                                  const SampleContext& ctx, CropPlan* plan_out,
                                  std::ptrdiff_t shift = 0) {
  DecodeOptions o;
  o.channels = 3;
  o.fast_upsampling = true;  // as ImageWriter decodes
  o.dct_scales = kFullDctScale;
  JpegDecoder decoder(t.limits, o);
  const DecodedImage full = decoder.decode(jpeg.data(), jpeg.size());
  const CropBox box = choose_crop(t, full.width, full.height, ctx.seed, ctx.epoch, ctx.index);
  const CropPlan plan = plan_crop(full.width, full.height, box.x, box.y, box.width, box.height,
                                  box.flip, t.size, t.dct_scales, t.layout == ImageLayout::kHWC);
  if (plan_out) *plan_out = plan;
  const gpudecode::DecodedRegion region = gpudecode::decoded_region(plan, full.width, full.height);
  const size_t pitch = gpudecode::region_pitch(region);
  // The region as nvJPEG writes it, with a row of slack either side for a shifted read.
  std::vector<uint8_t> decoded((static_cast<size_t>(region.h) + 2) * pitch, 0);
  for (int y = 0; y < region.h; ++y) {
    std::copy_n(full.pixels + static_cast<size_t>(region.y + y) * full.stride +
                    static_cast<size_t>(region.x) * 3,
                pitch, decoded.data() + static_cast<size_t>(y + 1) * pitch);
  }
  const uint8_t* roi = decoded.data() + pitch + gpudecode::roi_offset(plan, region) + shift;
  return run_plan(roi, pitch, plan);
}

// ImageWriter (the CPU path) against the kernel's math on the same decoder's pixels: where
// ImageWriter decodes at 8/8, the same bytes; where it decodes at M/8 < 8/8, the box mean over
// the full-scale pixels stands in for libjpeg-turbo's scaled IDCT, within the tolerance the GPU
// path states (GpuCropDecoder::kMaxAbsDiff, kMinPsnr). The plan's DCT scale is always
// ImageWriter's.
TEST(CropPlan, MatchesImageWriterOnPhotos) {
  size_t full_scale = 0, scaled = 0;
  int worst_abs = 0;
  double worst_psnr = INFINITY;
  for (ImageTransform t :
       {ImageTransform::train(224), ImageTransform::eval(224, 256), ImageTransform::train(64)}) {
    for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
      t.layout = layout;
      ImageWriter writer(t);
      for (size_t index = 0; index < 24; ++index) {
        const int w = index % 3 == 0 ? 375 : 500, h = index % 3 == 0 ? 500 : 375;
        const std::vector<uint8_t> jpeg = make_photo_jpeg(w, h, 1000 + index, 90);
        const SampleContext ctx{0, index, 7, 3};
        std::vector<uint8_t> cpu(static_cast<size_t>(t.size) * t.size * 3);
        writer.write(jpeg.data(), jpeg.size(), ctx, reinterpret_cast<std::byte*>(cpu.data()));
        CropPlan plan;
        const std::vector<uint8_t> gpu = gpu_math_row(jpeg, t, ctx, &plan);
        ASSERT_EQ(plan.factor, 8 / writer.last_scale()) << "index " << index;
        const Difference d = compare(cpu, gpu);
        if (writer.last_scale() == 8) {
          ++full_scale;
          EXPECT_EQ(d.max_abs, 0) << "index " << index << " path " << path_name(plan.path) << ": "
                                  << d.differing << " bytes differ";
        } else {
          ++scaled;
          worst_abs = std::max(worst_abs, d.max_abs);
          worst_psnr = std::min(worst_psnr, d.psnr);
          EXPECT_LE(d.max_abs, GpuCropDecoder::kMaxAbsDiff) << "index " << index;
          EXPECT_GE(d.psnr, GpuCropDecoder::kMinPsnr) << "index " << index;
        }
      }
    }
  }
  EXPECT_GT(full_scale, 10u);
  EXPECT_GT(scaled, 10u);
  std::printf(
      "crop math vs ImageWriter: %zu rows at 8/8 byte-identical; %zu rows at M/8 < 8/8: "
      "max abs diff %d, worst PSNR %.1f dB\n",
      full_scale, scaled, worst_abs, worst_psnr);
}

// The ROI's place inside the region nvJPEG decodes (decoded_region, roi_offset), on the CPU and to
// the pixel: center crops of one-pixel grids whose ROI starts off the 16-pixel MCU grid, kept at
// 8/8 (a crop as large as the output: ImageWriter copies it), give ImageWriter's bytes exactly;
// the same read one pixel right, one down, or both, does not come near them.
TEST(CropPlan, TheRoiIsFoundInTheDecodedRegionToThePixel) {
  size_t unaligned = 0;
  for (const auto& [w, h] :
       std::vector<std::pair<int, int>>{{70, 70}, {83, 61}, {100, 77}, {64, 95}, {121, 49}}) {
    for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
      ImageTransform t = ImageTransform::eval(32, std::min(w, h));  // a 32 x 32 box, no resize
      t.layout = layout;
      const std::vector<uint8_t> jpeg = make_grid_jpeg(w, h);
      const SampleContext ctx{0, 3, 7, 1};
      ImageWriter writer(t);
      std::vector<uint8_t> cpu(static_cast<size_t>(t.size) * t.size * 3);
      writer.write(jpeg.data(), jpeg.size(), ctx, reinterpret_cast<std::byte*>(cpu.data()));
      ASSERT_EQ(writer.last_scale(), 8) << w << "x" << h;
      CropPlan plan;
      const std::vector<uint8_t> gpu = gpu_math_row(jpeg, t, ctx, &plan);
      const gpudecode::DecodedRegion region = gpudecode::decoded_region(plan, w, h);
      unaligned += plan.roi_x != region.x || plan.roi_y != region.y;
      const Difference exact = compare(cpu, gpu);
      EXPECT_EQ(exact.max_abs, 0) << w << "x" << h << ": " << exact.differing << " bytes differ";
      const auto pitch = static_cast<std::ptrdiff_t>(gpudecode::region_pitch(region));
      for (std::ptrdiff_t shift : {std::ptrdiff_t{3}, pitch, pitch + 3}) {
        const Difference shifted = compare(cpu, gpu_math_row(jpeg, t, ctx, nullptr, shift));
        EXPECT_GT(shifted.max_abs, 128) << w << "x" << h << ", shifted by " << shift << " bytes";
        EXPECT_GT(shifted.differing, cpu.size() / 4) << w << "x" << h << ", shifted by " << shift;
      }
    }
  }
  EXPECT_GE(unaligned, 8u);  // the offset inside the region is not 0 for most
}

// --- Routing: the file kinds the repository's tests generate, and where the hybrid sends them.

TEST(HardwareRoute, EveryFileKindGoesWhereTheHardwareBackendTakesIt) {
  std::vector<uint8_t> rgb(64 * 48 * 3);
  std::mt19937 rng(3);
  for (uint8_t& v : rgb) v = static_cast<uint8_t>(rng());
  struct Kind {
    const char* name;
    EncodeOptions options;
    bool hardware;
    const char* reason;
  };
  auto opts = [](EncodeOptions::Color color, int h, int v, bool progressive, bool arithmetic) {
    EncodeOptions o;
    o.color = color;
    o.h_samp = h;
    o.v_samp = v;
    o.progressive = progressive;
    o.arithmetic = arithmetic;
    return o;
  };
  using C = EncodeOptions::Color;
  EncodeOptions restarts = opts(C::kYCbCr, 2, 2, false, false);
  restarts.restart_interval = 2;
  EncodeOptions exif = opts(C::kYCbCr, 2, 2, false, false);
  exif.orientation = 6;
  EncodeOptions cmyk_plain = opts(C::kCmyk, 1, 1, false, false);
  cmyk_plain.adobe_marker = false;
  const std::vector<Kind> kinds = {
      {"baseline 4:2:0", opts(C::kYCbCr, 2, 2, false, false), true, ""},
      {"baseline 4:2:2", opts(C::kYCbCr, 2, 1, false, false), true, ""},
      {"baseline 4:4:4", opts(C::kYCbCr, 1, 1, false, false), true, ""},
      {"baseline 4:4:0", opts(C::kYCbCr, 1, 2, false, false), true, ""},
      {"grayscale", opts(C::kGray, 1, 1, false, false), true, ""},
      {"restart markers", restarts, true, ""},
      {"EXIF orientation", exif, true, ""},
      {"progressive", opts(C::kYCbCr, 2, 2, true, false), false, "progressive"},
      {"progressive grayscale", opts(C::kGray, 1, 1, true, false), false, "progressive"},
      {"arithmetic", opts(C::kYCbCr, 2, 2, false, true), false, "arithmetic-coded"},
      {"4:1:1", opts(C::kYCbCr, 4, 1, false, false), false, "4:1:1 sampling"},
      {"4:1:0", opts(C::kYCbCr, 4, 2, false, false), false, "4:1:0 sampling"},
      {"CMYK (Adobe)", opts(C::kCmyk, 1, 1, false, false), false, "CMYK"},
      {"CMYK (plain)", cmyk_plain, false, "CMYK"},
      {"YCCK", opts(C::kYcck, 2, 2, false, false), false, "YCCK"},
      {"RGB", opts(C::kRgb, 1, 1, false, false), false, "3 components stored as RGB"},
  };
  for (const Kind& k : kinds) {
    const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), 64, 48, k.options);
    const HardwareRoute route = hardware_route(jpeg.data(), jpeg.size());
    EXPECT_EQ(route.hardware, k.hardware) << k.name << ": " << route.reason;
    EXPECT_EQ(route.reason, k.reason) << k.name;
  }
  // The photo-like generator's files (the benchmarks' data) all go to the hardware.
  const std::vector<uint8_t> photo = make_photo_jpeg(500, 375, 1, 90);
  EXPECT_TRUE(hardware_route(photo.data(), photo.size()).hardware);
}

TEST(HardwareRoute, ANonJpegThrowsJpegError) {
  const std::vector<uint8_t> text = {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'};
  EXPECT_THROW(hardware_route(text.data(), text.size()), JpegError);
}

// --- Status and the library.

TEST(GpuDecodeStatus, AMissingLibraryIsNamedWithWhatWasTried) {
  GpuDecodeSetup setup;
  setup.library_paths = {"/nonexistent/lib/libnvjpeg.so.13"};
  const GpuDecodeStatus s = gpu_decode_status(setup);
  EXPECT_FALSE(s.available);
  EXPECT_TRUE(s.library.empty());
  EXPECT_NE(s.reason.find("libnvjpeg.so.13 not loaded"), std::string::npos) << s.reason;
  EXPECT_NE(s.reason.find("/nonexistent/lib/libnvjpeg.so.13"), std::string::npos) << s.reason;
  EXPECT_NE(s.reason.find("pip install nvidia-nvjpeg"), std::string::npos) << s.reason;
  GpuDecodeOptions o;
  o.setup = setup;
  try {
    GpuCropDecoder decoder(o);
    ADD_FAILURE() << "a decoder without nvJPEG";
  } catch (const GpuDecodeError& e) {
    EXPECT_EQ(std::string(e.what()), s.reason);
  }
}

TEST(GpuDecodeStatus, ALibraryWithoutNvjpegsEntryPointsIsRefused) {
  GpuDecodeSetup setup;
  setup.library_paths = {"libjpeg.so.62"};  // loads, but is not nvJPEG
  const GpuDecodeStatus s = gpu_decode_status(setup);
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.reason.find("lacks nvjpegCreateEx"), std::string::npos) << s.reason;
}

// The wheel's library has every entry point the decoder declares: the one found at configure
// time, or where that path is not on this machine (the GPU check's carried folder), the one the
// default search finds.
TEST(NvjpegLibrary, TheWheelsLibraryHasEveryEntryPoint) {
#if defined(CONVEYOR_TEST_NVJPEG_LIBRARY)
  std::vector<std::string> paths;
  if (std::filesystem::exists(CONVEYOR_TEST_NVJPEG_LIBRARY)) paths = {CONVEYOR_TEST_NVJPEG_LIBRARY};
  std::string why;
  const auto library = gpudecode::nv::NvjpegLibrary::load(paths, &why);
  ASSERT_TRUE(library.has_value()) << why;
  EXPECT_NE(library->path().find("libnvjpeg.so.13"), std::string::npos) << library->path();
  EXPECT_TRUE(library->create_ex && library->batched_decode_ex && library->batched_supported_ex &&
              library->params_set_roi && library->get_hardware_decoder_info);
#else
  GTEST_SKIP() << "the nvidia-nvjpeg wheel was not found when this build was configured";
#endif
}

// libnvjpeg is loaded once per process: probes and decoders share that one load, which stays
// loaded between them (it was loaded and unloaded again for every probe and every loader).
TEST(NvjpegLibrary, TheDefaultLibraryIsLoadedOncePerProcessAndStaysLoaded) {
  const GpuDecodeStatus first = gpu_decode_status();
  if (first.library.empty()) GTEST_SKIP() << first.reason;
  void* still = dlopen(first.library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(still, nullptr) << first.library << " was unloaded once the probe returned";
  if (still != nullptr) dlclose(still);
  std::string why;
  const auto a = gpudecode::nv::NvjpegLibrary::process_library(&why);
  const auto b = gpudecode::nv::NvjpegLibrary::process_library(&why);
  ASSERT_NE(a, nullptr) << why;
  EXPECT_EQ(a.get(), b.get()) << "loaded twice";
  EXPECT_EQ(a->path(), first.library);
  EXPECT_EQ(gpu_decode_status().library, first.library);
}

// This machine's answer, whatever it is, says why; without a CUDA device, that it has none.
TEST(GpuDecodeStatus, SaysWhyItIsUnavailableHere) {
  const GpuDecodeStatus s = gpu_decode_status();
  std::printf("gpu_decode_status: %s%s (library: %s)\n", s.available ? "available" : "",
              s.reason.c_str(), s.library.empty() ? "none" : s.library.c_str());
  if (s.available) {
    EXPECT_TRUE(s.reason.empty());
    EXPECT_GT(s.engines, 0u);
    return;
  }
  EXPECT_EQ(s.reason.rfind("GPU decode unavailable: ", 0), 0u) << s.reason;
  if (s.library.empty()) {
    EXPECT_NE(s.reason.find("libnvjpeg.so.13"), std::string::npos) << s.reason;
  } else if (!cuda_status().usable()) {
    EXPECT_NE(s.reason.find("no CUDA device"), std::string::npos) << s.reason;
    EXPECT_NE(s.reason.find(cuda_status().reason), std::string::npos) << s.reason;
  } else {
    EXPECT_NE(s.reason.find("no hardware JPEG engine"), std::string::npos) << s.reason;
  }
}

}  // namespace
}  // namespace conveyor
