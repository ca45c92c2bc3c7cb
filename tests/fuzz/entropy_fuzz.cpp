// conveyor-entropy-fuzz: differential libFuzzer target for Conveyor's own baseline entropy decoder
// (issue 35; datasets/codec/jpeg_entropy.h) against libjpeg-turbo's jpeg_read_coefficients.
//
// An input is a JPEG followed by kConfigBytes bytes. Wherever libjpeg reads the file's
// coefficients (even with a warning: it then fills what it could not read with zeros), the own
// decoder must either refuse the file or store the same coefficients in every block. When it
// decoded the whole scan, it must also do so again from the state it saved before a fuzz-chosen
// MCU (restore, then the rest of the scan with fuzz-chosen MCUs skipped, which stay zero), and
// refuse an MCU past the last. A disagreement is __builtin_trap(): a finding. Files whose header
// claims more than kMaxPixels are left out (libjpeg would hold all their blocks in memory).
// The comparison is tests/jpeg_coefficients.h's, the one tests/jpeg_entropy_test.cpp makes.
//
// `conveyor-entropy-fuzz --write-seeds DIR` writes the seed corpus (small baseline files of every
// sampling, gray, with and without restart markers, at several qualities, and one progressive
// file for the refusal) and exits. tests/fuzz/conveyor-entropy-fuzz.dict holds JPEG's marker
// tokens; tests/fuzz/corpus/conveyor-entropy-fuzz/ what long runs found (fuzz_test.sh).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../jpeg_coefficients.h"
#include "codec/jpeg_entropy.h"
#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "image_fuzz.h"

namespace conveyor::fuzz {

const char* const kTarget = "conveyor-entropy-fuzz";
const size_t kConfigBytes = 4;
const char* const kSeedSuffix = ".jpg";

namespace {

constexpr uint64_t kMaxPixels = 1u << 20;

// A finding: the own decoder disagrees with libjpeg (a trap, so that libFuzzer keeps the input).
void disagreement(const char* what, uint64_t mcu) {
  std::fprintf(stderr, "%s: the own decoder disagrees with libjpeg: %s (MCU %llu)\n", kTarget, what,
               static_cast<unsigned long long>(mcu));
  __builtin_trap();
}

}  // namespace

std::vector<std::vector<uint8_t>> seed_files() {
  using Color = conveyor::EncodeOptions::Color;
  struct Seed {
    int w, h;
    conveyor::EncodeOptions o;
  };
  std::vector<Seed> seeds;
  auto add = [&](int w, int h, auto&& set) {
    conveyor::EncodeOptions o;
    set(o);
    seeds.push_back({w, h, o});
  };
  const int samp[][2] = {{1, 1}, {2, 1}, {2, 2}, {1, 2}, {4, 1}};
  int quality = 50;
  for (auto& s : samp) {
    for (const int restart : {0, 1, 3}) {
      quality = quality == 100 ? 50 : quality + 25;
      add(37, 29, [&](auto& o) {
        o.h_samp = s[0], o.v_samp = s[1], o.restart_interval = restart, o.quality = quality;
      });
    }
  }
  for (const int restart : {0, 2, 5}) {
    add(48, 40, [&](auto& o) { o.color = Color::kGray, o.restart_interval = restart; });
  }
  add(40, 40, [](auto& o) { o.color = Color::kRgb; });
  add(40, 24, [](auto& o) { o.color = Color::kCmyk, o.restart_interval = 2; });
  add(32, 32, [](auto& o) { o.color = Color::kYcck; });
  add(1, 1, [](auto&) {});
  add(3, 150, [](auto& o) { o.restart_interval = 1; });
  add(150, 3, [](auto& o) { o.quality = 100; });
  add(64, 48, [](auto& o) { o.progressive = true; });  // refused at start
  std::vector<std::vector<uint8_t>> files;
  for (const Seed& s : seeds) {
    std::vector<uint8_t> rgb(static_cast<size_t>(s.w) * s.h * 3);
    for (size_t i = 0; i < rgb.size(); ++i) {
      rgb[i] = static_cast<uint8_t>((i * 7 + (i / 3 / s.w) * 13) ^ (conveyor::splitmix64(i) & 31));
    }
    files.push_back(conveyor::encode_jpeg(rgb.data(), s.w, s.h, s.o));
  }
  return files;
}

void run_one(FuzzedDataProvider& cfg, const uint8_t* jpeg, size_t size) {
  using testing::Coefficients;
  using testing::Own;
  // One decoder across inputs, as a worker keeps one: no state may leak from one file to the next.
  static detail::HuffmanScanDecoder decoder;
  Coefficients expected, own;
  if (!testing::libjpeg_coefficients(jpeg, size, false, expected, kMaxPixels)) return;
  std::vector<detail::EntropyState> states;
  if (testing::own_coefficients(jpeg, size, decoder, own, &states) != Own::kDecoded) return;
  if (own.size() != expected.size()) disagreement("the number of components", 0);
  for (size_t c = 0; c < own.size(); ++c) {
    if (!(own[c] == expected[c])) disagreement("a component's blocks", 0);
  }
  // From a saved state: the rest of the scan, with the MCUs whose number's bits meet the fuzzed
  // mask skipped.
  const auto from = static_cast<size_t>(cfg.ConsumeIntegral<uint16_t>() % states.size());
  const uint8_t skip_mask = cfg.ConsumeIntegral<uint8_t>();
  const uint8_t skip_bits = cfg.ConsumeIntegral<uint8_t>() & skip_mask;
  const auto skip = [&](uint64_t m) { return skip_mask != 0 && (m & skip_mask) == skip_bits; };
  Coefficients resumed = expected;
  for (auto& p : resumed) std::fill(p.coefficients.begin(), p.coefficients.end(), JCOEF{0});
  const uint64_t total = decoder.layout().total_mcus();
  const uint64_t refused_at = testing::resume_coefficients(decoder, states[from], resumed, skip);
  if (refused_at != total) disagreement("resumed from a saved state, refused at", refused_at);
  const uint64_t differs_at =
      testing::first_resumed_difference(decoder.layout(), resumed, expected, from, skip);
  if (differs_at != total) disagreement("resumed from a saved state, differs at", differs_at);
}

}  // namespace conveyor::fuzz
