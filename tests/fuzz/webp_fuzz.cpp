// conveyor-webp-fuzz: libFuzzer over the WebP codec (issue 32): the codec table's WebP decoder
// (datasets/codec/webp_decode.cpp, libwebp: its cropping from even origins with a margin) and
// ImageWriter on WebP bytes. The driver is image_fuzz.h's, shared with the JPEG and PNG targets.
//
// An input is a WebP followed by kConfigBytes bytes that choose what to do with it: the decoder's
// begin + finish_region on a box (RGB or RGBX, a small DecodeLimits::max_pixels sometimes), or
// ImageWriter::write with a transform. Decoders and writers are kept across inputs, as a worker
// keeps them.
//
// `conveyor-webp-fuzz --write-seeds DIR` writes the seed corpus (libwebp's encoder: lossy and
// lossless, RGB and RGBA, at small odd sizes; and a header declaring a huge image), each with a
// config tail, and exits. tests/fuzz/conveyor-webp-fuzz.dict holds WebP's chunk names.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <webp/encode.h>

#include "codec/image_codec.h"
#include "conveyor/datasets.h"
#include "image_fuzz.h"

namespace conveyor::fuzz {

const char* const kTarget = "conveyor-webp-fuzz";
const size_t kConfigBytes = 16;
const char* const kSeedSuffix = ".webp";

std::vector<std::vector<uint8_t>> seed_files() {
  std::vector<std::vector<uint8_t>> files;
  const int sizes[][2] = {{1, 1}, {7, 3}, {13, 17}, {40, 9}};
  uint64_t state = 99;
  for (int channels : {3, 4}) {
    for (bool lossless : {false, true}) {
      for (const auto& wh : sizes) {
        const int w = wh[0], h = wh[1];
        std::vector<uint8_t> pixels(static_cast<size_t>(w) * h * channels);
        for (size_t i = 0; i < pixels.size(); ++i) {
          state = splitmix64(state);
          pixels[i] = static_cast<uint8_t>((i * 5 + (i / channels / w) * 9) ^ (state & 15));
        }
        uint8_t* out = nullptr;
        const int stride = w * channels;
        const size_t size =
            channels == 3 ? (lossless ? WebPEncodeLosslessRGB(pixels.data(), w, h, stride, &out)
                                      : WebPEncodeRGB(pixels.data(), w, h, stride, 75, &out))
                          : (lossless ? WebPEncodeLosslessRGBA(pixels.data(), w, h, stride, &out)
                                      : WebPEncodeRGBA(pixels.data(), w, h, stride, 75, &out));
        check(size > 0, "libwebp's encoder writes the seed");
        files.emplace_back(out, out + size);
        WebPFree(out);
      }
    }
  }
  // A lossless header declaring 16383 x 16383 (over the default max_pixels), and nothing after.
  files.push_back({'R', 'I', 'F', 'F', 18, 0, 0, 0,    'W',  'E',  'B',  'P',  'V',
                   'P', '8', 'L', 5,   0,  0, 0, 0x2f, 0xfe, 0xbf, 0xff, 0x0f, 0});
  return files;
}

void run_one(FuzzedDataProvider& cfg, const uint8_t* webp, size_t size) {
  if (cfg.ConsumeBool()) {
    run_image_writer(cfg, webp, size);
  } else {
    run_region_decoder(cfg, detail::ImageFormat::kWebp, webp, size);
  }
}

}  // namespace conveyor::fuzz
