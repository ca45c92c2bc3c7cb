// tests/fuzz/image_fuzz.h: the driver the image codecs' libFuzzer targets share (jpeg_fuzz.cpp,
// png_fuzz.cpp, webp_fuzz.cpp), written once: an input is an image file followed by a target's
// kConfigBytes bytes, which choose what to do with it (FuzzedDataProvider); `TARGET --write-seeds
// DIR` writes the target's seed files, each with a config tail, and exits; std::runtime_error
// (ImageDecodeError, JpegError) is an expected outcome, and a crash, a sanitizer report, a leak, a
// timeout or an out-of-memory is a finding.
//
// Include it in exactly one source per target (it defines libFuzzer's entry points), after
// defining, in namespace conveyor::fuzz:
//   const char* const kTarget;      // "conveyor-webp-fuzz", in messages
//   const size_t kConfigBytes;      // the config tail's length
//   const char* const kSeedSuffix;  // the seed files' suffix, ".webp"
//   std::vector<std::vector<uint8_t>> seed_files();  // the seeds, without config tails
//   void run_one(FuzzedDataProvider& cfg, const uint8_t* file, size_t size);
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "codec/image_codec.h"
#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "conveyor/random.h"

namespace conveyor::fuzz {

extern const char* const kTarget;
extern const size_t kConfigBytes;
extern const char* const kSeedSuffix;
std::vector<std::vector<uint8_t>> seed_files();
void run_one(FuzzedDataProvider& cfg, const uint8_t* file, size_t size);

// A guarantee the code under test broke: a finding (abort, so that libFuzzer keeps the input).
inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: broken guarantee: %s\n", kTarget, what);
    std::abort();
  }
}

// Reads every byte of a decoded image (so that ASan sees an out-of-bounds result) and checks what
// DecodedImage promises: pixels, a non-empty region, the channels asked for, a stride that holds
// a row, a scale in 1..8.
inline void touch(const DecodedImage& image, int channels) {
  check(image.pixels != nullptr, "pixels != nullptr");
  check(image.width >= 1 && image.height >= 1, "a non-empty region");
  check(image.channels == channels, "channels as asked");
  check(image.stride >= static_cast<size_t>(image.width) * image.channels, "stride >= row");
  check(image.scale >= 1 && image.scale <= 8, "scale in 1..8");
  unsigned sum = 0;
  for (int r = 0; r < image.height; ++r) {
    const uint8_t* row = image.pixels + static_cast<size_t>(r) * image.stride;
    for (size_t i = 0; i < static_cast<size_t>(image.width) * image.channels; ++i) sum += row[i];
  }
  volatile unsigned sink = sum;
  (void)sink;
}

// DecodeLimits::max_pixels: the default three times in four, else a small one.
inline uint64_t pick_limit(FuzzedDataProvider& cfg) {
  const uint8_t v = cfg.ConsumeIntegral<uint8_t>();
  if (v < 192) return DecodeLimits{}.max_pixels;
  static constexpr uint64_t kSmall[] = {1, 64, 4096, 1u << 20};
  return kSmall[v % 4];
}

// Writes seed_files() to DIR/seed-N<kSeedSuffix>, each with a config tail drawn from `state`.
inline int write_seeds(const char* dir, uint64_t state) {
  int n = 0;
  for (std::vector<uint8_t>& file : seed_files()) {
    for (size_t i = 0; i < kConfigBytes; ++i) {
      state = splitmix64(state);
      file.push_back(static_cast<uint8_t>(state));
    }
    const std::string path = std::string(dir) + "/seed-" + std::to_string(n++) + kSeedSuffix;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(file.data(), 1, file.size(), f) != file.size() ||
        std::fclose(f) != 0) {
      std::perror(path.c_str());
      return 1;
    }
  }
  std::printf("%s: wrote %d seeds to %s\n", kTarget, n, dir);
  return 0;
}

// One file of `format` decoded by its codec-table decoder: a region drawn from `cfg` (the decoder
// reused per option set, as a worker reuses its own).
inline void run_region_decoder(FuzzedDataProvider& cfg, detail::ImageFormat format,
                               const uint8_t* file, size_t size) {
  DecodeOptions o;
  o.channels = cfg.ConsumeBool() ? 4 : 3;
  const uint64_t max_pixels = pick_limit(cfg);
  static std::map<std::tuple<int, uint64_t>, std::unique_ptr<detail::ImageDecoder>> cache;
  auto& decoder = cache[{o.channels, max_pixels}];
  if (!decoder) {
    decoder = detail::make_image_decoder(format, DecodeLimits{max_pixels}, o);
  }
  const uint16_t bx = cfg.ConsumeIntegral<uint16_t>(), by = cfg.ConsumeIntegral<uint16_t>();
  const uint16_t bw = cfg.ConsumeIntegral<uint16_t>(), bh = cfg.ConsumeIntegral<uint16_t>();
  const detail::ImageInfo info = decoder->begin(file, size);
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

// One file through ImageWriter with a transform drawn from `cfg` (writers reused per transform, a
// few hundred at a time).
inline void run_image_writer(FuzzedDataProvider& cfg, const uint8_t* file, size_t size) {
  ImageTransform t;
  t.mode = static_cast<ImageTransform::Mode>(cfg.ConsumeIntegralInRange<int>(0, 2));
  t.size = cfg.ConsumeIntegralInRange<int>(1, 64);
  t.resize = t.size + cfg.ConsumeIntegralInRange<int>(0, 16);
  t.layout = cfg.ConsumeBool() ? conveyor::ImageLayout::kHWC : conveyor::ImageLayout::kCHW;
  t.flip_probability = 0.5;
  t.limits.max_pixels = pick_limit(cfg);
  // At most 256 writers at a time: each holds a decoder of every format, and the 30,000-odd
  // transforms a long run draws did not fit in -rss_limit_mb (a 600 s run of conveyor-png-fuzz
  // held 21,846 writers, 1.5 GB, and ended in an out-of-memory).
  static std::map<std::tuple<int, int, int, int, uint64_t>, std::unique_ptr<ImageWriter>> cache;
  const std::tuple<int, int, int, int, uint64_t> key{
      static_cast<int>(t.mode), t.size, t.resize, static_cast<int>(t.layout), t.limits.max_pixels};
  if (cache.size() >= 256 && cache.find(key) == cache.end()) cache.clear();
  auto& writer = cache[key];
  if (!writer) writer = std::make_unique<ImageWriter>(t);
  conveyor::SampleContext ctx;
  ctx.seed = cfg.ConsumeIntegral<uint32_t>();
  ctx.index = cfg.ConsumeIntegral<uint16_t>();
  std::vector<std::byte> out(static_cast<size_t>(t.size) * t.size * 3);  // exact: ASan guards it
  writer->write(file, size, ctx, out.data());
}

}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (*argc >= 3 && std::strcmp((*argv)[1], "--write-seeds") == 0) {
    std::exit(conveyor::fuzz::write_seeds((*argv)[2], 12345));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using conveyor::fuzz::kConfigBytes;
  if (size < kConfigBytes) return 0;
  const size_t file_size = size - kConfigBytes;
  FuzzedDataProvider cfg(data + file_size, kConfigBytes);
  // The file in a buffer of its own size, so that ASan sees a read past its end.
  const std::vector<uint8_t> file(data, data + file_size);
  try {
    conveyor::fuzz::run_one(cfg, file.data(), file.size());
  } catch (const std::runtime_error&) {  // ImageDecodeError, JpegError: refused input
  }
  return 0;
}
