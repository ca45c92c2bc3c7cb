// conveyor-entropy-index-fuzz: libFuzzer over the reader of JpegEntropyIndex's file (issue 35;
// EntropyIndexStore::load in datasets/codec/jpeg_entropy_index.cpp).
//
// An input is an index file's bytes. Each is loaded twice into a fresh index: as it is, and
// "resealed" (every entry's checksum recomputed where the framing allows), so that entries whose
// points were changed but whose checksums hold reach the own decoder too, as a forged file's
// would. After each load, what the load reports must agree with what is held (entries loaded ==
// files, the budget kept, nothing loaded from a file refused whole), and the entries held must
// save and load again unchanged. Then a fixed set of small JPEGs (4:2:0, 4:4:4 and gray, one with
// restart markers) is decoded at several crops by the own decoder with that index. As it is, the
// input must give the pixels (or the error) of a decode without an index: a changed entry fails
// its checksum. Resealed, it must only decode safely: a state at a wrong position that still
// parses cannot be told from a right one, so a forged entry can change the pixels of the file it
// names (JpegEntropyIndex's contract), but never read or write out of bounds. A difference where
// one is checked, a crash, a sanitizer report, a leak, a timeout or an out-of-memory is a finding.
//
// `conveyor-entropy-index-fuzz --write-seeds DIR` writes the seed corpus (index files made by
// decoding the fixed JPEGs, whole and at crops, with the own decoder and an index, and saving it)
// and exits. tests/fuzz/conveyor-entropy-index-fuzz.dict holds the format's tokens;
// tests/fuzz/corpus/conveyor-entropy-index-fuzz/ what long runs found (fuzz_test.sh).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/jpeg_entropy_index.h"
#include "conveyor/jpeg.h"
#include "conveyor/random.h"

namespace conveyor::fuzz {
namespace {

const char* const kTarget = "conveyor-entropy-index-fuzz";
// Room for every fixed JPEG's entry and more; small enough that a load over it is exercised.
constexpr size_t kBudget = 16 << 10;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: broken guarantee: %s\n", kTarget, what);
    std::abort();
  }
}

struct Crop {
  int x, y, w, h;
};

struct FixedJpeg {
  std::vector<uint8_t> bytes;
  std::vector<Crop> crops;
};

std::vector<uint8_t> generated_rgb(int w, int h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) {
    rgb[i] = static_cast<uint8_t>((i * 7 + (i / 3 / w) * 13) ^ (splitmix64(i) & 63));
  }
  return rgb;
}

// The JPEGs decoded per input: wide enough for two points a row (over 8 MCUs), without restart
// markers (the files libjpeg-turbo decodes whole, which the index serves) and one with them.
const std::vector<FixedJpeg>& fixed_jpegs() {
  static const std::vector<FixedJpeg> files = [] {
    struct Spec {
      int w, h;
      EncodeOptions o;
    };
    std::vector<Spec> specs(4);
    specs[0] = {160, 48, {}};  // 4:2:0, 10 x 3 MCUs
    specs[1] = {72, 40, {}};   // gray, 9 x 5 MCUs
    specs[1].o.color = EncodeOptions::Color::kGray;
    specs[2] = {80, 24, {}};  // 4:4:4, 10 x 3 MCUs
    specs[2].o.h_samp = specs[2].o.v_samp = 1;
    specs[3] = {144, 32, {}};  // 4:2:2, restart every 3 MCUs
    specs[3].o.h_samp = 2, specs[3].o.v_samp = 1, specs[3].o.restart_interval = 3;
    std::vector<FixedJpeg> out;
    for (const Spec& s : specs) {
      const std::vector<uint8_t> rgb = generated_rgb(s.w, s.h);
      FixedJpeg f{encode_jpeg(rgb.data(), s.w, s.h, s.o), {}};
      f.crops = {{0, 0, s.w, s.h},
                 {s.w / 2, s.h / 3, s.w / 2, s.h / 2},
                 {s.w - 9, s.h - 9, 9, 9},
                 {s.w / 5, 0, s.w / 4, s.h}};
      out.push_back(std::move(f));
    }
    return out;
  }();
  return files;
}

// The decoder's options: the own decoder, with `index`; restart segments off, so that the file
// with restart markers is decoded whole and indexed too.
DecodeOptions options(std::shared_ptr<JpegEntropyIndex> index) {
  DecodeOptions o;
  o.own_entropy_decoder = true;
  o.restart_segments = false;
  o.entropy_index = std::move(index);
  return o;
}

// A decode's pixels, or its error.
std::string outcome(JpegDecoder& d, const FixedJpeg& f, const Crop& c) {
  try {
    const DecodedImage img =
        d.decode_region(f.bytes.data(), f.bytes.size(), c.x, c.y, c.w, c.h, c.w, c.h);
    std::string bytes;
    for (int r = 0; r < img.height; ++r) {
      const auto* row = reinterpret_cast<const char*>(img.pixels + r * img.stride);
      bytes.append(row, static_cast<size_t>(img.width) * img.channels);
    }
    return std::to_string(img.width) + "x" + std::to_string(img.height) + ":" + bytes;
  } catch (const JpegError& e) {
    return std::string("error: ") + e.what();
  }
}

// The outcomes without an index, computed once.
const std::vector<std::vector<std::string>>& reference() {
  static const std::vector<std::vector<std::string>> ref = [] {
    JpegDecoder plain({}, options(nullptr));
    std::vector<std::vector<std::string>> out;
    for (const FixedJpeg& f : fixed_jpegs()) {
      out.emplace_back();
      for (const Crop& c : f.crops) out.back().push_back(outcome(plain, f, c));
    }
    return out;
  }();
  return ref;
}

uint32_t get_u32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24; }

// Recomputes each entry's checksum, walking the entries as the reader does (24 bytes of header,
// then 40 bytes, 12 a point, 8 of checksum), as far as the lengths fit.
void reseal(std::vector<uint8_t>& bytes) {
  size_t at = 24;
  while (at + 40 <= bytes.size()) {
    const uint64_t body = 40 + uint64_t{get_u32(bytes.data() + at + 36)} * 12;
    if (body + 8 > bytes.size() - at) break;
    const uint64_t sum = detail::hash_bytes(bytes.data() + at, static_cast<size_t>(body));
    for (int i = 0; i < 8; ++i) bytes[at + body + i] = static_cast<uint8_t>(sum >> (8 * i));
    at += static_cast<size_t>(body) + 8;
  }
}

void run_one(const std::vector<uint8_t>& file, bool same_pixels) {
  auto index = std::make_shared<JpegEntropyIndex>(kBudget);
  const JpegEntropyIndexLoad loaded = index->store().load(file.data(), file.size());
  check(loaded.file_found, "file_found after a load");
  check(!loaded.file_refused ||
            (loaded.entries_loaded == 0 && loaded.entries_refused == 0 && !loaded.refusal.empty()),
        "nothing loaded from a file refused whole, and a reason");
  check(loaded.entries_loaded == index->files(), "entries loaded == files held");
  check(index->bytes() <= kBudget, "the budget kept");
  check(!loaded.rest_dropped || loaded.entries_refused >= 1, "a dropped rest counts as refused");
  // What is held saves and loads again unchanged.
  const std::vector<uint8_t> saved = index->store().serialize();
  detail::EntropyIndexStore again(kBudget);
  const JpegEntropyIndexLoad reloaded = again.load(saved.data(), saved.size());
  check(!reloaded.file_refused && !reloaded.rest_dropped && reloaded.entries_refused == 0 &&
            reloaded.entries_over_budget == 0 && reloaded.entries_loaded == loaded.entries_loaded,
        "the entries held load again whole");
  check(again.serialize() == saved, "the entries held save unchanged");
  // The pixels of a decode without an index, crop after crop (each decode may extend the index).
  JpegDecoder d({}, options(index));
  const auto& files = fixed_jpegs();
  for (size_t i = 0; i < files.size(); ++i) {
    for (size_t c = 0; c < files[i].crops.size(); ++c) {
      const std::string got = outcome(d, files[i], files[i].crops[c]);
      if (same_pixels && got != reference()[i][c]) {
        std::fprintf(stderr, "%s: file %zu, crop %zu differs with the index\n", kTarget, i, c);
        std::abort();
      }
    }
  }
}

// The seeds: the fixed JPEGs' index after decoding each whole, after one crop of each (points
// absent), of each file alone, and an empty index.
std::vector<std::vector<uint8_t>> seed_files() {
  std::vector<std::vector<uint8_t>> seeds;
  const auto& files = fixed_jpegs();
  const auto index_of = [&](const std::vector<size_t>& which, size_t crop) {
    auto index = std::make_shared<JpegEntropyIndex>(kBudget);
    JpegDecoder d({}, options(index));
    for (const size_t i : which) outcome(d, files[i], files[i].crops[crop]);
    return index->store().serialize();
  };
  seeds.push_back(index_of({0, 1, 2, 3}, 0));
  seeds.push_back(index_of({0, 1, 2, 3}, 1));
  seeds.push_back(index_of({3, 2, 1, 0}, 2));
  for (size_t i = 0; i < files.size(); ++i) seeds.push_back(index_of({i}, 0));
  seeds.push_back(index_of({}, 0));
  return seeds;
}

int write_seeds(const char* dir) {
  int n = 0;
  for (const std::vector<uint8_t>& seed : seed_files()) {
    const std::string path = std::string(dir) + "/seed-" + std::to_string(n++) + ".idx";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(seed.data(), 1, seed.size(), f) != seed.size() ||
        std::fclose(f) != 0) {
      std::perror(path.c_str());
      return 1;
    }
  }
  std::printf("%s: wrote %d seeds to %s\n", kTarget, n, dir);
  return 0;
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (*argc >= 3 && std::strcmp((*argv)[1], "--write-seeds") == 0) {
    std::exit(conveyor::fuzz::write_seeds((*argv)[2]));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The bytes in a buffer of their own size, so that ASan sees a read past their end.
  std::vector<uint8_t> file(data, data + size);
  conveyor::fuzz::run_one(file, true);
  conveyor::fuzz::reseal(file);
  conveyor::fuzz::run_one(file, false);
  return 0;
}
