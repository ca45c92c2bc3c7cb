// conveyor-png-fuzz: libFuzzer over the PNG codec (issue 32): the codec table's PNG decoder
// (datasets/codec/png_decode.cpp, libspng) and ImageWriter on PNG bytes.
//
// An input is a PNG followed by kConfigBytes bytes that choose what to do with it: the decoder's
// begin + finish_region on a box (RGB or RGBX, a small DecodeLimits::max_pixels sometimes), or
// ImageWriter::write with a transform, which detects the format by content, reads the header,
// applies the limits, decodes the crop's rows and resizes them into a slot. Decoders and writers
// are kept across inputs, as a worker keeps them. ImageDecodeError and std::runtime_error are
// expected outcomes; a crash, a sanitizer report, a leak, a timeout or an out-of-memory is a
// finding.
//
// `conveyor-png-fuzz --write-seeds DIR` writes the seed corpus (every colour type and bit depth,
// interlaced or not, with tRNS, at small odd sizes: tests/png_writer.h; and a header declaring a
// huge image), each with a config tail, and exits. tests/fuzz/conveyor-png-fuzz.dict holds PNG's
// chunk names.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "../png_writer.h"
#include "codec/image_codec.h"
#include "conveyor/datasets.h"
#include "image_fuzz.h"

namespace conveyor::fuzz {

const char* const kTarget = "conveyor-png-fuzz";
const size_t kConfigBytes = 16;
const char* const kSeedSuffix = ".png";

std::vector<std::vector<uint8_t>> seed_files() {
  using conveyor::testing::PngSpec;
  std::vector<std::vector<uint8_t>> files;
  uint64_t seed = 1;
  const int sizes[][2] = {{1, 1}, {7, 3}, {13, 17}};
  for (PngSpec kind : conveyor::testing::every_png_kind()) {
    for (const auto& wh : sizes) {
      kind.width = wh[0];
      kind.height = wh[1];
      kind.interlaced = seed % 2 == 0;
      kind.transparency = seed % 3 == 0 && kind.color_type != 4 && kind.color_type != 6;
      files.push_back(conveyor::testing::make_png(kind, seed++).bytes);
    }
  }
  files.push_back(conveyor::testing::png_declaring(100000, 100000));
  return files;
}

void run_one(FuzzedDataProvider& cfg, const uint8_t* png, size_t size) {
  if (cfg.ConsumeBool()) {
    run_image_writer(cfg, png, size);
  } else {
    run_region_decoder(cfg, detail::ImageFormat::kPng, png, size);
  }
}

}  // namespace conveyor::fuzz
