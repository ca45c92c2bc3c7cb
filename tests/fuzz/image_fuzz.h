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
#include <stdexcept>
#include <string>
#include <vector>

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
