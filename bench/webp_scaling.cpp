// bench/webp_scaling.cpp (issue 32): libwebp's own scaling (WebPDecoderConfig's use_scaling, with
// use_cropping) against what Conveyor's WebP row does (libwebp's crop, then libyuv's bilinear
// resize, ImageWriter's), on RandomResizedCrop-like boxes of the given WebP files to 224 x 224:
// the pixels' difference (max and mean absolute, per byte) and each path's time. Not built by
// CMake (a measurement behind a choice, BENCHMARKS.md "WebP"):
//   g++ -O2 -std=c++20 bench/webp_scaling.cpp -o /tmp/webp_scaling -lwebp -lyuv
//   /tmp/webp_scaling FILE.webp...
#include <webp/decode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <libyuv.h>

namespace {

constexpr int kSide = 224;

std::vector<uint8_t> read(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// RGBA of the crop (x, y, w, h), scaled by libwebp to kSide x kSide when `scale`.
bool decode(const std::vector<uint8_t>& file, int x, int y, int w, int h, bool scale,
            std::vector<uint8_t>& out) {
  WebPDecoderConfig config;
  WebPInitDecoderConfig(&config);
  config.options.use_cropping = 1;
  config.options.crop_left = x;
  config.options.crop_top = y;
  config.options.crop_width = w;
  config.options.crop_height = h;
  const int ow = scale ? kSide : w, oh = scale ? kSide : h;
  config.options.use_scaling = scale ? 1 : 0;
  config.options.scaled_width = ow;
  config.options.scaled_height = oh;
  out.resize(static_cast<size_t>(ow) * oh * 4);
  config.output.colorspace = MODE_RGBA;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = out.data();
  config.output.u.RGBA.stride = ow * 4;
  config.output.u.RGBA.size = out.size();
  return WebPDecode(file.data(), file.size(), &config) == VP8_STATUS_OK;
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937 rng(1);
  double crop_resize_s = 0, scaled_s = 0, sum = 0, squares = 0;
  size_t bytes = 0, boxes = 0;
  int max_diff = 0;
  std::vector<uint8_t> cropped, resized(kSide * kSide * 4), scaled;
  for (int f = 1; f < argc; ++f) {
    const std::vector<uint8_t> file = read(argv[f]);
    int width = 0, height = 0;
    if (!WebPGetInfo(file.data(), file.size(), &width, &height)) return 1;
    for (int k = 0; k < 20; ++k) {
      // RandomResizedCrop's draw: area 8-100 %, aspect 3/4-4/3, at an even origin (libwebp's).
      std::uniform_real_distribution<double> area(0.08, 1.0),
          ratio(std::log(0.75), std::log(4.0 / 3));
      const double target = area(rng) * width * height, aspect = std::exp(ratio(rng));
      const int w = std::min(width, static_cast<int>(std::lround(std::sqrt(target * aspect))));
      const int h = std::min(height, static_cast<int>(std::lround(std::sqrt(target / aspect))));
      const int x = static_cast<int>(rng() % (width - w + 1)) & ~1;
      const int y = static_cast<int>(rng() % (height - h + 1)) & ~1;
      const auto t0 = std::chrono::steady_clock::now();
      if (!decode(file, x, y, w, h, false, cropped)) return 1;
      libyuv::ARGBScale(cropped.data(), w * 4, w, h, resized.data(), kSide * 4, kSide, kSide,
                        libyuv::kFilterBilinear);
      const auto t1 = std::chrono::steady_clock::now();
      if (!decode(file, x, y, w, h, true, scaled)) return 1;
      const auto t2 = std::chrono::steady_clock::now();
      crop_resize_s += std::chrono::duration<double>(t1 - t0).count();
      scaled_s += std::chrono::duration<double>(t2 - t1).count();
      for (size_t i = 0; i < resized.size(); ++i) {
        if (i % 4 == 3) continue;  // alpha
        const int d = std::abs(resized[i] - scaled[i]);
        max_diff = std::max(max_diff, d);
        sum += d;
        squares += static_cast<double>(d) * d;
        ++bytes;
      }
      ++boxes;
    }
  }
  std::printf(
      "%zu boxes: crop + libyuv bilinear %.3f ms, libwebp use_scaling %.3f ms per box "
      "(%.2fx); difference max %d, mean %.2f per byte, PSNR %.1f dB\n",
      boxes, 1e3 * crop_resize_s / boxes, 1e3 * scaled_s / boxes, crop_resize_s / scaled_s,
      max_diff, sum / bytes, 10 * std::log10(255.0 * 255.0 / (squares / bytes)));
  return 0;
}
