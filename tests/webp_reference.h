// tests/webp_reference.h: WebP files of every kind that libwebp's simple encoder writes (lossy
// and lossless, RGB and RGBA, photo-like pixels), and the plain reference a WebP decode is checked
// against (webp_test, conveyor-decode-check): libwebp's full decode (WebPDecodeRGBA, no cropping),
// whose RGB bytes then go through png_reference.h's expected_row (choose_crop's box, libyuv's
// bilinear resize, the mirror, the layout) as ImageWriter applies them.
#pragma once

#include <webp/decode.h>
#include <webp/encode.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "png_reference.h"

namespace conveyor::testing {

struct WebpFile {
  std::string name;  // "lossy_rgba-17x13 (libwebp)", "lossless_rgb-1x1.webp (Pillow)"
  std::vector<uint8_t> bytes;
};

// libwebp's full decode as RGBX (alpha in X, which expected_row ignores).
inline Reference webp_reference(const WebpFile& f) {
  Reference ref;
  uint8_t* rgba = WebPDecodeRGBA(f.bytes.data(), f.bytes.size(), &ref.width, &ref.height);
  if (rgba == nullptr) throw std::runtime_error("libwebp refuses " + f.name);
  ref.rgbx.assign(rgba, rgba + static_cast<size_t>(ref.width) * ref.height * 4);
  WebPFree(rgba);
  return ref;
}

// Photo-like pixels: gradients, edges and noise; alpha (the 4th channel) varies across the image.
inline std::vector<uint8_t> photo_pixels(int width, int height, int channels, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<uint8_t> p(static_cast<size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        int v = c == 3 ? (x * 37 + y * 11) % 256 : (x * (3 + c) + y * (5 - c) + 40 * c) % 256;
        if ((x / 7 + y / 5) % 3 == 0 && c < 3) v = 255 - v;
        v += static_cast<int>(rng() % 25) - 12;
        p[(static_cast<size_t>(y) * width + x) * channels + c] =
            static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
    }
  }
  return p;
}

// Every kind (lossy at quality 80 and lossless, RGB and RGBA) at each of `sizes`.
template <size_t N>
std::vector<WebpFile> encoded_webps(const int (&sizes)[N][2], uint64_t seed) {
  std::vector<WebpFile> files;
  for (int channels : {3, 4}) {
    for (bool lossless : {false, true}) {
      for (const auto& wh : sizes) {
        const int w = wh[0], h = wh[1];
        const std::vector<uint8_t> pixels = photo_pixels(w, h, channels, seed++);
        uint8_t* out = nullptr;
        const int stride = w * channels;
        const size_t size =
            channels == 3 ? (lossless ? WebPEncodeLosslessRGB(pixels.data(), w, h, stride, &out)
                                      : WebPEncodeRGB(pixels.data(), w, h, stride, 80, &out))
                          : (lossless ? WebPEncodeLosslessRGBA(pixels.data(), w, h, stride, &out)
                                      : WebPEncodeRGBA(pixels.data(), w, h, stride, 80, &out));
        if (size == 0) throw std::runtime_error("libwebp's encoder failed");
        WebpFile f;
        f.name = std::string(lossless ? "lossless" : "lossy") +
                 (channels == 4 ? "_rgba-" : "_rgb-") + std::to_string(w) + "x" +
                 std::to_string(h) + " (libwebp)";
        f.bytes.assign(out, out + size);
        WebPFree(out);
        files.push_back(std::move(f));
      }
    }
  }
  return files;
}

}  // namespace conveyor::testing
