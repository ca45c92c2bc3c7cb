// PNG's row of the codec table (image_codec.h), with libspng (Debian's libspng 0.7.3): every
// colour type and bit depth, interlaced or not, to 8-bit RGB or RGBX.
//
// libspng rather than libpng: every call returns an error code (no setjmp/longjmp around its
// calls, so no C++ exception and no jump ever crosses its frames), it reads rows one at a time
// (spng_decode_row), which lets a non-interlaced image stop at the crop's last row, and on the
// same files it decoded a little faster (BENCHMARKS.md, "PNG: libspng or libpng": 1.03-1.12x on
// 500x375 8-bit RGB and RGBA, half of them interlaced, whole decodes). An interlaced (Adam7) image
// has no row order to stop in: it is decoded whole, then cut.
//
// The image data of a non-interlaced image go through libdeflate instead (png_scanlines.h), whose
// inflate was about twice zlib's on photos (BENCHMARKS.md, "PNG through libdeflate"): libspng
// still reads and checks the header and the chunks before the image data, then PngScanlines
// inflates the IDAT chunks whole, checks every CRC, the stream's Adler-32 and IEND, and unfilters
// rows in order down to the region's last. A file it does not take (a damaged chunk or stream,
// IDATs apart, no IEND) is decoded by libspng as before, which names the damage or, when the
// damage lies below the region, decodes the region's rows: the pixels and the errors are libspng's
// either way (png_test compares both paths on every kind).
#include <spng.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/image_codec.h"
#include "codec/png_scanlines.h"

namespace conveyor::detail {

namespace {

// Bounds on what libspng keeps of a file's chunks beside the image (text, ICC profiles, unknown
// chunks): no real PNG comes near them; a hostile one is refused rather than allocated.
constexpr size_t kChunkLimit = size_t{64} << 20;
constexpr size_t kChunkCacheLimit = size_t{128} << 20;

struct SpngFree {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};

class PngDecoder final : public ImageDecoder {
 public:
  PngDecoder(const DecodeLimits& limits, const DecodeOptions& options)
      : limits_(limits), channels_(options.channels) {
    if (channels_ != 3 && channels_ != 4) {
      throw std::invalid_argument("DecodeOptions::channels must be 3 or 4");
    }
  }

  ImageInfo begin(const uint8_t* data, size_t size) override {
    data_ = data;
    size_ = size;
    ctx_.reset(spng_ctx_new(0));  // a context reads one file: a fresh one per image
    if (!ctx_) throw std::bad_alloc();
    check(spng_set_png_buffer(ctx_.get(), data, size), "reading the file");
    check(spng_set_chunk_limits(ctx_.get(), kChunkLimit, kChunkCacheLimit), "setting limits");
    check(spng_get_ihdr(ctx_.get(), &ihdr_), "reading the header");
    const std::string over_limit = pixel_limit_exceeded(ihdr_.width, ihdr_.height, limits_);
    if (!over_limit.empty()) {
      ctx_.reset();
      throw ImageDecodeError("PNG rejected: " + over_limit);
    }
    // Deflate packs at most 1032 bytes into one (its longest match, 258 bytes, in two bits at
    // best): a file too short for the rows it declares is truncated, and is refused here rather
    // than after buffers of the declared size were allocated.
    const uint64_t channels = static_cast<uint64_t>(file_channels());
    const uint64_t row = (uint64_t{ihdr_.width} * channels * ihdr_.bit_depth + 7) / 8 + 1;
    if (static_cast<uint64_t>(size) * 1032 < row * ihdr_.height) {
      ctx_.reset();
      throw ImageDecodeError("PNG decode failed: " + std::to_string(size) +
                             " bytes cannot hold a " + std::to_string(ihdr_.width) + "x" +
                             std::to_string(ihdr_.height) +
                             " image (deflate packs at most 1032 bytes into one): truncated");
    }
    ImageInfo info;
    info.width = static_cast<int>(ihdr_.width);
    info.height = static_cast<int>(ihdr_.height);
    info.bit_depth = ihdr_.bit_depth;
    switch (ihdr_.color_type) {
      case SPNG_COLOR_TYPE_GRAYSCALE:
        info.channels = 1;
        break;
      case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
        info.channels = 2;
        break;
      case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
        info.channels = 4;
        break;
      default:  // truecolor, indexed
        info.channels = 3;
        break;
    }
    return info;
  }

  SampleRegion finish_samples(int x, int y, int width, int height) override {
    if (!ctx_) throw std::logic_error("PngDecoder::finish_samples without begin");
    std::unique_ptr<spng_ctx, SpngFree> ctx = std::move(ctx_);  // freed however this returns
    if (ihdr_.color_type != SPNG_COLOR_TYPE_GRAYSCALE &&
        ihdr_.color_type != SPNG_COLOR_TYPE_INDEXED) {
      throw ImageDecodeError(std::string("PNG of one channel wanted (gray or palette), not ") +
                             (ihdr_.color_type == SPNG_COLOR_TYPE_TRUECOLOR ? "RGB"
                              : ihdr_.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA
                                  ? "RGBA"
                                  : "gray + alpha"));
    }
    const int full_w = static_cast<int>(ihdr_.width);
    const int full_h = static_cast<int>(ihdr_.height);
    x = std::clamp(x, 0, full_w - 1);
    y = std::clamp(y, 0, full_h - 1);
    width = std::clamp(width, 1, full_w - x);
    height = std::clamp(height, 1, full_h - y);
    const int depth = ihdr_.bit_depth;
    const size_t out_sample = depth == 16 ? 2 : 1;
    SampleRegion region;
    region.width = width;
    region.height = height;
    region.bit_depth = depth;
    region.stride = static_cast<size_t>(width) * out_sample;
    if (region_.size() < region.stride * static_cast<size_t>(height)) {
      region_.resize(region.stride * static_cast<size_t>(height));
    }
    // The file's own rows (SPNG_FMT_RAW: packed below 8 bits, big-endian at 16), unpacked here.
    size_t packed_row = 0;
    auto unpack = [&](const uint8_t* packed, int r) {
      uint8_t* to = region_.data() + static_cast<size_t>(r - y) * region.stride;
      for (int i = 0; i < width; ++i) {
        const size_t at = static_cast<size_t>(x + i);
        if (depth == 16) {
          const uint16_t v = static_cast<uint16_t>(packed[2 * at] << 8 | packed[2 * at + 1]);
          std::memcpy(to + 2 * static_cast<size_t>(i), &v, sizeof v);
        } else if (depth == 8) {
          to[i] = packed[at];
        } else {
          const size_t bit = at * static_cast<size_t>(depth);
          const int shift = 8 - depth - static_cast<int>(bit % 8);
          to[i] = static_cast<uint8_t>((packed[bit / 8] >> shift) & ((1 << depth) - 1));
        }
      }
    };
    if (scanlines_through(ctx.get(), y + height - 1)) {
      for (int r = y; r < y + height; ++r) unpack(scanlines_.row(static_cast<uint32_t>(r)), r);
      region.samples = region_.data();
      return region;
    }
    check(spng_decoded_image_size(ctx.get(), SPNG_FMT_RAW, &packed_row), "sizing the image");
    packed_row /= static_cast<size_t>(full_h);
    if (ihdr_.interlace_method != SPNG_INTERLACE_NONE) {
      // libspng 0.7.3 puts an Adam7 pass's samples in place whole bytes at a time, which is
      // wrong below 8 bits (spng_decode_image(SPNG_FMT_RAW) returned other samples for 1-, 2- and
      // 4-bit images): the passes' own scanlines are read, and each sample is put in place here.
      const size_t size = packed_row * static_cast<size_t>(full_h);
      if (whole_.size() < size) whole_.resize(size);
      std::fill_n(whole_.begin(), size, uint8_t{0});
      deinterlace(ctx.get(), packed_row);
      verify_end(ctx.get());
      for (int r = y; r < y + height; ++r) {
        unpack(whole_.data() + static_cast<size_t>(r) * packed_row, r);
      }
    } else {
      check(spng_decode_image(ctx.get(), nullptr, 0, SPNG_FMT_RAW, SPNG_DECODE_PROGRESSIVE),
            "starting the decode");
      if (scratch_.size() < packed_row) scratch_.resize(packed_row);
      const int last = y + height - 1;
      for (int r = 0; r <= last; ++r) {
        const int status = spng_decode_row(ctx.get(), scratch_.data(), packed_row);
        if (status != 0 && !(status == SPNG_EOI && r == full_h - 1)) {
          fail("decoding row " + std::to_string(r) + " of " + std::to_string(full_h), status);
        }
        if (r >= y) unpack(scratch_.data(), r);
      }
      if (last == full_h - 1) verify_end(ctx.get());
    }
    region.samples = region_.data();
    return region;
  }

  DecodedImage finish_region(int x, int y, int width, int height, int, int) override {
    return decode_region(x, y, width, height, false, false);
  }

  // The RGBA pixels with the alpha channel or the tRNS chunk applied (libspng's SPNG_DECODE_TRNS),
  // and a 16-bit file's samples kept when `wide`.
  RgbaRegion finish_rgba(int x, int y, int width, int height, int, int, bool wide) override {
    if (channels_ != 4) throw std::logic_error("finish_rgba needs a decoder of 4 channels");
    if (!ctx_) throw std::logic_error("PngDecoder::finish_rgba without begin");
    spng_trns trns{};
    const bool alpha = ihdr_.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA ||
                       ihdr_.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ||
                       spng_get_trns(ctx_.get(), &trns) == 0;
    const bool keep = wide && ihdr_.bit_depth == 16;
    const DecodedImage image = decode_region(x, y, width, height, true, keep);
    RgbaRegion region;
    region.pixels = image.pixels;
    region.width = image.width;
    region.height = image.height;
    region.stride = image.stride;
    region.bit_depth = keep ? 16 : 8;
    region.alpha = alpha;
    region.scale = image.scale;
    return region;
  }

 private:
  // finish_region()'s decode; with `trns` the tRNS chunk sets the alpha of RGBA pixels, and with
  // `keep_wide` a 16-bit file's RGBA16 pixels are returned as they are (8 bytes a pixel).
  DecodedImage decode_region(int x, int y, int width, int height, bool trns, bool keep_wide) {
    if (!ctx_) throw std::logic_error("PngDecoder::finish_region without begin");
    std::unique_ptr<spng_ctx, SpngFree> ctx = std::move(ctx_);  // freed however this returns
    const int full_w = static_cast<int>(ihdr_.width);
    const int full_h = static_cast<int>(ihdr_.height);
    x = std::clamp(x, 0, full_w - 1);
    y = std::clamp(y, 0, full_h - 1);
    width = std::clamp(width, 1, full_w - x);
    height = std::clamp(height, 1, full_h - y);
    const bool wide = ihdr_.bit_depth == 16;
    const bool narrowing = wide && !keep_wide;  // 16-bit samples rounded to 8 bits
    const int format = wide ? SPNG_FMT_RGBA16 : channels_ == 4 ? SPNG_FMT_RGBA8 : SPNG_FMT_RGB8;
    const int flags = trns ? SPNG_DECODE_TRNS : 0;
    const size_t in_pixel = wide ? 8 : static_cast<size_t>(channels_);  // bytes libspng writes
    const size_t out_pixel = static_cast<size_t>(channels_);
    const size_t row_bytes = static_cast<size_t>(full_w) * in_pixel;
    const size_t rows = static_cast<size_t>(height);

    DecodedImage image;
    image.width = width;
    image.height = height;
    image.channels = channels_;
    image.scale = 8;
    if (ihdr_.bit_depth == 8 && !(trns && has_trns(ctx.get())) &&
        ihdr_.color_type != SPNG_COLOR_TYPE_INDEXED &&
        scanlines_through(ctx.get(), y + height - 1)) {
      convert_rows(x, y, width, height, image);
      return image;
    }
    if (ihdr_.interlace_method != SPNG_INTERLACE_NONE) {
      // Adam7 passes cover the whole image each: decoded whole, then cut.
      size_t size = 0;
      check(spng_decoded_image_size(ctx.get(), format, &size), "sizing the image");
      if (whole_.size() < size) whole_.resize(size);
      check(spng_decode_image(ctx.get(), whole_.data(), size, format, flags), "decoding the image");
      verify_end(ctx.get());
      const uint8_t* region =
          whole_.data() + static_cast<size_t>(y) * row_bytes + static_cast<size_t>(x) * in_pixel;
      if (!narrowing) {
        image.pixels = region;
        image.stride = row_bytes;
        return image;
      }
      image.stride = static_cast<size_t>(width) * out_pixel;
      if (region_.size() < image.stride * rows) region_.resize(image.stride * rows);
      for (size_t r = 0; r < rows; ++r) {
        narrow(region + r * row_bytes, region_.data() + r * image.stride, width, trns);
      }
      image.pixels = region_.data();
      return image;
    }
    // Rows in order, down to the region's last; the rows above it go through one scratch row.
    check(spng_decode_image(ctx.get(), nullptr, 0, format, SPNG_DECODE_PROGRESSIVE | flags),
          "starting the decode");
    if (scratch_.size() < row_bytes) scratch_.resize(row_bytes);
    image.stride = narrowing ? static_cast<size_t>(width) * out_pixel : row_bytes;
    if (region_.size() < image.stride * rows) region_.resize(image.stride * rows);
    const int last = y + height - 1;
    for (int r = 0; r <= last; ++r) {
      uint8_t* row = r < y || narrowing ? scratch_.data()
                                        : region_.data() + static_cast<size_t>(r - y) * row_bytes;
      const int status = spng_decode_row(ctx.get(), row, row_bytes);
      if (status != 0 && !(status == SPNG_EOI && r == full_h - 1)) {
        fail("decoding row " + std::to_string(r) + " of " + std::to_string(full_h), status);
      }
      if (narrowing && r >= y) {
        narrow(row + static_cast<size_t>(x) * in_pixel,
               region_.data() + static_cast<size_t>(r - y) * image.stride, width, trns);
      }
    }
    if (last == full_h - 1) verify_end(ctx.get());
    image.pixels = narrowing ? region_.data() : region_.data() + static_cast<size_t>(x) * in_pixel;
    return image;
  }

  // Whether the image data of the image begin() read went through PngScanlines, and its rows are
  // unfiltered down to `last`: false for an interlaced image, and for a file PngScanlines leaves
  // to libspng (then `ctx` is untouched beyond the chunks before the image data).
  bool scanlines_through(spng_ctx* ctx, int last) {
    if (ihdr_.interlace_method != SPNG_INTERLACE_NONE) return false;
    // libspng reads and checks every chunk before the first IDAT (PLTE, tRNS, ...): a damaged one
    // is left to its decode, which names it.
    spng_trns trns{};
    const int status = spng_get_trns(ctx, &trns);
    if (status != 0 && status != SPNG_ECHUNKAVAIL) return false;
    PngRowLayout layout;
    layout.width = ihdr_.width;
    layout.height = ihdr_.height;
    layout.bits_per_pixel = file_channels() * ihdr_.bit_depth;
    if (scanlines_.read(data_, size_, layout) != nullptr) return false;
    return scanlines_.unfilter_through(static_cast<uint32_t>(last));
  }

  // Whether the file has a tRNS chunk (false also when its chunks cannot be read: the decode that
  // follows names the damage).
  static bool has_trns(spng_ctx* ctx) {
    spng_trns trns{};
    return spng_get_trns(ctx, &trns) == 0;
  }

  // Samples a pixel in the file's rows: 1 gray or palette, 2 gray + alpha, 3 RGB, 4 RGBA.
  int file_channels() const {
    switch (ihdr_.color_type) {
      case SPNG_COLOR_TYPE_TRUECOLOR:
        return 3;
      case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
        return 4;
      case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
        return 2;
      default:
        return 1;
    }
  }

  // The region of an 8-bit gray, gray + alpha, RGB or RGBA file's unfiltered rows as RGB8 or
  // RGBA8 (channels_), as libspng's SPNG_FMT_RGB8 / SPNG_FMT_RGBA8 give them without a tRNS
  // chunk applied: alpha kept in RGBA8 and dropped in RGB8, 255 where the file has none, gray
  // replicated. Where the file's pixels are already the output's, the rows are pointed to.
  void convert_rows(int x, int y, int width, int height, DecodedImage& image) {
    const int in = file_channels();
    const size_t out = static_cast<size_t>(channels_);
    if (in == channels_) {  // RGB to RGB8, RGBA to RGBA8
      image.pixels = scanlines_.row(static_cast<uint32_t>(y)) + static_cast<size_t>(x) * out;
      image.stride = scanlines_.stride();
      return;
    }
    image.stride = static_cast<size_t>(width) * out;
    const size_t rows = static_cast<size_t>(height);
    if (region_.size() < image.stride * rows) region_.resize(image.stride * rows);
    for (size_t r = 0; r < rows; ++r) {
      const uint8_t* from = scanlines_.row(static_cast<uint32_t>(y) + static_cast<uint32_t>(r)) +
                            static_cast<size_t>(x) * static_cast<size_t>(in);
      uint8_t* to = region_.data() + r * image.stride;
      for (int i = 0; i < width; ++i, from += in, to += out) {
        switch (in) {
          case 1:  // gray
            to[0] = to[1] = to[2] = from[0];
            if (out == 4) to[3] = 255;
            break;
          case 2:  // gray + alpha
            to[0] = to[1] = to[2] = from[0];
            if (out == 4) to[3] = from[1];
            break;
          case 3:  // RGB to RGBA8
            to[0] = from[0];
            to[1] = from[1];
            to[2] = from[2];
            to[3] = 255;
            break;
          default:  // RGBA to RGB8
            to[0] = from[0];
            to[1] = from[1];
            to[2] = from[2];
            break;
        }
      }
    }
    image.pixels = region_.data();
  }

  // The image's samples, in the file's packing (SPNG_FMT_RAW: packed below 8 bits, big-endian at
  // 16), into whole_ (zeroed, packed_row bytes a row), from the Adam7 passes' scanlines: sample i
  // of pass p's scanline k is the stored pixel (x0[p] + i * dx[p], y0[p] + k * dy[p]).
  void deinterlace(spng_ctx* ctx, size_t packed_row) {
    static constexpr int x0[7] = {0, 4, 0, 2, 0, 1, 0}, y0[7] = {0, 0, 4, 0, 2, 0, 1};
    static constexpr int dx[7] = {8, 8, 4, 4, 2, 2, 1}, dy[7] = {8, 8, 8, 4, 4, 2, 2};
    const int depth = ihdr_.bit_depth;
    const int width = static_cast<int>(ihdr_.width);
    check(spng_decode_image(ctx, nullptr, 0, SPNG_FMT_RAW, SPNG_DECODE_PROGRESSIVE),
          "starting the decode");
    if (scratch_.size() < packed_row) scratch_.resize(packed_row);
    for (;;) {
      spng_row_info info{};
      const int got = spng_get_row_info(ctx, &info);
      if (got == SPNG_EOI) break;
      check(got, "reading a pass's row");
      const int pass = info.pass;
      const int status = spng_decode_scanline(ctx, scratch_.data(), packed_row);
      if (status != 0 && status != SPNG_EOI) {
        fail("decoding pass " + std::to_string(pass + 1) + "'s row " +
                 std::to_string(info.scanline_idx),
             status);
      }
      const size_t row = static_cast<size_t>(y0[pass]) + size_t{info.scanline_idx} * dy[pass];
      uint8_t* to = whole_.data() + row * packed_row;
      for (int i = 0, x = x0[pass]; x < width; ++i, x += dx[pass]) {
        if (depth >= 8) {
          const size_t bytes = static_cast<size_t>(depth / 8);
          std::memcpy(to + static_cast<size_t>(x) * bytes, scratch_.data() + i * bytes, bytes);
        } else {
          const size_t from_bit = static_cast<size_t>(i) * depth,
                       to_bit = static_cast<size_t>(x) * depth;
          const int sample =
              (scratch_[from_bit / 8] >> (8 - depth - from_bit % 8)) & ((1 << depth) - 1);
          to[to_bit / 8] =
              static_cast<uint8_t>(to[to_bit / 8] | sample << (8 - depth - to_bit % 8));
        }
      }
      if (status == SPNG_EOI) break;
    }
  }

  [[noreturn]] static void fail(const std::string& what, int status) {
    throw ImageDecodeError("PNG decode failed: " + what + ": " + spng_strerror(status));
  }
  static void check(int status, const char* what) {
    if (status != 0) fail(what, status);
  }
  // Once the last row is out, the rest of the image data: its checksums (zlib's Adler-32, the last
  // IDAT chunk's CRC) and the chunks after it, so that damage there is an error too.
  static void verify_end(spng_ctx* ctx) { check(spng_decode_chunks(ctx), "after the image data"); }

  // `width` host-endian RGBA16 pixels to `channels_`-byte pixels, each sample v to the nearest
  // 8-bit value: (v * 255 + 32767) / 65535 (65535 -> 255, 257 -> 1, 128 -> 0, 129 -> 1). The
  // fourth byte is the alpha so rounded with `alpha`, else 255.
  void narrow(const uint8_t* from, uint8_t* to, int width, bool alpha) const {
    const int samples = alpha && channels_ == 4 ? 4 : 3;
    for (int i = 0; i < width; ++i, from += 8, to += channels_) {
      for (int c = 0; c < samples; ++c) {
        uint16_t v;
        std::memcpy(&v, from + 2 * c, sizeof v);
        to[c] = static_cast<uint8_t>((v * 255u + 32767u) / 65535u);
      }
      if (channels_ == 4 && samples == 3) to[3] = 255;
    }
  }

  DecodeLimits limits_;
  int channels_;
  std::unique_ptr<spng_ctx, SpngFree> ctx_;  // the image begin() read, until finish_region()
  const uint8_t* data_ = nullptr;            // its bytes, valid until finish_region() returns
  size_t size_ = 0;
  PngScanlines scanlines_;  // its image data through libdeflate, when PngScanlines takes them
  spng_ihdr ihdr_{};
  std::vector<uint8_t> scratch_;  // one row above the region, or a 16-bit row
  std::vector<uint8_t> region_;   // the region's rows (full rows for 8 bits)
  std::vector<uint8_t> whole_;    // an interlaced image, whole
};

}  // namespace

std::unique_ptr<ImageDecoder> make_png_decoder(const DecodeLimits& limits,
                                               const DecodeOptions& options) {
  return std::make_unique<PngDecoder>(limits, options);
}

}  // namespace conveyor::detail
