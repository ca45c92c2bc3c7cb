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

namespace {

void run_decoder(FuzzedDataProvider& cfg, const uint8_t* png, size_t size) {
  DecodeOptions o;
  o.channels = cfg.ConsumeBool() ? 4 : 3;
  const uint64_t max_pixels = pick_limit(cfg);
  static std::map<std::tuple<int, uint64_t>, std::unique_ptr<detail::ImageDecoder>> cache;
  auto& decoder = cache[{o.channels, max_pixels}];
  if (!decoder) {
    decoder = detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{max_pixels}, o);
  }
  const uint16_t bx = cfg.ConsumeIntegral<uint16_t>(), by = cfg.ConsumeIntegral<uint16_t>();
  const uint16_t bw = cfg.ConsumeIntegral<uint16_t>(), bh = cfg.ConsumeIntegral<uint16_t>();
  const detail::ImageInfo info = decoder->begin(png, size);
  check(info.width >= 1 && info.height >= 1, "a non-empty header");
  check(static_cast<uint64_t>(info.width) * info.height <= max_pixels, "the pixel limit");
  const int x = static_cast<int>(static_cast<uint64_t>(bx) * info.width / 65536);
  const int y = static_cast<int>(static_cast<uint64_t>(by) * info.height / 65536);
  const int w = 1 + static_cast<int>(static_cast<uint64_t>(bw) * (info.width - x) / 65536);
  const int h = 1 + static_cast<int>(static_cast<uint64_t>(bh) * (info.height - y) / 65536);
  const DecodedImage image = decoder->finish_region(x, y, w, h, w, h);
  check(image.width == w && image.height == h, "the region asked for");
  touch(image, o.channels);
}

void run_writer(FuzzedDataProvider& cfg, const uint8_t* png, size_t size) {
  ImageTransform t;
  t.mode = static_cast<ImageTransform::Mode>(cfg.ConsumeIntegralInRange<int>(0, 2));
  t.size = cfg.ConsumeIntegralInRange<int>(1, 64);
  t.resize = t.size + cfg.ConsumeIntegralInRange<int>(0, 16);
  t.layout = cfg.ConsumeBool() ? conveyor::ImageLayout::kHWC : conveyor::ImageLayout::kCHW;
  t.flip_probability = 0.5;
  t.limits.max_pixels = pick_limit(cfg);
  static std::map<std::tuple<int, int, int, int, uint64_t>, std::unique_ptr<ImageWriter>> cache;
  auto& writer = cache[{static_cast<int>(t.mode), t.size, t.resize, static_cast<int>(t.layout),
                        t.limits.max_pixels}];
  if (!writer) writer = std::make_unique<ImageWriter>(t);
  conveyor::SampleContext ctx;
  ctx.seed = cfg.ConsumeIntegral<uint32_t>();
  ctx.index = cfg.ConsumeIntegral<uint16_t>();
  std::vector<std::byte> out(static_cast<size_t>(t.size) * t.size * 3);  // exact: ASan guards it
  writer->write(png, size, ctx, out.data());
}

}  // namespace

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
    run_writer(cfg, png, size);
  } else {
    run_decoder(cfg, png, size);
  }
}

}  // namespace conveyor::fuzz
