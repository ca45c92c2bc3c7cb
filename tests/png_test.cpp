// PNG through the codec seam (issue 32): a generated corpus of every colour type, bit depth and
// interlacing at odd sizes from 1x1 (tests/png_writer.h), decoded by ImageWriter, equals libpng's
// full decode then the project's own crop, resize and flip byte for byte, for many random
// (seed, index) crops; a header that promises a huge image, truncated and corrupt files are clear
// errors; an ImageFolder holding a PNG named .JPEG among JPEGs reads every file, and a GIF or a
// TIFF in it is an error naming the file and the format, or a counted skip. The libdeflate path of
// non-interlaced files (PngScanlines) gives libspng's rows on every kind, size and chunk layout,
// refuses each damage it must, and the decoder then gives what libspng alone gives.
#include <gtest/gtest.h>
#include <spng.h>

#include <array>
#include <csetjmp>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codec/image_codec.h"
#include "codec/png_scanlines.h"
#include "image_writer_checks.h"
#include "png_reference.h"
#include "png_writer.h"
#include "test_support.h"

namespace conveyor {
namespace {

using testing::error_of;
using testing::expected_row;
using testing::make_png;
using testing::PngFile;
using testing::PngSpec;
using testing::Reference;
using testing::reference_of;
using testing::TempDir;
using testing::write_bytes;

// Every kind at odd sizes, interlaced or not, with and without tRNS.
std::vector<PngFile> corpus() {
  const int sizes[][2] = {{1, 1}, {1, 7}, {9, 1}, {5, 3}, {17, 13}, {33, 31}, {64, 41}};
  return testing::png_corpus(sizes, 3);
}

TEST(PngImageWriter, EveryKindMatchesLibpngThenTheSameCropResizeAndFlip) {
  const std::vector<PngFile> files = corpus();
  ASSERT_EQ(files.size(), 15u * 7 * 2);
  std::vector<ImageWriter> writers = testing::checked_writers();
  testing::RowCounts counts;
  for (const PngFile& f : files) {
    const Reference ref = reference_of(f);
    ASSERT_EQ(ref.width, f.spec.width);
    ASSERT_NO_FATAL_FAILURE(
        testing::expect_rows_match(writers, f.bytes, ref, 6, 11, describe(f.spec), counts));
  }
  EXPECT_EQ(counts.compared, files.size() * 18);
  EXPECT_GT(counts.flipped, counts.compared / 8);
}

// The region decode itself is exact: every region of a full decode, at full size (no scaling).
TEST(PngDecoder, RegionsAreThoseOfTheFullDecode) {
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  ASSERT_NE(d, nullptr);
  std::mt19937 rng(7);
  for (const PngFile& f : corpus()) {
    const Reference ref = reference_of(f);
    for (int k = 0; k < 4; ++k) {
      const int x = static_cast<int>(rng() % f.spec.width);
      const int y = static_cast<int>(rng() % f.spec.height);
      const int w = 1 + static_cast<int>(rng() % (f.spec.width - x));
      const int h = 1 + static_cast<int>(rng() % (f.spec.height - y));
      const detail::ImageInfo info = d->begin(f.bytes.data(), f.bytes.size());
      EXPECT_EQ(info.width, f.spec.width);
      EXPECT_EQ(info.height, f.spec.height);
      EXPECT_EQ(info.bit_depth, f.spec.bit_depth);
      EXPECT_EQ(info.channels,
                testing::png_channels(f.spec.color_type) == 1 && f.spec.color_type == 3
                    ? 3
                    : testing::png_channels(f.spec.color_type));
      const DecodedImage image = d->finish_region(x, y, w, h, w, h);
      ASSERT_NO_FATAL_FAILURE(testing::expect_region_of(ref, image, x, y, w, h, describe(f.spec)));
    }
  }
}

// The samples mode (masks) returns the file's own samples for every gray and palette kind, 1 to
// 16 bits, interlaced or not, in random regions: the samples png_writer.h wrote (with zlib alone),
// not a libspng decode. (libspng 0.7.3's own Adam7 placement was wrong below 8 bits.)
TEST(PngDecoder, SamplesAreTheFilesOwnForEveryOneChannelKind) {
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  std::mt19937 rng(11);
  size_t compared = 0;
  for (PngSpec kind : testing::every_png_kind()) {
    if (kind.color_type != 0 && kind.color_type != 3) continue;
    for (int k = 0; k < 24; ++k) {
      PngSpec s = kind;
      s.width = 1 + static_cast<int>(rng() % 70);
      s.height = 1 + static_cast<int>(rng() % 40);
      s.interlaced = k % 2 == 1;
      const PngFile f = make_png(s, 500 + k);
      const int x = static_cast<int>(rng() % s.width);
      const int y = static_cast<int>(rng() % s.height);
      const int w = 1 + static_cast<int>(rng() % (s.width - x));
      const int h = 1 + static_cast<int>(rng() % (s.height - y));
      d->begin(f.bytes.data(), f.bytes.size());
      const detail::SampleRegion region = d->finish_samples(x, y, w, h);
      ASSERT_EQ(region.width, w);
      ASSERT_EQ(region.height, h);
      ASSERT_EQ(region.bit_depth, s.bit_depth);
      for (int r = 0; r < h; ++r) {
        for (int c = 0; c < w; ++c) {
          const uint8_t* at = region.samples + static_cast<size_t>(r) * region.stride;
          uint16_t got = at[c];
          if (s.bit_depth == 16) std::memcpy(&got, at + 2 * c, sizeof got);
          ASSERT_EQ(got, f.samples[static_cast<size_t>(y + r) * s.width + x + c])
              << describe(s) << " region " << x << "," << y << " " << w << "x" << h << " at " << c
              << "," << r;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 9u * 24 * 20);
}

// 16-bit samples become the nearest 8-bit value (Pillow clips 16-bit gray to 255 instead).
TEST(PngDecoder, SixteenBitSamplesAreRoundedToTheNearestEightBitValue) {
  PngSpec s;
  s.width = 6;
  s.height = 1;
  s.color_type = 0;
  s.bit_depth = 16;
  const PngFile f = make_png(s, 1);  // its signature and IHDR; the data is written here
  const uint16_t values[6] = {0, 128, 129, 257, 32896, 65535};
  std::vector<uint8_t> filtered = {0};
  for (uint16_t v : values) {
    filtered.push_back(static_cast<uint8_t>(v >> 8));
    filtered.push_back(static_cast<uint8_t>(v));
  }
  uLongf size = compressBound(static_cast<uLong>(filtered.size()));
  std::vector<uint8_t> idat(size);
  ASSERT_EQ(compress2(idat.data(), &size, filtered.data(), static_cast<uLong>(filtered.size()), 6),
            Z_OK);
  idat.resize(size);
  std::vector<uint8_t> file(f.bytes.begin(), f.bytes.begin() + 33);  // signature + IHDR
  testing::png_detail::chunk(file, "IDAT", idat);
  testing::png_detail::chunk(file, "IEND", {});
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  d->begin(file.data(), file.size());
  const DecodedImage image = d->finish_region(0, 0, 6, 1, 6, 1);
  const uint8_t expected[6] = {0, 0, 1, 1, 128, 255};
  for (int i = 0; i < 6; ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(image.pixels[i * 3 + c], expected[i]) << values[i];
  }
}

TEST(PngImageWriter, AHugeDeclaredSizeIsRefusedBeforeDecoding) {
  ImageWriter writer(ImageTransform::train(8));
  const std::string huge = error_of(writer, testing::png_declaring(200000, 100000));
  EXPECT_NE(huge.find("PNG rejected: 200000x100000 = 20000000000 pixels exceeds the limit of "
                      "100000000"),
            std::string::npos)
      << huge;
  // Under the limit, but far more rows than its few bytes can hold: refused before any buffer of
  // the declared size is allocated.
  const std::string short_file = error_of(writer, testing::png_declaring(9000, 9000));
  EXPECT_NE(short_file.find("cannot hold a 9000x9000 image"), std::string::npos) << short_file;
  ImageTransform small = ImageTransform::train(8);
  small.limits.max_pixels = 100;
  ImageWriter strict(small);
  PngSpec s;
  s.width = 11;
  s.height = 10;
  EXPECT_NE(error_of(strict, make_png(s, 1).bytes).find("110 pixels exceeds the limit of 100"),
            std::string::npos);
  s.width = 10;
  EXPECT_EQ(error_of(strict, make_png(s, 1).bytes), "");
}

// Cut anywhere before the end of its last IDAT chunk, a file decoded whole (kResize) is an error,
// never a crash or a partly grey image; so is any byte of its header or data changed (CRC).
TEST(PngImageWriter, TruncatedAndCorruptFilesAreClearErrors) {
  ImageTransform whole = ImageTransform::train(8);
  whole.mode = ImageTransform::Mode::kResize;
  ImageWriter writer(whole);
  for (bool interlaced : {false, true}) {
    PngSpec s;
    s.width = 23;
    s.height = 19;
    s.interlaced = interlaced;
    const std::vector<uint8_t> file = make_png(s, 5).bytes;
    const size_t data_end = file.size() - 12;  // IEND is the last 12 bytes
    for (size_t cut = 0; cut < data_end; cut += 3) {
      const std::vector<uint8_t> truncated(file.begin(), file.begin() + static_cast<long>(cut));
      EXPECT_NE(error_of(writer, truncated), "") << describe(s) << " cut at " << cut;
    }
    for (size_t at = 8; at < data_end; at += 5) {
      std::vector<uint8_t> corrupt = file;
      corrupt[at] ^= 0x5A;
      EXPECT_NE(error_of(writer, corrupt), "") << describe(s) << " byte " << at;
    }
    EXPECT_EQ(error_of(writer, file), "");
  }
}

// Non-interlaced rows are decoded only down to the region's last: a file cut below it still
// gives the region, and the whole image is an error.
TEST(PngDecoder, RowsBelowTheRegionAreNotDecoded) {
  PngSpec s;
  s.width = 64;
  s.height = 64;
  const PngFile f = make_png(s, 3);
  const Reference ref = reference_of(f);
  const std::vector<uint8_t> cut(f.bytes.begin(),
                                 f.bytes.begin() + static_cast<long>(f.bytes.size() * 3 / 4));
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  d->begin(cut.data(), cut.size());
  const DecodedImage top = d->finish_region(10, 2, 20, 6, 20, 6);
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 20; ++c) {
      for (int ch = 0; ch < 3; ++ch) {
        ASSERT_EQ(top.pixels[r * top.stride + c * 3 + ch],
                  ref.rgbx[((2 + r) * 64 + 10 + c) * 4 + ch]);
      }
    }
  }
  d->begin(cut.data(), cut.size());
  EXPECT_THROW(d->finish_region(0, 0, 64, 64, 64, 64), detail::ImageDecodeError);
}

// PngScanlines (codec/png_scanlines.h), the libdeflate path of non-interlaced files, against
// libspng alone. What libspng gives is taken from libspng itself, as PngDecoder used it before
// PngScanlines: rows in order down to the region's last, then the chunks after the image data
// when the region reaches the last row.
struct SpngCtx {
  explicit SpngCtx(const std::vector<uint8_t>& file) : ctx(spng_ctx_new(0)) {
    ok = ctx != nullptr && spng_set_png_buffer(ctx, file.data(), file.size()) == 0 &&
         spng_get_ihdr(ctx, &ihdr) == 0;
  }
  ~SpngCtx() { spng_ctx_free(ctx); }
  SpngCtx(const SpngCtx&) = delete;
  SpngCtx& operator=(const SpngCtx&) = delete;
  spng_ctx* ctx;
  spng_ihdr ihdr{};
  bool ok = false;
};

// libspng's whole decode of `file` in `format` (SPNG_FMT_RAW: the rows as stored, unfiltered);
// empty where libspng refuses the file.
std::vector<uint8_t> spng_whole(const std::vector<uint8_t>& file, int format, int flags) {
  SpngCtx s(file);
  size_t size = 0;
  if (!s.ok || spng_decoded_image_size(s.ctx, format, &size) != 0) return {};
  std::vector<uint8_t> out(size);
  if (spng_decode_image(s.ctx, out.data(), size, format, flags) != 0) return {};
  return out;
}

// Rows y .. y + h - 1 of `file` in `format` as libspng's progressive decode gives them (see
// above); nullopt where libspng refuses them.
std::optional<std::vector<uint8_t>> spng_rows(const std::vector<uint8_t>& file, int format,
                                              int flags, int y, int h) {
  SpngCtx s(file);
  size_t size = 0;
  if (!s.ok || spng_decoded_image_size(s.ctx, format, &size) != 0) return std::nullopt;
  const size_t row = size / s.ihdr.height;
  if (spng_decode_image(s.ctx, nullptr, 0, format, SPNG_DECODE_PROGRESSIVE | flags) != 0) {
    return std::nullopt;
  }
  std::vector<uint8_t> out(row * static_cast<size_t>(h)), scratch(row);
  const int full_h = static_cast<int>(s.ihdr.height);
  for (int r = 0; r < y + h; ++r) {
    uint8_t* to = r < y ? scratch.data() : out.data() + static_cast<size_t>(r - y) * row;
    const int status = spng_decode_row(s.ctx, to, row);
    if (status != 0 && !(status == SPNG_EOI && r == full_h - 1)) return std::nullopt;
  }
  if (y + h == full_h && spng_decode_chunks(s.ctx) != 0) return std::nullopt;
  return out;
}

// Sample i of a row stored as SPNG_FMT_RAW gives it (packed below 8 bits, big-endian at 16).
uint16_t raw_sample(const uint8_t* row, size_t i, int depth) {
  if (depth == 16) return static_cast<uint16_t>(row[2 * i] << 8 | row[2 * i + 1]);
  if (depth == 8) return row[i];
  const size_t bit = i * static_cast<size_t>(depth);
  return static_cast<uint16_t>((row[bit / 8] >> (8 - depth - bit % 8)) & ((1 << depth) - 1));
}

detail::PngRowLayout row_layout(const PngSpec& s) {
  detail::PngRowLayout layout;
  layout.width = static_cast<uint32_t>(s.width);
  layout.height = static_cast<uint32_t>(s.height);
  layout.bits_per_pixel = testing::png_channels(s.color_type) * s.bit_depth;
  return layout;
}

// A random non-interlaced PngSpec: any colour type and bit depth, 1..70 x 1..40 (a width of 1
// one time in eight), a tRNS chunk half the time where the colour type takes one.
PngSpec random_spec(std::mt19937& rng) {
  static const std::vector<PngSpec> kinds = testing::every_png_kind();
  PngSpec s = kinds[rng() % kinds.size()];
  s.width = rng() % 8 == 0 ? 1 : 1 + static_cast<int>(rng() % 70);
  s.height = 1 + static_cast<int>(rng() % 40);
  s.transparency = rng() % 2 == 0 && s.color_type != 4 && s.color_type != 6;
  return s;
}

// Every kind, size and chunk layout: PngScanlines reads the file, and its rows are libspng's
// own (SPNG_FMT_RAW) byte for byte. One PngScanlines reads every file, as a decoder reuses it.
TEST(PngScanlines, RowsAreLibspngsForEveryKindSizeAndChunkLayout) {
  std::mt19937 rng(32);
  detail::PngScanlines scanlines;
  size_t files = 0, many_idats = 0;
  std::set<std::pair<int, int>> kinds;  // (colour type, bit depth) read
  for (int k = 0; k < 160; ++k) {
    const PngSpec s = random_spec(rng);
    kinds.insert({s.color_type, s.bit_depth});
    const PngFile f = make_png(s, 1000 + static_cast<uint64_t>(k));
    testing::PngLayout one, split, empties;
    split.idat_max = 1 + rng() % 7;
    split.text_before = rng() % 2 == 0;
    split.text_after = rng() % 2 == 0;
    empties.idat_max = 1 + rng() % 64;
    empties.empty_idats = 1 + static_cast<int>(rng() % 4);
    empties.text_before = !split.text_before;
    empties.text_after = !split.text_after;
    const std::vector<std::vector<uint8_t>> variants = {
        f.bytes, testing::png_with_layout(f.bytes, one, rng()),
        testing::png_with_layout(f.bytes, split, rng()),
        testing::png_with_layout(f.bytes, empties, rng())};
    for (const std::vector<uint8_t>& file : variants) {
      const std::vector<uint8_t> expected = spng_whole(file, SPNG_FMT_RAW, 0);
      ASSERT_FALSE(expected.empty()) << describe(s);
      const char* refused = scanlines.read(file.data(), file.size(), row_layout(s));
      ASSERT_EQ(refused, nullptr) << describe(s) << ": " << refused;
      ASSERT_TRUE(scanlines.unfilter_through(static_cast<uint32_t>(s.height - 1))) << describe(s);
      const size_t row = expected.size() / static_cast<size_t>(s.height);
      ASSERT_EQ(scanlines.row_bytes(), row) << describe(s);
      for (int r = 0; r < s.height; ++r) {
        const uint8_t* want = expected.data() + static_cast<size_t>(r) * row;
        ASSERT_EQ(std::vector<uint8_t>(scanlines.row(r), scanlines.row(r) + row),
                  std::vector<uint8_t>(want, want + row))
            << describe(s) << " row " << r;
      }
      // The samples are the ones png_writer.h wrote.
      const int channels = testing::png_channels(s.color_type);
      for (int r = 0; r < s.height; r += 7) {
        for (size_t i = 0; i < static_cast<size_t>(s.width * channels); ++i) {
          ASSERT_EQ(raw_sample(scanlines.row(r), i, s.bit_depth),
                    f.samples[static_cast<size_t>(r) * s.width * channels + i])
              << describe(s) << " row " << r << " sample " << i;
        }
      }
      many_idats += testing::png_chunks(file).size() > 8;
      ++files;
    }
  }
  EXPECT_EQ(files, 160u * 4);
  EXPECT_EQ(kinds.size(), testing::every_png_kind().size());
  EXPECT_GT(many_idats, 160u);
}

// A file PngScanlines refuses, and why it must: `make` damages a good file (many IDATs, a tEXt
// chunk after them), which read() refuses with `reason`; `filter_row` >= 0 where the damage is a
// bad filter byte on that row (libspng decodes the rows above the one before it).
struct Damage {
  std::string name;
  std::string reason;  // what read() says (a part of it)
  std::function<std::vector<uint8_t>(const PngFile&)> make;
  int filter_row = -1;
};

// The good file the damages start from: the writer's, its stream in IDATs of 1..24 bytes, with a
// tEXt chunk after them.
std::vector<testing::PngChunk> good_chunks(const PngFile& f) {
  testing::PngLayout layout;
  layout.idat_max = 24;
  layout.text_after = true;
  return testing::png_chunks(testing::png_with_layout(f.bytes, layout, 5));
}

// The offset in `file` of the `n`th chunk of `type` (n < 0: counted from the last).
size_t chunk_offset(const std::vector<uint8_t>& file, const char* type, int n) {
  std::vector<size_t> found;
  const std::vector<testing::PngChunk> chunks = testing::png_chunks(file);
  size_t at = 8;
  for (const testing::PngChunk& c : chunks) {
    if (c.type == type) found.push_back(at);
    at += 12 + c.data.size();
  }
  if (found.empty()) throw std::runtime_error(std::string("no ") + type + " chunk");
  return found[n < 0 ? found.size() - static_cast<size_t>(-n) : static_cast<size_t>(n)];
}

// The good file with the last byte of a chunk's CRC changed.
std::vector<uint8_t> bad_crc(const PngFile& f, const char* type, int n) {
  std::vector<uint8_t> file = testing::png_of_chunks(good_chunks(f));
  const size_t at = chunk_offset(file, type, n);
  const size_t length = size_t{file[at]} << 24 | size_t{file[at + 1]} << 16 |
                        size_t{file[at + 2]} << 8 | size_t{file[at + 3]};
  file[at + 8 + length + 3] ^= 0x01;
  return file;
}

// The good file with its zlib stream (joined from the IDATs) changed by `change`, then cut into
// IDATs again, every CRC right.
std::vector<uint8_t> with_stream(const PngFile& f,
                                 const std::function<void(std::vector<uint8_t>&)>& change) {
  std::vector<testing::PngChunk> chunks = good_chunks(f), out;
  std::vector<uint8_t> stream;
  for (const testing::PngChunk& c : chunks) {
    if (c.type == "IDAT") stream.insert(stream.end(), c.data.begin(), c.data.end());
  }
  change(stream);
  bool placed = false;
  for (testing::PngChunk& c : chunks) {
    if (c.type != "IDAT") {
      out.push_back(std::move(c));
    } else if (!placed) {
      for (size_t at = 0; at < stream.size(); at += 24) {
        const size_t n = std::min<size_t>(24, stream.size() - at);
        out.push_back({"IDAT", std::vector<uint8_t>(stream.begin() + static_cast<long>(at),
                                                    stream.begin() + static_cast<long>(at + n))});
      }
      placed = true;
    }
  }
  return testing::png_of_chunks(out);
}

// The good file with its filtered rows (inflated) changed by `change`, deflated again.
std::vector<uint8_t> with_rows(const PngFile& f,
                               const std::function<void(std::vector<uint8_t>&)>& change) {
  return with_stream(f, [&](std::vector<uint8_t>& stream) {
    const detail::PngRowLayout l = row_layout(f.spec);
    uLongf size =
        ((uLongf{l.width} * static_cast<uLongf>(l.bits_per_pixel) + 7) / 8 + 1) * l.height;
    std::vector<uint8_t> rows(size);
    if (uncompress(rows.data(), &size, stream.data(), static_cast<uLong>(stream.size())) != Z_OK ||
        size != rows.size()) {
      throw std::runtime_error("with_rows: the stream does not inflate");
    }
    change(rows);
    uLongf packed = compressBound(static_cast<uLong>(rows.size()));
    stream.resize(packed);
    if (compress2(stream.data(), &packed, rows.data(), static_cast<uLong>(rows.size()), 6) !=
        Z_OK) {
      throw std::runtime_error("with_rows: compress2 failed");
    }
    stream.resize(packed);
  });
}

std::vector<Damage> damages(int height) {
  using Chunks = std::vector<testing::PngChunk>;
  auto edit = [](std::function<void(Chunks&)> change) {
    return [change](const PngFile& f) {
      Chunks chunks = good_chunks(f);
      change(chunks);
      return testing::png_of_chunks(chunks);
    };
  };
  auto idat_index = [](const Chunks& chunks, bool last) {
    size_t found = chunks.size();
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].type == "IDAT" && (found == chunks.size() || last)) found = i;
    }
    return found;
  };
  const int row = height / 2;
  return {
      {"a bad CRC in the first IDAT", "CRC",
       [](const PngFile& f) { return bad_crc(f, "IDAT", 0); }},
      {"a bad CRC in the last IDAT", "CRC",
       [](const PngFile& f) { return bad_crc(f, "IDAT", -1); }},
      {"a bad CRC in the tEXt after the IDATs", "CRC",
       [](const PngFile& f) { return bad_crc(f, "tEXt", -1); }},
      {"a bad CRC in IEND", "CRC", [](const PngFile& f) { return bad_crc(f, "IEND", 0); }},
      {"the last IDAT's length past the end", "past the file's end",
       [](const PngFile& f) {
         std::vector<uint8_t> file = testing::png_of_chunks(good_chunks(f));
         const size_t at = chunk_offset(file, "IDAT", -1);
         file[at] = 0x00;
         file[at + 1] = 0x10;  // 1 MiB and more
         return file;
       }},
      {"IEND's length past the end", "past the file's end",
       [](const PngFile& f) {
         std::vector<uint8_t> file = testing::png_of_chunks(good_chunks(f));
         file[chunk_offset(file, "IEND", 0) + 3] = 1;
         return file;
       }},
      {"IDATs separated by a tEXt", "not consecutive", edit([idat_index](Chunks& c) {
         const size_t first = idat_index(c, false), last = idat_index(c, true);
         const std::string text = std::string("Comment") + '\0' + "between";
         c.insert(c.begin() + static_cast<long>((first + last + 1) / 2),
                  {"tEXt", std::vector<uint8_t>(text.begin(), text.end())});
       })},
      {"no IEND", "no IEND", edit([](Chunks& c) { c.pop_back(); })},
      {"an unknown critical chunk after the IDATs", "critical chunk", edit([](Chunks& c) {
         c.insert(c.end() - 1, {"ABCD", {1, 2, 3}});
       })},
      {"a second IHDR after the IDATs", "critical chunk",
       edit([](Chunks& c) { c.insert(c.end() - 1, c.front()); })},
      {"a chunk type of digits after the IDATs", "not letters", edit([](Chunks& c) {
         c.insert(c.end() - 1, {"t3Xt", {1}});
       })},
      {"no IDAT", "no IDAT", edit([](Chunks& c) {
         c.erase(std::remove_if(c.begin(), c.end(), [](const auto& k) { return k.type == "IDAT"; }),
                 c.end());
       })},
      {"the stream one byte short", "do not inflate",
       [](const PngFile& f) { return with_stream(f, [](auto& s) { s.pop_back(); }); }},
      {"a byte after the stream", "data after",
       [](const PngFile& f) { return with_stream(f, [](auto& s) { s.push_back(0); }); }},
      {"a wrong Adler-32", "do not inflate",
       [](const PngFile& f) { return with_stream(f, [](auto& s) { s.back() ^= 0x01; }); }},
      {"the rows one byte short", "do not inflate",
       [](const PngFile& f) { return with_rows(f, [](auto& rows) { rows.pop_back(); }); }},
      {"the rows one byte long", "do not inflate",
       [](const PngFile& f) { return with_rows(f, [](auto& rows) { rows.push_back(0); }); }},
      {"a filter byte of 5 halfway down", "filter byte",
       [row](const PngFile& f) {
         return with_rows(f, [&](auto& rows) {
           rows[static_cast<size_t>(row) * (rows.size() / f.spec.height)] = 5;
         });
       },
       row},
  };
}

// A PNG decoder of `channels` (3: RGB, 4: RGBX) with the default limits.
std::unique_ptr<detail::ImageDecoder> png_decoder(int channels) {
  DecodeOptions options;
  options.channels = channels;
  return detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, options);
}

// Each damage PngScanlines must refuse is refused, and the decoder then gives what libspng
// alone gives (finish_region with 3 and 4 channels, finish_rgba, finish_samples for gray and
// palette): the same pixels where libspng decodes the region (damage at or below it), an
// ImageDecodeError where it does not.
TEST(PngScanlines, DamageIsRefusedAndTheDecoderGivesWhatLibspngGives) {
  std::vector<PngSpec> bases;
  auto base = [&](int type, int depth, int w, int h, bool trns) {
    PngSpec s;
    s.color_type = type;
    s.bit_depth = depth;
    s.width = w;
    s.height = h;
    s.transparency = trns;
    bases.push_back(s);
  };
  base(2, 8, 29, 21, false);
  base(6, 8, 17, 13, false);
  base(0, 8, 23, 9, true);
  base(4, 8, 11, 16, false);
  base(0, 2, 31, 9, false);
  base(3, 4, 19, 11, false);
  base(0, 16, 13, 7, false);
  detail::PngScanlines scanlines;
  std::unique_ptr<detail::ImageDecoder> rgb = png_decoder(3), rgba = png_decoder(4);
  std::mt19937 rng(3);
  size_t cases = 0, regions = 0, decoded = 0, refused = 0, read_ahead = 0;
  for (const PngSpec& s : bases) {
    const PngFile f = make_png(s, 77);
    for (const Damage& damage : damages(s.height)) {
      const std::string what = describe(s) + ", " + damage.name;
      const std::vector<uint8_t> file = damage.make(f);
      const char* reason = scanlines.read(file.data(), file.size(), row_layout(s));
      ASSERT_NE(reason, nullptr) << what;
      EXPECT_NE(std::string(reason).find(damage.reason), std::string::npos)
          << what << ": " << reason;
      ++cases;
      // The first row, the whole image, the rows down to the damage, and random regions.
      std::vector<std::array<int, 4>> boxes = {{0, 0, s.width, 1}, {0, 0, s.width, s.height}};
      for (int h = damage.filter_row - 1; h <= damage.filter_row + 1; ++h) {
        if (h > 0) boxes.push_back({0, 0, s.width, h});
      }
      for (int k = 0; k < 3; ++k) {
        const int x = static_cast<int>(rng() % s.width), y = static_cast<int>(rng() % s.height);
        boxes.push_back({x, y, 1 + static_cast<int>(rng() % (s.width - x)),
                         1 + static_cast<int>(rng() % (s.height - y))});
      }
      for (const auto& [x, y, w, h] : boxes) {
        const std::string box = what + ", region " + std::to_string(x) + "," + std::to_string(y) +
                                " " + std::to_string(w) + "x" + std::to_string(h);
        ++regions;
        // libspng reads one row ahead: it refuses the rows just above a bad filter byte. The
        // file goes to libspng (PngScanlines checks every row's filter byte), so the decoder does
        // too: `ahead` counts those regions.
        const bool ahead = y + h == damage.filter_row;
        auto expected = [&](int format, int flags, bool) {
          std::optional<std::vector<uint8_t>> rows = spng_rows(file, format, flags, y, h);
          if (ahead) {
            EXPECT_FALSE(rows.has_value()) << box << ": libspng no longer reads ahead";
            ++read_ahead;
          }
          return rows;
        };
        if (s.color_type == 0 || s.color_type == 3) {
          const std::optional<std::vector<uint8_t>> want = expected(SPNG_FMT_RAW, 0, true);
          rgb->begin(file.data(), file.size());
          if (!want) {
            EXPECT_THROW(rgb->finish_samples(x, y, w, h), detail::ImageDecodeError) << box;
          } else {
            const detail::SampleRegion got = rgb->finish_samples(x, y, w, h);
            const size_t row = want->size() / static_cast<size_t>(h);
            for (int r = 0; r < h; ++r) {
              for (int c = 0; c < w; ++c) {
                const uint8_t* at = got.samples + static_cast<size_t>(r) * got.stride;
                uint16_t v = at[c];
                if (s.bit_depth == 16) std::memcpy(&v, at + 2 * c, sizeof v);
                ASSERT_EQ(
                    v, raw_sample(want->data() + r * row, static_cast<size_t>(x + c), s.bit_depth))
                    << box << " samples at " << c << "," << r;
              }
            }
          }
        }
        if (s.bit_depth == 16) continue;  // libspng's RGB8 of 16 bits is not the decoder's rounding
        for (int mode = 0; mode < 3; ++mode) {
          // finish_region with 3 channels, with 4, and finish_rgba (the tRNS chunk applied).
          const int channels = mode == 0 ? 3 : 4;
          const bool fast = s.bit_depth == 8 && s.color_type != 3 && !(mode == 2 && s.transparency);
          const std::optional<std::vector<uint8_t>> want =
              expected(channels == 3 ? SPNG_FMT_RGB8 : SPNG_FMT_RGBA8,
                       mode == 2 ? SPNG_DECODE_TRNS : 0, fast);
          detail::ImageDecoder& d = channels == 3 ? *rgb : *rgba;
          d.begin(file.data(), file.size());
          if (!want) {
            if (mode == 2) {
              EXPECT_THROW(d.finish_rgba(x, y, w, h, w, h, false), detail::ImageDecodeError)
                  << box << " (finish_rgba)";
            } else {
              EXPECT_THROW(d.finish_region(x, y, w, h, w, h), detail::ImageDecodeError)
                  << box << " (" << channels << " channels)";
            }
            ++refused;
            continue;
          }
          const uint8_t* pixels;
          size_t stride;
          if (mode == 2) {
            const detail::RgbaRegion got = d.finish_rgba(x, y, w, h, w, h, false);
            pixels = got.pixels;
            stride = got.stride;
          } else {
            const DecodedImage got = d.finish_region(x, y, w, h, w, h);
            pixels = got.pixels;
            stride = got.stride;
          }
          const size_t row = static_cast<size_t>(s.width) * static_cast<size_t>(channels);
          for (int r = 0; r < h; ++r) {
            const uint8_t* from = want->data() + r * row + static_cast<size_t>(x) * channels;
            ASSERT_EQ(std::vector<uint8_t>(pixels + r * stride, pixels + r * stride + w * channels),
                      std::vector<uint8_t>(from, from + w * channels))
                << box << " mode " << mode << " row " << r;
          }
          ++decoded;
        }
      }
    }
  }
  EXPECT_EQ(cases, bases.size() * 18);
  EXPECT_GT(decoded, regions);  // most regions above the damage decode
  EXPECT_GT(refused, cases);    // and every damage refuses some region
  // The rows down to the one above the bad filter byte, refused as libspng refuses them: the
  // samples of 4 bases, the regions of 4 8-bit bases in 3 modes (and random regions that end
  // there).
  EXPECT_GE(read_ahead, 4u + 4 * 3);
}

// The decoder's pixels equal libspng's full decode for the kinds the libdeflate path converts
// (8-bit gray, gray + alpha, RGB, RGBA) with 3 and 4 channels, and finish_rgba's equal libspng's
// with the tRNS chunk applied (those files go to libspng), in random regions of files of random
// chunk layouts.
TEST(PngScanlines, DecodedPixelsAreLibspngsForEveryEightBitKind) {
  std::mt19937 rng(9);
  std::unique_ptr<detail::ImageDecoder> rgb = png_decoder(3), rgba = png_decoder(4);
  size_t compared = 0, with_trns = 0;
  const int types[] = {0, 2, 4, 6, 3};
  for (int k = 0; k < 100; ++k) {
    PngSpec s;
    s.color_type = types[k % 5];
    s.width = 1 + static_cast<int>(rng() % 70);
    s.height = 1 + static_cast<int>(rng() % 40);
    s.transparency = (s.color_type == 0 || s.color_type == 2 || s.color_type == 3) && k % 2 == 0;
    testing::PngLayout layout;
    layout.idat_max = rng() % 3 == 0 ? 0 : 1 + rng() % 40;
    layout.empty_idats = static_cast<int>(rng() % 3);
    layout.text_after = rng() % 2 == 0;
    const std::vector<uint8_t> file =
        testing::png_with_layout(make_png(s, 3000 + static_cast<uint64_t>(k)).bytes, layout, rng());
    for (int mode = 0; mode < 3; ++mode) {
      const int channels = mode == 0 ? 3 : 4;
      const std::vector<uint8_t> want = spng_whole(
          file, channels == 3 ? SPNG_FMT_RGB8 : SPNG_FMT_RGBA8, mode == 2 ? SPNG_DECODE_TRNS : 0);
      ASSERT_FALSE(want.empty()) << describe(s);
      detail::ImageDecoder& d = channels == 3 ? *rgb : *rgba;
      for (int n = 0; n < 3; ++n) {
        const int x = static_cast<int>(rng() % s.width), y = static_cast<int>(rng() % s.height);
        const int w = 1 + static_cast<int>(rng() % (s.width - x));
        const int h = 1 + static_cast<int>(rng() % (s.height - y));
        d.begin(file.data(), file.size());
        const uint8_t* pixels;
        size_t stride;
        if (mode == 2) {
          const detail::RgbaRegion got = d.finish_rgba(x, y, w, h, w, h, false);
          EXPECT_EQ(got.alpha, s.color_type == 4 || s.color_type == 6 || s.transparency)
              << describe(s);
          pixels = got.pixels;
          stride = got.stride;
        } else {
          const DecodedImage got = d.finish_region(x, y, w, h, w, h);
          ASSERT_EQ(got.channels, channels);
          pixels = got.pixels;
          stride = got.stride;
        }
        const size_t row = static_cast<size_t>(s.width) * static_cast<size_t>(channels);
        for (int r = 0; r < h; ++r) {
          const uint8_t* from =
              want.data() + static_cast<size_t>(y + r) * row + static_cast<size_t>(x) * channels;
          ASSERT_EQ(std::vector<uint8_t>(pixels + r * stride, pixels + r * stride + w * channels),
                    std::vector<uint8_t>(from, from + w * channels))
              << describe(s) << " mode " << mode << " region " << x << "," << y << " " << w << "x"
              << h << " row " << r;
        }
        ++compared;
        with_trns += mode == 2 && s.transparency;
      }
    }
  }
  EXPECT_EQ(compared, 100u * 3 * 3);
  EXPECT_EQ(with_trns, 30u * 3);
}

TEST(ImageFormats, DetectedByContentAndFormatsWithoutACodecAreNamed) {
  PngSpec s;
  EXPECT_EQ(detail::detect_format(make_png(s, 1).bytes.data(), 33), detail::ImageFormat::kPng);
  const std::vector<uint8_t> jpeg = make_photo_jpeg(8, 8, 1);
  EXPECT_EQ(detail::detect_format(jpeg.data(), jpeg.size()), detail::ImageFormat::kJpeg);
  const std::string gif = "GIF89a\x01\x00\x01\x00\x00\x00\x00;";
  const std::string tiff("II*\0\x08\0\0\0", 8);
  const std::string webp("RIFF\x10\0\0\0WEBPVP8L", 16);
  const std::string bmp = "BM\x3a\0\0\0";
  const std::string pnm = "P6\n1 1\n255\n";
  ImageWriter writer(ImageTransform::train(8));
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  EXPECT_NE(error_of(writer, bytes(gif))
                .find("a GIF image: no codec for GIF (Conveyor decodes JPEG, PNG and WebP)"),
            std::string::npos)
      << error_of(writer, bytes(gif));
  EXPECT_NE(error_of(writer, bytes(tiff)).find("a TIFF image: no codec for TIFF"),
            std::string::npos);
  // WebP has its codec (webp_test): a header alone is a WebP decode error, not "no codec".
  EXPECT_NE(error_of(writer, bytes(webp)).find("WebP decode failed"), std::string::npos)
      << error_of(writer, bytes(webp));
  EXPECT_NE(error_of(writer, bytes(bmp)).find("a BMP image: no codec for BMP"), std::string::npos);
  EXPECT_NE(error_of(writer, bytes(pnm)).find("a PNM image: no codec for PNM"), std::string::npos);
  EXPECT_NE(error_of(writer, bytes("<html>")).find("first bytes 3c 68 74 6d 6c 3e"),
            std::string::npos)
      << error_of(writer, bytes("<html>"));
  EXPECT_NE(error_of(writer, {}).find("an empty file"), std::string::npos);
}

// An ImageNet-like folder: JPEGs, a PNG named .JPEG (n02105855_2933.JPEG), a .png and a .PNG;
// every file is read, each PNG's row as libpng's decode and the same transform give it.
TEST(ImageFolderFormats, APngNamedJpegAmongJpegsIsReadByItsContent) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"n02105855"}, 3);
  PngSpec gray16;
  gray16.width = 40;
  gray16.height = 30;
  gray16.color_type = 0;
  gray16.bit_depth = 16;
  PngSpec palette;
  palette.width = 31;
  palette.height = 45;
  palette.color_type = 3;
  palette.bit_depth = 4;
  palette.interlaced = true;
  palette.transparency = true;
  PngSpec rgba;
  rgba.width = 50;
  rgba.height = 37;
  rgba.color_type = 6;
  const std::map<std::string, PngFile> pngs = {{"n02105855/n02105855_2933.JPEG", make_png(rgba, 1)},
                                               {"n02105855/gray.png", make_png(gray16, 2)},
                                               {"n02105855/palette.PNG", make_png(palette, 3)}};
  for (const auto& [name, f] : pngs) write_bytes(dir / name, f.bytes);
  ImageTransform t = ImageTransform::train(16);
  auto source = std::shared_ptr<ImageSource>(ImageSource::image_folder(dir.path(), t));
  ASSERT_EQ(source->size(), 6u);
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.seed = 5;
  DataLoader loader(source, o);
  std::set<size_t> seen;
  size_t pngs_checked = 0;
  for (Batch& b : loader) {
    const at::Tensor images = b.images().contiguous();
    for (size_t r = 0; r < b.size(); ++r) {
      seen.insert(b.indices[r]);
      const std::string name =
          std::filesystem::relative(source->items()[b.indices[r]].path, dir.path()).string();
      const auto png = pngs.find(name);
      if (png == pngs.end()) continue;
      const SampleContext ctx{0, b.indices[r], o.seed, 0};
      const std::vector<uint8_t> expected = expected_row(reference_of(png->second), t, ctx);
      const auto* got = images[static_cast<int64_t>(r)].data_ptr<uint8_t>();
      EXPECT_EQ(std::vector<uint8_t>(got, got + expected.size()), expected) << name;
      ++pngs_checked;
    }
  }
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(pngs_checked, 3u);
}

// A GIF named .jpg and a TIFF named .tif: under kRaise each is a SampleError naming the file and
// the format found; under kSkip each is a counted skip and every other file is read.
TEST(ImageFolderFormats, AFormatWithoutACodecIsNamedOrSkipped) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a"}, 3);
  PngSpec s;
  s.width = 20;
  s.height = 20;
  write_bytes(dir / "a/real.png", make_png(s, 1).bytes);
  const std::string gif = "GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00,";
  write_bytes(dir / "a/animated.jpg", std::vector<uint8_t>(gif.begin(), gif.end()));
  const std::string tiff("II*\0\x08\0\0\0\0\0", 10);
  write_bytes(dir / "a/scan.tif", std::vector<uint8_t>(tiff.begin(), tiff.end()));
  auto source = std::shared_ptr<ImageSource>(
      ImageSource::image_folder(dir.path(), ImageTransform::train(16)));
  ASSERT_EQ(source->size(), 6u);
  LoaderOptions o;
  o.batch_size = 1;
  o.workers = 2;
  std::map<std::string, std::string> failed;
  {
    DataLoader loader(source, o);
    testing::finishes_within(std::chrono::seconds(20), "formats without a codec, raise", [&] {
      for (;;) {
        try {
          if (!loader.next()) break;
        } catch (const SampleError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(e.path()), std::string::npos) << what;
          failed[std::filesystem::path(e.path()).filename().string()] = what;
        }
      }
    });
  }
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_NE(failed["animated.jpg"].find("a GIF image: no codec for GIF"), std::string::npos)
      << failed["animated.jpg"];
  EXPECT_NE(failed["scan.tif"].find("a TIFF image: no codec for TIFF"), std::string::npos)
      << failed["scan.tif"];

  o.on_error = ErrorPolicy::kSkip;
  o.batch_size = 2;
  DataLoader skipping(source, o);
  size_t rows = 0;
  for (Batch& b : skipping) {
    rows += b.size();
    for (size_t idx : b.indices) {
      const std::string path = source->items()[idx].path;
      EXPECT_EQ(path.find("animated"), std::string::npos);
      EXPECT_EQ(path.find("scan"), std::string::npos);
    }
  }
  EXPECT_EQ(rows, 6u);
  EXPECT_EQ(skipping.stats().skipped, 2u);
}

}  // namespace
}  // namespace conveyor
