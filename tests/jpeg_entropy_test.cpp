// The own baseline entropy decoder (issue 35, step 2; datasets/codec/jpeg_entropy.h) against
// libjpeg-turbo's jpeg_read_coefficients, block by block: on every kind of file it decodes
// (4:2:0, 4:2:2, 4:4:4, 4:4:0, 4:1:1, gray (1x1 and 2x2 factors), CMYK and YCCK; standard and
// optimized tables; restart intervals 1..N; odd sizes; photo-like files), from the start and from
// states saved at random MCUs; that it refuses the files outside its scope; and on mutated files,
// that it agrees with libjpeg on every block or refuses, and never crashes. Clean under ASan and
// UBSan on 2026-12-04 (jpeg_entropy.cpp and this file compiled with
// -fsanitize=address,undefined -fno-sanitize-recover=all and linked ahead of build/'s libraries).
// Then the decoder wired into JpegDecoder (DecodeOptions::own_entropy_decoder, issue 35 step 4):
// the same pixels as libjpeg-turbo's own path on the same corpus, random crops at random DCT
// scales; libjpeg's result (pixels or error) when it refuses a scan midway; taken for baseline
// files only; and libjpeg's source handed back at EOI after a whole scan. All of this file clean
// under ASan and UBSan again at 20:36 UTC (jpeg_decode.cpp and jpeg_column_discard.cpp compiled
// so too). Then the per-file index (JpegEntropyIndex, issue 35 step 3): libjpeg's bytes on every
// kind of file decoded again and again with random boxes, fewer MCUs parsed once a file's entry
// exists, corrupted entries never changing pixels, and the byte budget.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/jpeg_column_discard.h"
#include "codec/jpeg_entropy.h"
#include "codec/jpeg_entropy_index.h"
#include "codec/libjpeg_errors.h"
#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "conveyor/sample_source.h"
#include "jpeg_coefficients.h"
#include "synthetic.h"
#include "test_support.h"

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

// Every sampling, size and restart interval the own decoder takes, with standard and optimized
// tables (9 x 6 x 6 files), each with the seed it was encoded with.
struct GeneratedFile {
  std::string name;
  std::vector<uint8_t> bytes;
  uint64_t seed;
};
std::vector<GeneratedFile> generated_corpus() {
  struct Sampling {
    int components, h, v;
    bool ycck;
  };
  const Sampling samplings[] = {{3, 2, 2, false}, {3, 2, 1, false}, {3, 1, 1, false},
                                {3, 1, 2, false}, {3, 4, 1, false}, {1, 1, 1, false},
                                {4, 1, 1, false}, {4, 2, 2, true},  {1, 2, 2, false}};
  const int sizes[][2] = {{1, 1}, {7, 9}, {17, 33}, {64, 48}, {99, 257}, {333, 17}};
  std::vector<GeneratedFile> files;
  uint64_t seed = 0;
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
        files.push_back({k.name() + " " + std::to_string(size[0]) + "x" + std::to_string(size[1]),
                         encode(size[0], size[1], k, seed), seed});
      }
    }
  }
  return files;
}

TEST(JpegEntropy, EveryKindOfFileBlockForBlock) {
  int files = 0;
  for (const GeneratedFile& f : generated_corpus()) {
    expect_same_coefficients(f.bytes, f.name, f.seed, 3);
    if (HasFatalFailure()) return;
    ++files;
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

// ---------------------------------------------------------------------------------------------
// The own decoder inside JpegDecoder (DecodeOptions::own_entropy_decoder).

// The rows of a decoded region, without the stride's padding.
std::vector<uint8_t> region_bytes(const DecodedImage& img) {
  std::vector<uint8_t> bytes;
  const size_t row = static_cast<size_t>(img.width) * static_cast<size_t>(img.channels);
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* p = img.pixels + static_cast<size_t>(y) * img.stride;
    bytes.insert(bytes.end(), p, p + row);
  }
  return bytes;
}

// What a decode gave: its pixels, or its error; and its entropy path.
struct Outcome {
  std::vector<uint8_t> bytes;
  int width = 0, height = 0, scale = 0;
  std::string error;
  JpegEntropyStats stats;
  bool operator==(const Outcome& o) const {
    return bytes == o.bytes && width == o.width && height == o.height && scale == o.scale &&
           error == o.error;
  }
};

struct Box {
  int x, y, w, h, min_w, min_h;
};

Outcome decode_box(JpegDecoder& d, const std::vector<uint8_t>& file, const Box& b) {
  Outcome o;
  try {
    const DecodedImage img =
        d.decode_region(file.data(), file.size(), b.x, b.y, b.w, b.h, b.min_w, b.min_h);
    o.bytes = region_bytes(img);
    o.width = img.width;
    o.height = img.height;
    o.scale = img.scale;
  } catch (const JpegError& e) {
    o.error = e.what();
  }
  o.stats = d.last_entropy_stats();
  return o;
}

// A random box (sometimes the whole image) and a random output size, so every DCT scale.
Box random_box(SampleRng& rng, int w, int h) {
  Box b{0, 0, w, h, w, h};
  if (rng.next() % 5 != 0) {
    b.w = rng.randint(1, w + 1);
    b.h = rng.randint(1, h + 1);
    b.x = rng.randint(0, w - b.w + 1);
    b.y = rng.randint(0, h - b.h + 1);
  }
  b.min_w = rng.randint(1, b.w + 1);
  b.min_h = rng.randint(1, b.h + 1);
  return b;
}

// The option sets the own decoder runs under: the loader's (RGBX, fast upsampling) and the
// default (RGB, fancy), each with any_scale, without the discard hook, or without restart
// segments.
std::vector<std::pair<std::string, DecodeOptions>> own_option_sets() {
  std::vector<std::pair<std::string, DecodeOptions>> sets;
  for (const bool fast : {true, false}) {
    DecodeOptions o;
    o.channels = fast ? 4 : 3;
    o.fast_upsampling = fast;
    o.own_entropy_decoder = true;
    const std::string name = fast ? "RGBX fast" : "RGB fancy";
    sets.emplace_back(name, o);
    o.any_scale = true;
    sets.emplace_back(name + " any_scale", o);
    o.any_scale = false;
    o.discard_outside_crop = false;
    sets.emplace_back(name + " no discard", o);
    o.discard_outside_crop = true;
    o.restart_segments = false;
    sets.emplace_back(name + " no segments", o);
  }
  return sets;
}

// libjpeg-turbo's own path for the same options: no own decoder, no discard hook.
DecodeOptions stock(DecodeOptions o) {
  o.own_entropy_decoder = false;
  o.discard_outside_crop = false;
  return o;
}

// The same bytes as libjpeg-turbo's path: every sampling, tables, restart interval and size of
// EveryKindOfFileBlockForBlock, plus photo-like files, random boxes at random scales, under each
// option set, by decoders reused across files. The own decoder takes every one of them.
using NamedFiles = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

// Every sampling, tables, restart interval and size of EveryKindOfFileBlockForBlock, plus
// photo-like files.
NamedFiles own_decoder_corpus() {
  NamedFiles files;
  for (GeneratedFile& f : generated_corpus())
    files.emplace_back(std::move(f.name), std::move(f.bytes));
  for (const int quality : {75, 95}) {
    files.emplace_back("photo 500x375 q" + std::to_string(quality),
                       make_photo_jpeg(500, 375, static_cast<uint64_t>(quality), quality));
  }
  return files;
}

TEST(JpegOwnEntropy, DecodesTheSameBytesAsLibjpegOnEveryKindOfFile) {
  const NamedFiles files = own_decoder_corpus();
  const auto sets = own_option_sets();
  std::vector<JpegDecoder> own, libjpeg;
  for (const auto& [name, o] : sets) {
    own.emplace_back(DecodeLimits{}, o);
    libjpeg.emplace_back(DecodeLimits{}, stock(o));
  }
  SampleRng rng(35, 4, 0);
  uint64_t compared = 0, discarded = 0;
  uint64_t by_scale[9] = {};
  for (const auto& [name, file] : files) {
    JpegHeader header = own[0].read_header(file.data(), file.size());
    for (int trial = 0; trial < 6; ++trial) {
      const size_t s = static_cast<size_t>(rng.next() % sets.size());
      const Box b = random_box(rng, header.width, header.height);
      SCOPED_TRACE(name + ", " + sets[s].first + ", box " + std::to_string(b.x) + "," +
                   std::to_string(b.y) + " " + std::to_string(b.w) + "x" + std::to_string(b.h) +
                   " min " + std::to_string(b.min_w) + "x" + std::to_string(b.min_h));
      const Outcome got = decode_box(own[s], file, b);
      const Outcome want = decode_box(libjpeg[s], file, b);
      ASSERT_TRUE(want.error.empty()) << want.error;
      ASSERT_TRUE(got == want) << "at " << want.scale << "/8: " << got.error;
      ASSERT_EQ(got.stats.path, JpegEntropyPath::kOwnDecoder);
      ASSERT_FALSE(got.stats.own_decoder_retried);
      ASSERT_EQ(want.stats.path, JpegEntropyPath::kLibjpeg);
      discarded += got.stats.mcus_discarded;
      ++by_scale[got.scale];
      ++compared;
    }
  }
  std::printf(
      "own entropy decoder: %llu boxes of %zu files the same as libjpeg's; at 1/2/4/8 of "
      "8: %llu/%llu/%llu/%llu (any_scale sets: the others); %llu MCUs discarded\n",
      static_cast<unsigned long long>(compared), files.size(),
      static_cast<unsigned long long>(by_scale[1]), static_cast<unsigned long long>(by_scale[2]),
      static_cast<unsigned long long>(by_scale[4]), static_cast<unsigned long long>(by_scale[8]),
      static_cast<unsigned long long>(discarded));
  EXPECT_EQ(compared, files.size() * 6);
  for (const int scale : {1, 2, 4, 8}) EXPECT_GT(by_scale[scale], 0u) << scale;
  EXPECT_GT(discarded, 0u);
}

// Where the scan data of a file begins (after its SOS segment).
size_t scan_begin(const std::vector<uint8_t>& file) {
  const uint8_t sos[] = {0xFF, 0xDA};
  const auto at = std::search(file.begin(), file.end(), std::begin(sos), std::end(sos));
  if (at == file.end() || file.end() - at < 4) throw std::runtime_error("no SOS");
  const auto i = static_cast<size_t>(at - file.begin());
  return i + 2 + (static_cast<size_t>(file[i + 2]) << 8 | file[i + 3]);
}

// A refusal midway through a scan ends in libjpeg's path for the whole image: mutated scans
// give, with the own decoder on, exactly what libjpeg's path gives (the same pixels, or the same
// error). libjpeg-turbo's fast Huffman path reads a code that is in no table as a zero symbol
// without a warning, so many of these files decode on libjpeg's path after the own decoder
// refused them.
TEST(JpegOwnEntropy, RefusalsGiveLibjpegsResult) {
  std::vector<std::vector<uint8_t>> originals;
  originals.push_back(make_photo_jpeg(333, 217, 5, 90));
  for (const unsigned restart : {0u, 7u}) {
    Kind k;
    k.restart_interval = restart;
    originals.push_back(encode(256, 160, k, restart + 11));
    k.components = 1;
    k.optimize = true;
    originals.push_back(encode(200, 240, k, restart + 12));
  }
  DecodeOptions on;
  on.channels = 4;
  on.fast_upsampling = true;
  on.own_entropy_decoder = true;
  JpegDecoder own({}, on), libjpeg({}, stock(on));
  SampleRng rng(35, 5, 0);
  int agreed = 0, refused_at_start = 0, retried_decoded = 0, retried_failed = 0;
  for (int i = 0; i < 1500; ++i) {
    auto file = originals[static_cast<size_t>(i) % originals.size()];
    const size_t begin = scan_begin(file);
    // In the first half of the scan, where libjpeg-turbo takes its fast path.
    const size_t span = (file.size() - begin) / 2;
    const int edits = 1 + static_cast<int>(rng.next() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = begin + rng.next() % span;
      switch (rng.next() % 4) {
        case 0:
          file[at] ^= static_cast<uint8_t>(1u << (rng.next() % 8));
          break;
        case 1:
          file[at] = static_cast<uint8_t>(rng.next());
          break;
        case 2:  // a run of 1 bits, a code in no standard table
          if (file[at - 1] != 0xFF) {
            const uint8_t ones[] = {0xFF, 0x00, 0xFF, 0x00};
            file.insert(file.begin() + static_cast<long>(at), std::begin(ones), std::end(ones));
          }
          break;
        default:  // a byte more or less
          if (rng.next() % 2 == 0) {
            file.erase(file.begin() + static_cast<long>(at));
          } else {
            file.insert(file.begin() + static_cast<long>(at), static_cast<uint8_t>(rng.next()));
          }
          break;
      }
    }
    const JpegHeader header = libjpeg.read_header(file.data(), file.size());
    const Box b = random_box(rng, header.width, header.height);
    const Outcome got = decode_box(own, file, b);
    const Outcome want = decode_box(libjpeg, file, b);
    ASSERT_TRUE(got == want) << "mutation " << i << ": " << got.error << " / " << want.error;
    if (got.stats.own_decoder_retried) {
      EXPECT_NE(got.stats.path, JpegEntropyPath::kOwnDecoder);
      ++(want.error.empty() ? retried_decoded : retried_failed);
    } else if (got.stats.path == JpegEntropyPath::kOwnDecoder) {
      ++agreed;
    } else {
      ++refused_at_start;
    }
  }
  std::printf(
      "mutated scans: %d decoded by the own decoder, %d refused at its start, %d refused "
      "midway and decoded by libjpeg, %d refused midway and failed in libjpeg too\n",
      agreed, refused_at_start, retried_decoded, retried_failed);
  EXPECT_GT(agreed, 50);
  EXPECT_GT(retried_decoded, 20);
  EXPECT_GT(retried_failed, 20);
  // The decoder is whole after all that.
  const Box whole{0, 0, 333, 217, 333, 217};
  const Outcome clean = decode_box(own, originals[0], whole);
  EXPECT_EQ(clean.stats.path, JpegEntropyPath::kOwnDecoder);
  EXPECT_TRUE(clean == decode_box(libjpeg, originals[0], whole));
}

// Files whose oddity the own decoder refuses, one of each, against libjpeg's path.
TEST(JpegOwnEntropy, RefusedFilesGiveLibjpegsResult) {
  DecodeOptions on;
  on.own_entropy_decoder = true;
  JpegDecoder own({}, on), libjpeg({}, stock(on));
  Kind restarts;
  restarts.restart_interval = 2;
  const auto original = encode(128, 64, restarts, 3);
  const Box box{0, 0, 128, 64, 128, 64};
  const Box top{0, 0, 128, 20, 128, 20};
  // A byte less at the end of the first restart segment: libjpeg runs out of data in it (a
  // warning: an error here); the own decoder refuses the MCU that overruns the segment.
  const uint8_t first_restart[] = {0xFF, 0xD0};
  {
    auto file = original;
    const auto rst =
        std::search(file.begin(), file.end(), std::begin(first_restart), std::end(first_restart));
    ASSERT_NE(rst, file.end());
    file.erase(rst - 2);
    const Outcome got = decode_box(own, file, box);
    EXPECT_TRUE(got == decode_box(libjpeg, file, box)) << got.error;
    EXPECT_FALSE(got.error.empty());
    EXPECT_TRUE(got.stats.own_decoder_retried);
  }
  // Extraneous bytes before a restart marker: libjpeg's warning (counted when it next looks for
  // a marker) is an error; the own decoder refuses a segment left a whole byte unread.
  {
    auto file = original;
    const auto rst =
        std::search(file.begin(), file.end(), std::begin(first_restart), std::end(first_restart));
    file.insert(rst, {0x12, 0x34});
    const Outcome got = decode_box(own, file, box);
    EXPECT_TRUE(got == decode_box(libjpeg, file, box)) << got.error;
    EXPECT_NE(got.error.find("extraneous"), std::string::npos) << got.error;
    EXPECT_TRUE(got.stats.own_decoder_retried);
  }
  // 0xFF 0xFF 0x00 in the scan: refused at the start, libjpeg's path from the first MCU.
  {
    auto file = encode(96, 80, Kind{}, 4);
    const uint8_t stuffed[] = {0xFF, 0x00};
    const auto at = std::search(file.begin() + static_cast<long>(scan_begin(file)), file.end(),
                                std::begin(stuffed), std::end(stuffed));
    ASSERT_NE(at, file.end());
    file.insert(at, 0xFF);
    const Box all{0, 0, 96, 80, 96, 80};
    const Outcome got = decode_box(own, file, all);
    EXPECT_TRUE(got == decode_box(libjpeg, file, all)) << got.error;
    EXPECT_NE(got.stats.path, JpegEntropyPath::kOwnDecoder);
    EXPECT_FALSE(got.stats.own_decoder_retried);
  }
  // Cut short: no EOI, refused at the start. A box above the cut decodes on libjpeg's path; one
  // below it fails there, as without the own decoder.
  {
    auto file = make_photo_jpeg(333, 217, 6, 90);
    file.resize(file.size() * 3 / 4);
    const Box upper{100, 0, 80, 40, 80, 40}, lower{100, 180, 80, 37, 80, 37};
    const Outcome got = decode_box(own, file, upper);
    EXPECT_TRUE(got == decode_box(libjpeg, file, upper)) << got.error;
    EXPECT_TRUE(got.error.empty()) << got.error;
    EXPECT_EQ(got.stats.path, JpegEntropyPath::kDiscardOutsideCrop);
    const Outcome failed = decode_box(own, file, lower);
    EXPECT_TRUE(failed == decode_box(libjpeg, file, lower));
    EXPECT_FALSE(failed.error.empty());
  }
  // And the next file is the own decoder's again.
  const Outcome next = decode_box(own, original, top);
  EXPECT_EQ(next.stats.path, JpegEntropyPath::kOwnDecoder);
  EXPECT_TRUE(next == decode_box(libjpeg, original, top));
}

// Taken for a baseline file, whatever the box, and not for a progressive or arithmetic-coded one
// or with the option off.
TEST(JpegOwnEntropy, IsUsedForABaselineFileAndNotForAProgressiveOne) {
  const auto baseline = make_photo_jpeg(500, 375, 3, 90);
  Kind progressive_kind;
  progressive_kind.progressive = true;
  const auto progressive = encode(500, 375, progressive_kind, 3);
  Kind arithmetic_kind;
  arithmetic_kind.arithmetic = true;
  const auto arithmetic = encode(500, 375, arithmetic_kind, 3);
  DecodeOptions on;
  on.own_entropy_decoder = true;
  JpegDecoder d({}, on);
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kNone);
  d.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  JpegEntropyStats stats = d.last_entropy_stats();
  EXPECT_EQ(stats.path, JpegEntropyPath::kOwnDecoder);
  EXPECT_FALSE(stats.own_decoder_retried);
  // 4:2:0 at 8/8: 32 MCUs a row, the box and its one-MCU margin need 10 of them (as the discard
  // hook's test counts).
  EXPECT_GE(stats.mcus_discarded, 8u * 22u);
  EXPECT_LE(stats.mcus_discarded, 24u * 22u);
  d.decode(baseline.data(), baseline.size());
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kOwnDecoder);
  EXPECT_EQ(d.last_entropy_stats().mcus_discarded, 0u);
  d.decode_region(progressive.data(), progressive.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
  d.decode_region(arithmetic.data(), arithmetic.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
  d.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kOwnDecoder);
  // Without the discard hook every MCU of the decoded rows is stored.
  DecodeOptions no_discard = on;
  no_discard.discard_outside_crop = false;
  JpegDecoder all_columns({}, no_discard);
  all_columns.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(all_columns.last_entropy_stats().path, JpegEntropyPath::kOwnDecoder);
  EXPECT_EQ(all_columns.last_entropy_stats().mcus_discarded, 0u);
  // On by default; off, libjpeg-turbo's path with the discard hook.
  JpegDecoder plain;
  plain.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(plain.last_entropy_stats().path, JpegEntropyPath::kOwnDecoder);
  EXPECT_TRUE(DecodeOptions{}.own_entropy_decoder);
  EXPECT_TRUE(ImageTransform{}.own_entropy_decoder);
  DecodeOptions off;
  off.own_entropy_decoder = false;
  JpegDecoder stock({}, off);
  stock.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(stock.last_entropy_stats().path, JpegEntropyPath::kDiscardOutsideCrop);
}

// A whole decode through the seam with plain libjpeg calls, up to jpeg_finish_decompress, with
// every warning an error: the own decoder leaves libjpeg's source at EOI (no extraneous bytes),
// and the pixels are those of the same decode without it.
std::vector<uint8_t> libjpeg_rows(const std::vector<uint8_t>& file, bool own, bool& used) {
  jpeg_decompress_struct cinfo;
  detail::ErrorManager err;
  detail::ColumnDiscard hook;
  std::vector<uint8_t> pixels;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = detail::on_error;
  err.pub.emit_message = detail::on_message;
  jpeg_create_decompress(&cinfo);
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw std::runtime_error(err.message);
  }
  cinfo.client_data = &hook;
  jpeg_mem_src(&cinfo, file.data(), static_cast<unsigned long>(file.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  used = own && hook.install_own(&cinfo, 0, cinfo.output_width, true);
  const size_t stride = static_cast<size_t>(cinfo.output_width) * 3;
  pixels.resize(stride * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels.data() + cinfo.output_scanline * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return pixels;
}

TEST(JpegOwnEntropy, HandsLibjpegsSourceBackAtEoi) {
  for (const unsigned restart : {0u, 1u, 7u}) {
    for (const int components : {1, 3}) {
      Kind k;
      k.components = components;
      k.restart_interval = restart;
      const auto file = encode(123, 77, k, restart + 1);
      SCOPED_TRACE(k.name());
      bool used = false, unused = true;
      std::vector<uint8_t> own, libjpeg;
      ASSERT_NO_THROW(own = libjpeg_rows(file, true, used));
      ASSERT_NO_THROW(libjpeg = libjpeg_rows(file, false, unused));
      EXPECT_TRUE(used);
      EXPECT_FALSE(unused);
      EXPECT_TRUE(own == libjpeg);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The per-file index (JpegEntropyIndex, issue 35 step 3).

// Each file of the corpus decoded several times with random boxes by own decoders sharing one
// index: the bytes of libjpeg's path every time; the index is found from the second decode of a
// file on, and the own decoder parses fewer MCUs with it than without it on the same boxes.
TEST(JpegEntropyIndex, RepeatedRandomCropsGiveLibjpegsBytes) {
  const NamedFiles files = own_decoder_corpus();
  const auto sets = own_option_sets();
  auto index = std::make_shared<JpegEntropyIndex>();
  std::vector<JpegDecoder> indexed, own, libjpeg;
  for (const auto& [name, o] : sets) {
    DecodeOptions with_index = o;
    with_index.entropy_index = index;
    indexed.emplace_back(DecodeLimits{}, with_index);
    own.emplace_back(DecodeLimits{}, o);
    libjpeg.emplace_back(DecodeLimits{}, stock(o));
  }
  SampleRng rng(35, 3, 0);
  uint64_t compared = 0, found = 0, parsed_indexed = 0, parsed_own = 0;
  uint64_t whole_files = 0, found_whole = 0, parsed_whole_indexed = 0, parsed_whole_own = 0;
  size_t file_bytes = 0;
  for (const auto& [name, file] : files) {
    JpegHeader header = own[0].read_header(file.data(), file.size());
    file_bytes += file.size();
    for (int trial = 0; trial < 5; ++trial) {
      const size_t s = static_cast<size_t>(rng.next() % sets.size());
      const Box b = random_box(rng, header.width, header.height);
      SCOPED_TRACE(name + ", " + sets[s].first + ", trial " + std::to_string(trial) + ", box " +
                   std::to_string(b.x) + "," + std::to_string(b.y) + " " + std::to_string(b.w) +
                   "x" + std::to_string(b.h) + " min " + std::to_string(b.min_w) + "x" +
                   std::to_string(b.min_h));
      const Outcome got = decode_box(indexed[s], file, b);
      const Outcome plain = decode_box(own[s], file, b);
      const Outcome want = decode_box(libjpeg[s], file, b);
      ASSERT_TRUE(want.error.empty()) << want.error;
      ASSERT_TRUE(got == want) << "at " << want.scale << "/8: " << got.error;
      ASSERT_EQ(got.stats.path, JpegEntropyPath::kOwnDecoder);
      ASSERT_FALSE(got.stats.own_decoder_retried);
      ASSERT_LE(got.stats.mcus_parsed, plain.stats.mcus_parsed);
      if (trial == 0) {
        // The first decode parses what the own decoder parses without an index.
        ASSERT_FALSE(got.stats.index_found);
        ASSERT_EQ(got.stats.mcus_parsed, plain.stats.mcus_parsed);
      }
      found += got.stats.index_found ? 1 : 0;
      parsed_indexed += got.stats.mcus_parsed;
      parsed_own += plain.stats.mcus_parsed;
      ++compared;
      // A file without restart markers is always decoded whole (files with them may be cut to
      // the box's segments, a different JPEG each time, under restart_segments).
      if (name.find(" rst0 ") != std::string::npos || name.find("photo") == 0) {
        found_whole += got.stats.index_found ? 1 : 0;
        parsed_whole_indexed += got.stats.mcus_parsed;
        parsed_whole_own += plain.stats.mcus_parsed;
        ++whole_files;
      }
    }
  }
  std::printf(
      "entropy index: %llu boxes of %zu files the same as libjpeg's, %llu with an entry; MCUs "
      "parsed %llu with the index, %llu without; %zu bytes held for %zu files (%.2f%% of their "
      "%zu bytes)\n",
      static_cast<unsigned long long>(compared), files.size(),
      static_cast<unsigned long long>(found), static_cast<unsigned long long>(parsed_indexed),
      static_cast<unsigned long long>(parsed_own), index->bytes(), index->files(),
      100.0 * static_cast<double>(index->bytes()) / static_cast<double>(file_bytes), file_bytes);
  std::printf(
      "files without restart markers: %llu decodes, %llu with an entry; MCUs parsed %llu with "
      "the index, %llu without\n",
      static_cast<unsigned long long>(whole_files), static_cast<unsigned long long>(found_whole),
      static_cast<unsigned long long>(parsed_whole_indexed),
      static_cast<unsigned long long>(parsed_whole_own));
  EXPECT_EQ(compared, files.size() * 5);
  // Every such file's first decode stores an entry, and the 4 later ones find it.
  EXPECT_EQ(found_whole, whole_files / 5 * 4);
  EXPECT_GE(index->files(), whole_files / 5);
  EXPECT_LT(parsed_indexed, parsed_own);
  EXPECT_LT(parsed_whole_indexed, parsed_whole_own * 8 / 10);
}

// The second decode of the same crop parses only the crop's MCUs (plus at most the step to the
// crop's first column in each row); the entry of a 500x375 4:2:0 photo is about 1% of the file.
TEST(JpegEntropyIndex, TheSecondDecodeParsesOnlyTheCrop) {
  const auto file = make_photo_jpeg(500, 375, 11, 90);
  DecodeOptions o;
  o.own_entropy_decoder = true;
  o.entropy_index = std::make_shared<JpegEntropyIndex>();
  JpegDecoder d({}, o);
  JpegDecoder libjpeg({}, stock(o));
  // 4:2:0 at 8/8: MCUs of 16x16, 32 a row, 24 rows. The box with its one-MCU margin of fancy
  // upsampling covers columns 17..27 and rows 13..22 (11 x 10 MCUs).
  const Box b{300, 230, 120, 110, 120, 110};
  const Outcome first = decode_box(d, file, b);
  const Outcome second = decode_box(d, file, b);
  const Outcome want = decode_box(libjpeg, file, b);
  ASSERT_TRUE(want.error.empty());
  EXPECT_TRUE(first == want);
  EXPECT_TRUE(second == want);
  EXPECT_FALSE(first.stats.index_found);
  EXPECT_TRUE(second.stats.index_found);
  // The first parses every MCU down to the end of the crop's last row.
  EXPECT_EQ(first.stats.mcus_parsed, 23u * 32u);
  // The second: from column 16 (the saved point before 17) to 27 in each of the 10 rows.
  EXPECT_EQ(second.stats.mcus_parsed, 10u * 12u);
  // 24 rows of 4 points (columns 0, 8, 16, 24) of 12 bytes, and the entry's bookkeeping.
  const size_t bytes = o.entropy_index->bytes();
  std::printf("entry of a 500x375 4:2:0 photo: %zu bytes, %.2f%% of its %zu bytes\n", bytes,
              100.0 * static_cast<double>(bytes) / static_cast<double>(file.size()), file.size());
  EXPECT_GE(bytes, 24u * 4u * 12u);
  EXPECT_LT(bytes, file.size() / 50);
  // A box further down and left: rows 13..22 come from the entry, the rows below are parsed from
  // the last saved point (and saved for the next time).
  const Box lower{40, 300, 60, 70, 60, 70};
  const Outcome third = decode_box(d, file, lower);
  EXPECT_TRUE(third == decode_box(libjpeg, file, lower));
  EXPECT_TRUE(third.stats.index_found);
  EXPECT_LT(third.stats.mcus_parsed, 23u * 32u);
}

// Bits flipped in stored entries (positions and DC predictors, as memory corruption would) never
// change pixels: the entry's checksum fails, it is dropped, and the file is decoded as if it had
// none.
TEST(JpegEntropyIndex, CorruptedEntriesNeverChangePixels) {
  NamedFiles files = own_decoder_corpus();
  DecodeOptions o;
  o.channels = 4;
  o.fast_upsampling = true;
  o.own_entropy_decoder = true;
  o.entropy_index = std::make_shared<JpegEntropyIndex>();
  JpegDecoder d({}, o);
  JpegDecoder libjpeg({}, stock(o));
  SampleRng rng(35, 5, 0);
  uint64_t compared = 0, tampered = 0;
  for (const auto& [name, file] : files) {
    JpegHeader header = libjpeg.read_header(file.data(), file.size());
    const Box whole{0, 0, header.width, header.height, header.width, header.height};
    decode_box(d, file, whole);  // every point saved
    // Flip one random bit of one random saved point of every entry.
    o.entropy_index->store().tamper([&](detail::FileIndex& index) {
      std::vector<size_t> saved;
      for (size_t i = 0; i < index.points.size(); ++i) {
        if (index.points[i].bit_position != detail::IndexPoint::kAbsent) saved.push_back(i);
      }
      if (saved.empty()) return;
      detail::IndexPoint& p = index.points[saved[rng.next() % saved.size()]];
      const int bit = static_cast<int>(rng.next() % 96);
      if (bit < 32) {
        p.bit_position ^= 1u << bit;
      } else {
        auto& dc = p.dc_predictor[static_cast<size_t>((bit - 32) / 16)];
        dc = static_cast<int16_t>(static_cast<uint16_t>(dc) ^ (1u << ((bit - 32) % 16)));
      }
      ++tampered;
    });
    for (int trial = 0; trial < 3; ++trial) {
      const Box b = random_box(rng, header.width, header.height);
      SCOPED_TRACE(name + ", trial " + std::to_string(trial));
      const Outcome got = decode_box(d, file, b);
      const Outcome want = decode_box(libjpeg, file, b);
      ASSERT_TRUE(got == want) << got.error;
      // The tampered entry was dropped at the first look-up; the decode stored a fresh one.
      if (trial == 0) {
        ASSERT_FALSE(got.stats.index_found);
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, files.size() * 3);
  EXPECT_GE(tampered, files.size());
}

// The budget bounds what is held; the least recently used file leaves first; 0 holds nothing.
TEST(JpegEntropyIndex, KeepsToItsBudget) {
  std::vector<std::vector<uint8_t>> photos;
  for (uint64_t seed = 0; seed < 4; ++seed) photos.push_back(make_photo_jpeg(500, 375, seed, 90));
  DecodeOptions o;
  o.own_entropy_decoder = true;
  o.entropy_index = std::make_shared<JpegEntropyIndex>();
  JpegDecoder d({}, o);
  d.decode(photos[0].data(), photos[0].size());
  const size_t one = o.entropy_index->bytes();
  ASSERT_GT(one, 0u);
  // Room for two entries: the third decode leaves the least recently used (photo 1) out.
  o.entropy_index = std::make_shared<JpegEntropyIndex>(2 * one + one / 2);
  JpegDecoder small({}, o);
  for (const size_t i : {0u, 1u, 0u, 2u}) small.decode(photos[i].data(), photos[i].size());
  EXPECT_EQ(o.entropy_index->files(), 2u);
  EXPECT_LE(o.entropy_index->bytes(), o.entropy_index->budget_bytes());
  small.decode(photos[0].data(), photos[0].size());
  EXPECT_TRUE(small.last_entropy_stats().index_found);
  small.decode(photos[1].data(), photos[1].size());
  EXPECT_FALSE(small.last_entropy_stats().index_found);
  // Budget 0: off.
  o.entropy_index = std::make_shared<JpegEntropyIndex>(0);
  JpegDecoder off({}, o);
  for (int i = 0; i < 2; ++i) off.decode(photos[3].data(), photos[3].size());
  EXPECT_FALSE(off.last_entropy_stats().index_found);
  EXPECT_EQ(o.entropy_index->files(), 0u);
  EXPECT_EQ(o.entropy_index->bytes(), 0u);
}

// ---------------------------------------------------------------------------------------------
// The index kept in a file (JpegEntropyIndex(budget, file)).

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Decodes each file with a decoder on `index` (own decoder, a few boxes) and checks the pixels
// against libjpeg-turbo's; returns for each file whether its first decode found an entry.
std::vector<bool> decode_with(const std::shared_ptr<JpegEntropyIndex>& index,
                              const std::vector<std::vector<uint8_t>>& files) {
  DecodeOptions o;
  o.own_entropy_decoder = true;
  o.entropy_index = index;
  JpegDecoder d({}, o);
  JpegDecoder libjpeg({}, stock(o));
  SampleRng rng(35, 7, 0);
  std::vector<bool> found;
  for (const auto& file : files) {
    const JpegHeader header = libjpeg.read_header(file.data(), file.size());
    for (int trial = 0; trial < 3; ++trial) {
      const Box b = trial == 0 ? Box{0, 0, header.width, header.height, header.width, header.height}
                               : random_box(rng, header.width, header.height);
      const Outcome got = decode_box(d, file, b);
      const Outcome want = decode_box(libjpeg, file, b);
      EXPECT_TRUE(want.error.empty()) << want.error;
      EXPECT_TRUE(got == want) << got.error;
      if (trial == 0) found.push_back(got.stats.index_found);
    }
  }
  return found;
}

// An index file of `files`, each decoded whole once, the last decoded the most recently used.
std::vector<uint8_t> index_file_of(const std::vector<std::vector<uint8_t>>& files,
                                   const std::filesystem::path& path) {
  auto index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
  DecodeOptions o;
  o.own_entropy_decoder = true;
  o.entropy_index = index;
  JpegDecoder d({}, o);
  for (const auto& file : files) d.decode(file.data(), file.size());
  EXPECT_EQ(index->files(), files.size());
  index->save();
  return read_file_bytes(path);
}

// Saved, then loaded by a new index: the same entries, and the second decode of the crop parses
// only the crop's MCUs, as with the index that made them (TheSecondDecodeParsesOnlyTheCrop).
TEST(JpegEntropyIndexFile, SavedEntriesServeANewIndex) {
  testing::TempDir dir;
  const auto path = dir / "index.bin";
  const auto file = make_photo_jpeg(500, 375, 11, 90);
  const Box b{300, 230, 120, 110, 120, 110};
  DecodeOptions o;
  o.own_entropy_decoder = true;
  JpegDecoder libjpeg({}, stock(o));
  const Outcome want = decode_box(libjpeg, file, b);
  ASSERT_TRUE(want.error.empty());
  size_t bytes_held = 0;
  std::vector<uint8_t> saved;
  {
    o.entropy_index =
        std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
    EXPECT_FALSE(o.entropy_index->loaded().file_found);
    JpegDecoder d({}, o);
    EXPECT_TRUE(decode_box(d, file, b) == want);
    bytes_held = o.entropy_index->bytes();
    saved = o.entropy_index->store().serialize();
    o.entropy_index.reset();  // the destructor saves: an entry was added
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(read_file_bytes(path), saved);
  // 24 bytes of header; 40 + 96 x 12 + 8 for the photo's entry.
  EXPECT_EQ(saved.size(), 24u + 40u + 96u * 12u + 8u);
  o.entropy_index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
  const JpegEntropyIndexLoad& loaded = o.entropy_index->loaded();
  EXPECT_TRUE(loaded.file_found);
  EXPECT_FALSE(loaded.file_refused);
  EXPECT_FALSE(loaded.rest_dropped);
  EXPECT_EQ(loaded.entries_loaded, 1u);
  EXPECT_EQ(loaded.entries_refused, 0u);
  EXPECT_EQ(loaded.entries_over_budget, 0u);
  EXPECT_EQ(o.entropy_index->files(), 1u);
  EXPECT_EQ(o.entropy_index->bytes(), bytes_held);
  EXPECT_EQ(o.entropy_index->store().serialize(), saved);
  JpegDecoder d({}, o);
  const Outcome second = decode_box(d, file, b);
  EXPECT_TRUE(second == want);
  EXPECT_TRUE(second.stats.index_found);
  EXPECT_EQ(second.stats.mcus_parsed, 10u * 12u);
  // Nothing added since the load: the destructor does not write (the file removed stays so).
  std::filesystem::remove(path);
  o.entropy_index.reset();
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Small files of two entries, for the loops over every byte.
std::vector<std::vector<uint8_t>> two_small_files() {
  return {make_photo_jpeg(40, 32, 1, 90), make_photo_jpeg(48, 16, 2, 75)};
}

// The file cut at every length: a header cut short (the empty file included) refuses it whole;
// otherwise the whole entries before the cut are loaded, an entry cut short is refused and ends
// the load; the pixels never change.
TEST(JpegEntropyIndexFile, TruncatedFilesLoadTheirWholeEntries) {
  testing::TempDir dir;
  const auto files = two_small_files();
  const std::vector<uint8_t> full = index_file_of(files, dir / "full.bin");
  // 4:2:0 MCUs of 16x16: 40x32 is 3 MCUs x 2 rows (1 point a row), 48x16 3 x 1. The most
  // recently used entry (48x16's) comes first.
  const size_t first_end = 24 + 40 + 1 * 12 + 8;
  ASSERT_EQ(full.size(), first_end + 40 + 2 * 12 + 8);
  const auto path = dir / "cut.bin";
  for (size_t length = 0; length < full.size(); ++length) {
    SCOPED_TRACE("length " + std::to_string(length));
    testing::write_bytes(path, std::vector<uint8_t>(full.begin(), full.begin() + length));
    auto index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
    const JpegEntropyIndexLoad loaded = index->loaded();
    EXPECT_TRUE(loaded.file_found);
    if (length < 24) {
      EXPECT_TRUE(loaded.file_refused);
      EXPECT_NE(loaded.refusal.find(path.string()), std::string::npos) << loaded.refusal;
      EXPECT_EQ(loaded.entries_loaded + loaded.entries_refused, 0u);
    } else {
      EXPECT_FALSE(loaded.file_refused);
      const size_t whole = length >= first_end ? 1 : 0;
      const bool cut = length != 24 && length != first_end;
      EXPECT_EQ(loaded.entries_loaded, whole);
      EXPECT_EQ(loaded.entries_refused, cut ? 1u : 0u);
      EXPECT_EQ(loaded.rest_dropped, cut);
    }
    EXPECT_EQ(index->files(), loaded.entries_loaded);
    const std::vector<bool> found = decode_with(index, files);
    EXPECT_EQ(found[1], loaded.entries_loaded == 1);
    EXPECT_FALSE(found[0]);
  }
}

// Every byte of a two-entry file flipped in turn: a flip in the header refuses the file whole; one
// in an entry refuses that entry (its checksum fails), and when it made the entry's layout
// inconsistent the rest of the file is dropped; the other entry is loaded and found unless it was
// in that rest; the pixels never change.
TEST(JpegEntropyIndexFile, AFlippedByteAnywhereNeverChangesPixels) {
  testing::TempDir dir;
  const auto files = two_small_files();
  const std::vector<uint8_t> full = index_file_of(files, dir / "full.bin");
  // In the file, the most recently used entry (the second file's, 48x16) comes first.
  const size_t first_end = 24 + 40 + 12 + 8;
  ASSERT_EQ(full.size(), first_end + 40 + 2 * 12 + 8);
  const auto path = dir / "flipped.bin";
  size_t dropped = 0;
  for (size_t at = 0; at < full.size(); ++at) {
    for (const uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      SCOPED_TRACE("byte " + std::to_string(at) + " ^ " + std::to_string(mask));
      std::vector<uint8_t> bytes = full;
      bytes[at] ^= mask;
      testing::write_bytes(path, bytes);
      auto index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
      const JpegEntropyIndexLoad loaded = index->loaded();
      EXPECT_EQ(index->files(), loaded.entries_loaded);
      const std::vector<bool> found = decode_with(index, files);
      if (at < 24) {
        EXPECT_TRUE(loaded.file_refused);
        EXPECT_EQ(loaded.entries_loaded, 0u);
        EXPECT_FALSE(found[0] || found[1]);
        continue;
      }
      const bool in_first = at < first_end;
      const size_t field = at - (in_first ? 24 : first_end);
      // MCUs a row, rows (16..24), components, points a row, point count (28..40).
      const bool in_layout = (field >= 16 && field < 24) || (field >= 28 && field < 40);
      EXPECT_FALSE(loaded.file_refused);
      EXPECT_EQ(loaded.entries_refused, 1u);
      EXPECT_TRUE(!loaded.rest_dropped || in_layout);
      dropped += loaded.rest_dropped ? 1 : 0;
      const size_t other_loaded = in_first && loaded.rest_dropped ? 0 : 1;
      EXPECT_EQ(loaded.entries_loaded, other_loaded);
      // The entry flipped is never found; the other is when it was loaded.
      EXPECT_FALSE(found[in_first ? 1 : 0]);
      EXPECT_EQ(found[in_first ? 0 : 1], other_loaded == 1);
    }
  }
  EXPECT_GT(dropped, 0u);
}

// Headers of another format, version, byte order or point spacing, an empty file, a missing file
// and a directory: nothing loaded, the file refused whole (but for the missing one), pixels
// unchanged, and saving to a directory throws naming it.
TEST(JpegEntropyIndexFile, ForeignFilesAreRefusedWhole) {
  testing::TempDir dir;
  const auto files = two_small_files();
  const std::vector<uint8_t> full = index_file_of(files, dir / "full.bin");
  const auto path = dir / "foreign.bin";
  const auto refused = [&](const std::vector<uint8_t>& bytes, const std::string& what) {
    SCOPED_TRACE(what);
    testing::write_bytes(path, bytes);
    auto index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
    EXPECT_TRUE(index->loaded().file_found);
    EXPECT_TRUE(index->loaded().file_refused);
    EXPECT_NE(index->loaded().refusal.find(path.string()), std::string::npos);
    EXPECT_EQ(index->loaded().entries_loaded, 0u);
    EXPECT_EQ(index->files(), 0u);
    const std::vector<bool> found = decode_with(index, files);
    EXPECT_FALSE(found[0] || found[1]);
  };
  auto changed = [&](size_t at, std::vector<uint8_t> value) {
    std::vector<uint8_t> bytes = full;
    std::copy(value.begin(), value.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at));
    return bytes;
  };
  refused(changed(0, {'J', 'F', 'I', 'F'}), "magic");
  refused(changed(8, {2, 0, 0, 0}), "version 2");
  refused(changed(12, {1, 2, 3, 4}), "big-endian");
  refused(changed(16, {16, 0, 0, 0}), "another point spacing");
  refused(changed(20, {16, 0, 0, 0}), "another point size");
  refused({}, "empty");
  refused(std::vector<uint8_t>(full.begin(), full.begin() + 23), "a header cut short");
  {
    auto index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes,
                                                    dir / "missing.bin");
    EXPECT_FALSE(index->loaded().file_found);
    EXPECT_FALSE(index->loaded().file_refused);
    EXPECT_EQ(index->files(), 0u);
  }
  std::filesystem::create_directories(dir / "a-directory");
  auto index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes,
                                                  dir / "a-directory");
  EXPECT_TRUE(index->loaded().file_found);
  EXPECT_TRUE(index->loaded().file_refused);
  EXPECT_NE(index->loaded().refusal.find("a-directory"), std::string::npos);
  EXPECT_FALSE(decode_with(index, files)[0]);
  EXPECT_EQ(index->files(), 2u);
  try {
    index->save();
    ADD_FAILURE() << "saving over a directory must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "a-directory").string()), std::string::npos)
        << e.what();
  }
  index.reset();  // its destructor's save fails too, silently
  EXPECT_TRUE(std::filesystem::is_directory(dir / "a-directory"));
  EXPECT_TRUE(std::filesystem::is_empty(dir / "a-directory"));
  // No temporary files left beside it.
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
  EXPECT_EQ(entries, 3u);  // full.bin, foreign.bin, a-directory
}

// A budget smaller than the file: the entries that fit are loaded, the most recently used first,
// the rest counted; what is held stays within the budget.
TEST(JpegEntropyIndexFile, LoadKeepsToTheBudget) {
  testing::TempDir dir;
  std::vector<std::vector<uint8_t>> photos;
  for (uint64_t seed = 0; seed < 3; ++seed) photos.push_back(make_photo_jpeg(500, 375, seed, 90));
  const auto path = dir / "index.bin";
  index_file_of(photos, path);
  const size_t one = JpegEntropyIndex(JpegEntropyIndex::kDefaultBudgetBytes, path).bytes() / 3;
  auto index = std::make_shared<JpegEntropyIndex>(2 * one + one / 2, path);
  EXPECT_EQ(index->loaded().entries_loaded, 2u);
  EXPECT_EQ(index->loaded().entries_over_budget, 1u);
  EXPECT_EQ(index->loaded().entries_refused, 0u);
  EXPECT_LE(index->bytes(), index->budget_bytes());
  // Photo 2 was decoded last, then photo 1: they are the two loaded (decoded here first, so that
  // photo 0's new entry pushes neither out before it is looked up).
  const std::vector<bool> found = decode_with(index, {photos[2], photos[1], photos[0]});
  EXPECT_EQ(found, (std::vector<bool>{true, true, false}));
  // A budget of 0 is off: the file is neither read nor written.
  const std::vector<uint8_t> before = read_file_bytes(path);
  {
    JpegEntropyIndex off(0, path);
    EXPECT_FALSE(off.loaded().file_found);
    EXPECT_EQ(off.files(), 0u);
    off.save();
  }
  EXPECT_EQ(read_file_bytes(path), before);
}

// Two indexes saving to the same file at once, over and over: the file is always one of them
// whole, never torn (each save writes its own file and renames it over the path).
TEST(JpegEntropyIndexFile, ConcurrentSavesNeverTearTheFile) {
  testing::TempDir dir;
  const auto files = two_small_files();
  const auto path = dir / "shared.bin";
  auto one = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
  auto both = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
  decode_with(one, {files[0]});
  decode_with(both, files);
  std::atomic<bool> stop{false};
  std::vector<std::thread> savers;
  for (const auto& index : {one, both}) {
    savers.emplace_back([&stop, index] {
      for (int i = 0; i < 5000 && !stop; ++i) index->save();
    });
  }
  // The first save's rename, waited for with a bound.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::set<size_t> seen;
  for (int loads = 0; loads < 200; ++loads) {
    const JpegEntropyIndex reader(JpegEntropyIndex::kDefaultBudgetBytes, path);
    const JpegEntropyIndexLoad& loaded = reader.loaded();
    EXPECT_TRUE(loaded.file_found);
    EXPECT_FALSE(loaded.file_refused) << loaded.refusal;
    EXPECT_FALSE(loaded.rest_dropped);
    EXPECT_EQ(loaded.entries_refused, 0u);
    EXPECT_TRUE(loaded.entries_loaded == 1 || loaded.entries_loaded == 2);
    seen.insert(loaded.entries_loaded);
  }
  stop = true;
  for (auto& t : savers) t.join();
  EXPECT_FALSE(seen.empty());
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

// A save that fails leaves the old file as it was, and names the path and the reason.
TEST(JpegEntropyIndexFile, AFailedSaveLeavesTheOldFile) {
  testing::TempDir dir;
  const auto files = two_small_files();
  // A name of 250 characters: the file can exist, but a temporary name beside it is too long.
  const auto path = dir / std::string(250, 'i');
  const std::vector<uint8_t> old = index_file_of({files[0]}, dir / "one.bin");
  testing::write_bytes(path, old);
  auto index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes, path);
  EXPECT_EQ(index->loaded().entries_loaded, 1u);
  decode_with(index, files);
  EXPECT_EQ(index->files(), 2u);
  try {
    index->save();
    ADD_FAILURE() << "the save must fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENAMETOOLONG)), std::string::npos)
        << e.what();
  }
  index.reset();
  EXPECT_EQ(read_file_bytes(path), old);
  // An unwritable directory (only where permissions bind: not for root).
  if (::geteuid() != 0) {
    const auto locked = dir / "locked";
    const auto inside = locked / "index.bin";
    testing::write_bytes(inside, old);
    std::filesystem::permissions(
        locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    JpegEntropyIndex second(JpegEntropyIndex::kDefaultBudgetBytes, inside);
    decode_with(std::shared_ptr<JpegEntropyIndex>(&second, [](JpegEntropyIndex*) {}), files);
    EXPECT_THROW(second.save(), std::runtime_error);
    EXPECT_EQ(read_file_bytes(inside), old);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  }
}

}  // namespace
}  // namespace conveyor
