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
// Before that, every input goes through a differential pass over the libdeflate path of
// non-interlaced files (codec/png_scanlines.h): where PngScanlines reads the file and unfilters
// every row, libspng's own progressive decode of it (SPNG_FMT_RAW, spng_decode_row for every row)
// must succeed and give the same rows; a difference is a finding (abort). The chunks after the
// image data are not compared: libspng checks ancillary chunks' contents there, which
// PngScanlines leaves alone. A second pass reads the input's bytes as the filtered rows of an
// image of any kind, so that the unfilter sees rows no valid stream would reach by mutation, and
// compares them the same way (compare_unfilter).
//
// `conveyor-png-fuzz --write-seeds DIR` writes the seed corpus (every colour type and bit depth,
// interlaced or not, with tRNS, at small odd sizes: tests/png_writer.h; the same image data in
// other chunk layouts: many small IDATs, empty ones, tEXt before and after them; and a header
// declaring a huge image), each with a config tail, and exits. tests/fuzz/conveyor-png-fuzz.dict
// holds PNG's chunk names.

#include <spng.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "../png_writer.h"
#include "codec/image_codec.h"
#include "codec/png_scanlines.h"
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
  // The chunk layouts of the libdeflate path (non-interlaced): IDATs of a few bytes each, empty
  // IDATs among them, tEXt before and after them.
  for (PngSpec kind : conveyor::testing::every_png_kind()) {
    kind.width = 11;
    kind.height = 6;
    kind.transparency = seed % 2 == 0 && kind.color_type != 4 && kind.color_type != 6;
    conveyor::testing::PngLayout layout;
    layout.idat_max = 1 + seed % 7;
    layout.empty_idats = static_cast<int>(seed % 3);
    layout.text_before = seed % 2 == 1;
    layout.text_after = true;
    files.push_back(conveyor::testing::png_with_layout(
        conveyor::testing::make_png(kind, seed).bytes, layout, seed));
    ++seed;
  }
  files.push_back(conveyor::testing::png_declaring(100000, 100000));
  return files;
}

struct SpngFree {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};

// The differential pass (see the top): PngScanlines against libspng's rows, on the files the PNG
// decoder would give it (non-interlaced, within its limits and deflate's 1032:1 bound, the chunks
// before the image data read by libspng without error).
void compare_with_libspng(const uint8_t* png, size_t size) {
  std::unique_ptr<spng_ctx, SpngFree> ctx(spng_ctx_new(0));
  if (!ctx || spng_set_png_buffer(ctx.get(), png, size) != 0 ||
      spng_set_chunk_limits(ctx.get(), size_t{64} << 20, size_t{128} << 20) != 0) {
    return;
  }
  spng_ihdr ihdr{};
  if (spng_get_ihdr(ctx.get(), &ihdr) != 0 || ihdr.interlace_method != SPNG_INTERLACE_NONE) return;
  const uint64_t channels = ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA   ? 4
                            : ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR       ? 3
                            : ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ? 2
                                                                                 : 1;
  const uint64_t row_bytes = (uint64_t{ihdr.width} * channels * ihdr.bit_depth + 7) / 8;
  if (uint64_t{ihdr.width} * ihdr.height > DecodeLimits{}.max_pixels ||
      static_cast<uint64_t>(size) * 1032 < (row_bytes + 1) * ihdr.height) {
    return;
  }
  spng_trns trns{};
  const int chunks = spng_get_trns(ctx.get(), &trns);
  if (chunks != 0 && chunks != SPNG_ECHUNKAVAIL) return;  // libspng's to name
  static detail::PngScanlines scanlines;  // kept across inputs, as a decoder keeps it
  detail::PngRowLayout layout;
  layout.width = ihdr.width;
  layout.height = ihdr.height;
  layout.bits_per_pixel = static_cast<int>(channels) * ihdr.bit_depth;
  if (scanlines.read(png, size, layout) != nullptr) return;
  if (!scanlines.unfilter_through(ihdr.height - 1)) return;
  check(scanlines.row_bytes() == row_bytes, "PngScanlines' rows are IHDR's");
  check(spng_decode_image(ctx.get(), nullptr, 0, SPNG_FMT_RAW, SPNG_DECODE_PROGRESSIVE) == 0,
        "libspng starts the decode of a file PngScanlines read");
  std::vector<uint8_t> row(row_bytes);
  for (uint32_t r = 0; r < ihdr.height; ++r) {
    const int status = spng_decode_row(ctx.get(), row.data(), row.size());
    check(status == 0 || (status == SPNG_EOI && r == ihdr.height - 1),
          "libspng decodes every row of a file PngScanlines read");
    check(std::memcmp(row.data(), scanlines.row(r), row.size()) == 0,
          "PngScanlines' rows are libspng's");
  }
}

// The second pass, over the unfilter: the input's bytes read as an image's filtered rows (byte 0
// picks the colour type and bit depth, bytes 1 and 2 the width, 1..64, and the height, 1..16;
// the rest, repeated as needed, are the rows, each row's first byte a filter 0-4, or a bad one,
// 5-10, where it is 250 or more), deflated and framed here. PngScanlines reads the file, and
// refuses it whole where a row has a bad filter byte (the decoder then leaves it to libspng);
// libspng gives PngScanlines' rows, and with a bad filter byte the rows above it and none from it
// on (it may stop one row before it: it reads a row ahead).
void compare_unfilter(const uint8_t* data, size_t size) {
  using namespace conveyor::testing;
  if (size < 4) return;
  static const std::vector<PngSpec> kinds = every_png_kind();
  const PngSpec kind = kinds[data[0] % kinds.size()];
  const uint32_t width = 1u + data[1] % 64u, height = 1u + data[2] % 16u;
  const size_t row_bytes =
      (size_t{width} * static_cast<size_t>(png_channels(kind.color_type) * kind.bit_depth) + 7) / 8;
  std::vector<uint8_t> rows((row_bytes + 1) * height);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = data[3 + i % (size - 3)];
  uint32_t bad = height;  // the first row with a bad filter byte
  for (uint32_t r = 0; r < height; ++r) {
    uint8_t& filter = rows[r * (row_bytes + 1)];
    if (filter < 250) {
      filter = static_cast<uint8_t>(filter % 5);
    } else {
      filter = static_cast<uint8_t>(filter - 245);  // 5 to 10
      if (bad == height) bad = r;
    }
  }
  uLongf packed = compressBound(static_cast<uLong>(rows.size()));
  std::vector<uint8_t> idat(packed), ihdr;
  check(compress2(idat.data(), &packed, rows.data(), static_cast<uLong>(rows.size()), 1) == Z_OK,
        "zlib deflates the rows");
  idat.resize(packed);
  png_detail::put32(ihdr, width);
  png_detail::put32(ihdr, height);
  ihdr.insert(ihdr.end(), {static_cast<uint8_t>(kind.bit_depth),
                           static_cast<uint8_t>(kind.color_type), 0, 0, 0});
  const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> file(signature, signature + 8);
  png_detail::chunk(file, "IHDR", ihdr);
  if (kind.color_type == 3) {
    png_detail::chunk(file, "PLTE", std::vector<uint8_t>(size_t{3} << kind.bit_depth, 0));
  }
  png_detail::chunk(file, "IDAT", idat);
  png_detail::chunk(file, "IEND", {});

  static detail::PngScanlines scanlines;
  detail::PngRowLayout layout;
  layout.width = width;
  layout.height = height;
  layout.bits_per_pixel = png_channels(kind.color_type) * kind.bit_depth;
  const bool read = scanlines.read(file.data(), file.size(), layout) == nullptr;
  check(read == (bad == height),
        "PngScanlines reads a well-framed file, and refuses a bad filter byte (and only that)");
  check(!read || scanlines.unfilter_through(height - 1), "PngScanlines unfilters what it read");
  std::unique_ptr<spng_ctx, SpngFree> ctx(spng_ctx_new(0));
  check(ctx && spng_set_png_buffer(ctx.get(), file.data(), file.size()) == 0,
        "libspng takes the file");
  // libspng reads the first row as the decode starts: a bad filter byte there ends it.
  const bool started =
      spng_decode_image(ctx.get(), nullptr, 0, SPNG_FMT_RAW, SPNG_DECODE_PROGRESSIVE) == 0;
  check(started || bad == 0, "libspng starts the decode of a well-framed file");
  if (!started) return;
  std::vector<uint8_t> row(row_bytes);
  for (uint32_t r = 0; r < height; ++r) {
    const int status = spng_decode_row(ctx.get(), row.data(), row.size());
    const bool ok = status == 0 || (status == SPNG_EOI && r == height - 1);
    if (r >= bad) {
      check(!ok, "libspng refuses a bad filter byte");
      break;
    }
    if (!ok && r + 1 == bad) break;  // libspng read the bad row ahead
    check(ok, "libspng decodes the rows above a bad filter byte");
    check(!read || std::memcmp(row.data(), scanlines.row(r), row.size()) == 0,
          "PngScanlines' unfiltered rows are libspng's");
  }
}

void run_one(FuzzedDataProvider& cfg, const uint8_t* png, size_t size) {
  compare_with_libspng(png, size);
  compare_unfilter(png, size);
  if (cfg.ConsumeBool()) {
    run_image_writer(cfg, png, size);
  } else {
    run_region_decoder(cfg, detail::ImageFormat::kPng, png, size);
  }
}

}  // namespace conveyor::fuzz
