// The own baseline entropy decoder (issue 35, step 2; datasets/codec/jpeg_entropy.h) against
// libjpeg-turbo's jpeg_read_coefficients, block by block: on every kind of file it decodes
// (4:2:0, 4:2:2, 4:4:4, 4:4:0, 4:1:1, gray (1x1 and 2x2 factors), CMYK and YCCK; standard and
// optimized tables; restart intervals 1..N; odd sizes; photo-like files), from the start and from
// states saved at random MCUs; that it refuses the files outside its scope; and on mutated files,
// that it agrees with libjpeg on every block or refuses, and never crashes. Clean under ASan and
// UBSan on 2026-12-04 (jpeg_entropy.cpp and this file compiled with
// -fsanitize=address,undefined -fno-sanitize-recover=all and linked ahead of build/'s libraries).
#include <gtest/gtest.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/jpeg_entropy.h"
#include "conveyor/random.h"
#include "jpeg_coefficients.h"
#include "synthetic.h"

namespace conveyor {
namespace {

using detail::EntropyState;
using detail::HuffmanScanDecoder;

using testing::Coefficients;
using testing::libjpeg_coefficients;
using testing::Own;

Own own_coefficients(const std::vector<uint8_t>& file, HuffmanScanDecoder& decoder,
                     Coefficients& out, std::vector<EntropyState>* states) {
  return testing::own_coefficients(file.data(), file.size(), decoder, out, states);
}

// A file of any kind, written with libjpeg directly (optimized tables are not in EncodeOptions).
struct Kind {
  int components = 3;  // 1 gray, 3 YCbCr, 4 CMYK (or YCCK with `ycck`)
  int h_samp = 2, v_samp = 2;
  int quality = 90;
  unsigned restart_interval = 0;
  bool optimize = false;
  bool ycck = false;
  bool progressive = false;
  bool arithmetic = false;
  std::string name() const {
    return std::to_string(components) + "c " + std::to_string(h_samp) + "x" +
           std::to_string(v_samp) + " q" + std::to_string(quality) + " rst" +
           std::to_string(restart_interval) + (optimize ? " opt" : "") + (ycck ? " ycck" : "");
  }
};

std::vector<uint8_t> encode(int w, int h, const Kind& k, uint64_t seed) {
  // Gradients plus noise: real Huffman data with long codes and 0xFF bytes to stuff.
  const size_t channels = k.components == 4 ? 4 : static_cast<size_t>(k.components);
  std::vector<uint8_t> pixels(static_cast<size_t>(w) * static_cast<size_t>(h) * channels);
  SampleRng rng(seed, 0, 0);
  const uint64_t noise = 1 + rng.next() % 200;
  for (size_t i = 0; i < pixels.size(); ++i) {
    const size_t x = i / channels % static_cast<size_t>(w);
    pixels[i] = static_cast<uint8_t>(x * 255 / static_cast<size_t>(w) / 2 + rng.next() % noise);
  }
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = static_cast<int>(channels);
  cinfo.in_color_space = k.components == 1 ? JCS_GRAYSCALE : k.components == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  if (k.ycck) jpeg_set_colorspace(&cinfo, JCS_YCCK);
  jpeg_set_quality(&cinfo, k.quality, TRUE);
  if (k.components == 1) {  // a one-component scan's MCU is one block whatever these say
    cinfo.comp_info[0].h_samp_factor = k.h_samp;
    cinfo.comp_info[0].v_samp_factor = k.v_samp;
  } else {
    cinfo.comp_info[0].h_samp_factor = k.h_samp;
    cinfo.comp_info[0].v_samp_factor = k.v_samp;
    for (int c = 1; c < cinfo.num_components; ++c) {
      cinfo.comp_info[c].h_samp_factor = cinfo.comp_info[c].v_samp_factor = 1;
    }
    if (k.components == 4 && !k.ycck) {  // CMYK: every component at one sampling
      for (int c = 0; c < 4; ++c)
        cinfo.comp_info[c].h_samp_factor = cinfo.comp_info[c].v_samp_factor = 1;
    }
  }
  cinfo.optimize_coding = k.optimize ? TRUE : FALSE;
  cinfo.restart_interval = k.restart_interval;
  cinfo.arith_code = k.arithmetic ? TRUE : FALSE;
  if (k.progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  const auto stride = static_cast<size_t>(w) * channels;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = pixels.data() + cinfo.next_scanline * stride;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> file(out, out + size);
  jpeg_destroy_compress(&cinfo);
  std::free(out);
  return file;
}

// Decodes `file` both ways and expects every block the same; then restarts the own decoder from
// `restores` random saved states and expects the rest of the scan the same again.
void expect_same_coefficients(const std::vector<uint8_t>& file, const std::string& what,
                              uint64_t seed, int restores = 8) {
  Coefficients expected, own;
  ASSERT_TRUE(libjpeg_coefficients(file.data(), file.size(), true, expected)) << what;
  HuffmanScanDecoder decoder;
  std::vector<EntropyState> states;
  ASSERT_EQ(own_coefficients(file, decoder, own, &states), Own::kDecoded) << what;
  ASSERT_EQ(own.size(), expected.size()) << what;
  for (size_t c = 0; c < own.size(); ++c)
    ASSERT_TRUE(own[c] == expected[c]) << what << ", component " << c;

  // From saved states: the rest of the scan, with about one MCU in four skipped (skip_mcu), whose
  // blocks stay zero while the others match.
  SampleRng rng(seed, 0, 1);
  const auto& l = decoder.layout();
  for (int r = 0; r < restores; ++r) {
    const auto from = static_cast<uint64_t>(rng.next() % states.size());
    Coefficients resumed = expected;
    for (auto& p : resumed) std::fill(p.coefficients.begin(), p.coefficients.end(), JCOEF{0});
    std::vector<bool> skipped(l.total_mcus());
    for (uint64_t m = from; m < l.total_mcus(); ++m) skipped[m] = rng.next() % 4 == 0;
    ASSERT_EQ(testing::resume_coefficients(decoder, states[from], resumed,
                                           [&](uint64_t m) { return skipped[m]; }),
              l.total_mcus())
        << what << ", from MCU " << from;
    ASSERT_EQ(testing::first_resumed_difference(l, resumed, expected, from,
                                                [&](uint64_t m) { return skipped[m]; }),
              l.total_mcus())
        << what << ", from MCU " << from;
  }
}

TEST(JpegEntropy, EveryKindOfFileBlockForBlock) {
  struct Sampling {
    int components, h, v;
    bool ycck;
  };
  const Sampling samplings[] = {{3, 2, 2, false}, {3, 2, 1, false}, {3, 1, 1, false},
                                {3, 1, 2, false}, {3, 4, 1, false}, {1, 1, 1, false},
                                {4, 1, 1, false}, {4, 2, 2, true},  {1, 2, 2, false}};
  const int sizes[][2] = {{1, 1}, {7, 9}, {17, 33}, {64, 48}, {99, 257}, {333, 17}};
  uint64_t seed = 0;
  int files = 0;
  for (const auto& s : samplings) {
    for (const auto& size : sizes) {
      for (const unsigned restart : {0u, 1u, 2u, 3u, 7u, 40u}) {
        Kind k;
        k.components = s.components;
        k.h_samp = s.h;
        k.v_samp = s.v;
        k.ycck = s.ycck;
        k.restart_interval = restart;
        k.quality = (++seed % 3 == 0) ? 100 : (seed % 3 == 1 ? 90 : 50);
        k.optimize = seed % 2 == 0;
        const auto file = encode(size[0], size[1], k, seed);
        expect_same_coefficients(
            file, k.name() + " " + std::to_string(size[0]) + "x" + std::to_string(size[1]), seed,
            3);
        if (HasFatalFailure()) return;
        ++files;
      }
    }
  }
  EXPECT_EQ(files, 9 * 6 * 6);
}

TEST(JpegEntropy, PhotoLikeFilesBlockForBlock) {
  const int sizes[][2] = {{500, 375}, {375, 500}, {333, 211}};
  uint64_t seed = 100;
  for (const auto& size : sizes) {
    for (const int quality : {75, 90, 95}) {
      const auto file = make_photo_jpeg(size[0], size[1], ++seed, quality);
      expect_same_coefficients(file,
                               "photo " + std::to_string(size[0]) + "x" + std::to_string(size[1]) +
                                   " q" + std::to_string(quality),
                               seed, 16);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(JpegEntropy, RefusesFilesOutsideItsScope) {
  HuffmanScanDecoder decoder;
  Coefficients own;
  Kind progressive;
  progressive.progressive = true;
  EXPECT_EQ(own_coefficients(encode(64, 64, progressive, 1), decoder, own, nullptr),
            Own::kRefusedAtStart);
  // Nothing to restore or decode after a refused start.
  EXPECT_FALSE(decoder.restore(EntropyState{}));
  EXPECT_FALSE(decoder.skip_mcu());
  Kind arithmetic;
  arithmetic.arithmetic = true;
  EXPECT_EQ(own_coefficients(encode(64, 64, arithmetic, 1), decoder, own, nullptr),
            Own::kRefusedAtStart);
  // The decoder is usable again after a refusal.
  expect_same_coefficients(encode(64, 64, Kind{}, 1), "baseline after refusals", 1);
  // A file cut short: libjpeg would fill the rest with zeros (with a warning); refused.
  auto cut = encode(128, 128, Kind{}, 2);
  cut.resize(cut.size() / 2);
  const Own result = own_coefficients(cut, decoder, own, nullptr);
  EXPECT_TRUE(result == Own::kRefusedAtStart || result == Own::kRefused);
  // A restart marker out of sequence.
  Kind restarts;
  restarts.restart_interval = 2;
  auto file = encode(128, 64, restarts, 3);
  const uint8_t second_restart[] = {0xFF, 0xD1};
  const auto rst =
      std::search(file.begin(), file.end(), std::begin(second_restart), std::end(second_restart));
  ASSERT_NE(rst, file.end());
  rst[1] = 0xD3;
  EXPECT_EQ(own_coefficients(file, decoder, own, nullptr), Own::kRefusedAtStart);
  // Fill bytes before a stuffed 0xFF (0xFF 0xFF 0x00, not allowed by the standard): libjpeg-turbo
  // reads them as one 0xFF data byte or not, by its path (conveyor-entropy-fuzz's finding).
  auto fill = encode(96, 80, Kind{}, 4);
  const uint8_t sos[] = {0xFF, 0xDA}, stuffed[] = {0xFF, 0x00};
  const auto scan = std::search(fill.begin(), fill.end(), std::begin(sos), std::end(sos));
  const auto at = std::search(scan, fill.end(), std::begin(stuffed), std::end(stuffed));
  ASSERT_NE(at, fill.end());
  fill.insert(at, 0xFF);
  EXPECT_EQ(own_coefficients(fill, decoder, own, nullptr), Own::kRefusedAtStart);
}

// Mutated files: wherever libjpeg reads coefficients (even with a warning), the own decoder
// stores the same blocks or refuses; it never crashes and never reads outside its copy.
TEST(JpegEntropy, MutatedFilesAgreeOrAreRefused) {
  std::vector<std::vector<uint8_t>> originals;
  for (const unsigned restart : {0u, 1u, 5u}) {
    Kind k;
    k.restart_interval = restart;
    originals.push_back(encode(96, 80, k, restart + 7));
    k.components = 1;
    k.optimize = true;
    originals.push_back(encode(80, 96, k, restart + 8));
  }
  originals.push_back(make_photo_jpeg(160, 120, 3, 90));
  HuffmanScanDecoder decoder;
  int agreed = 0, refused = 0, libjpeg_failed = 0;
  SampleRng rng(35, 0, 0);
  for (int i = 0; i < 3000; ++i) {
    auto file = originals[static_cast<size_t>(i) % originals.size()];
    const int edits = 1 + static_cast<int>(rng.next() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng.next() % file.size();
      switch (rng.next() % 5) {
        case 0:
          file[at] = static_cast<uint8_t>(rng.next());
          break;
        case 1:
          file[at] ^= static_cast<uint8_t>(1u << (rng.next() % 8));
          break;
        case 2:
          file[at] = 0xFF;
          break;
        case 3:
          file.insert(file.begin() + static_cast<long>(at),
                      {0xFF, static_cast<uint8_t>(rng.next())});
          break;
        default:
          file.resize(std::max<size_t>(at, 2));
          break;
      }
    }
    Coefficients expected, own;
    const bool libjpeg_read = libjpeg_coefficients(file.data(), file.size(), false, expected);
    const Own result = own_coefficients(file, decoder, own, nullptr);
    if (!libjpeg_read) {
      ++libjpeg_failed;
    } else if (result != Own::kDecoded) {
      ++refused;
    } else {
      ++agreed;
      ASSERT_EQ(own.size(), expected.size()) << "mutation " << i;
      for (size_t c = 0; c < own.size(); ++c) {
        ASSERT_TRUE(own[c] == expected[c]) << "mutation " << i << ", component " << c;
      }
    }
  }
  // Enough of each for the test to mean something.
  EXPECT_GT(agreed, 100);
  EXPECT_GT(refused, 100);
  std::printf("mutated files: %d agreed, %d refused, %d refused by libjpeg\n", agreed, refused,
              libjpeg_failed);
}

}  // namespace
}  // namespace conveyor
