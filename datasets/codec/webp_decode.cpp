// WebP's row of the codec table (image_codec.h), with libwebp (Debian's libwebp 1.2.4): lossy
// (VP8) and lossless (VP8L) still images, with or without alpha, to 8-bit RGB or RGBX (alpha
// dropped: its byte is X, as PNG's RGBA is).
//
// Only the region is decoded (WebPDecoderConfig's use_cropping): libwebp stops at the region's
// last row, and for lossy files upsamples chroma and converts colour for the region's columns
// only. libwebp snaps a crop's left and top to even coordinates for every WebP (lossy chroma is
// subsampled 2x2), and upsamples a lossy crop's edge rows and columns as an image's edges, from
// the chroma inside the crop alone: the crop asked for starts at an even column and row, with a
// margin of 2 pixels around the region for lossy files, and the pointer is moved to the region's
// first pixel. The pixels then equal a full decode's, cut (webp_test checks every kind, from
// libwebp's encoder and Pillow's, on many random regions at odd and even origins).
//
// Not libwebp's scaling (use_scaling): its rescaler averages areas, which gives other pixels than
// the bilinear resize (libyuv) that ImageWriter applies to every format, so a WebP's row would
// depend on the codec; choose_crop's box is resized by ImageWriter as for every other format
// (BENCHMARKS.md, "WebP: libwebp's scaling", states the difference and the time).
#include <webp/decode.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "codec/image_codec.h"

namespace conveyor::detail {

namespace {

const char* status_name(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "corrupt data (bitstream error)";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "not enough data (truncated)";
  }
  return "unknown status";
}

// A lossy crop's margin around the region: one chroma sample (chroma is subsampled 2x2).
constexpr int kLossyMargin = 2;
// The largest region buffer a decoder keeps after a failed decode (16 MiB: 4 Mpx RGBX).
constexpr size_t kKeptAfterFailure = size_t{16} << 20;

class WebpDecoder final : public ImageDecoder {
 public:
  WebpDecoder(const DecodeLimits& limits, const DecodeOptions& options)
      : limits_(limits), channels_(options.channels) {
    if (channels_ != 3 && channels_ != 4) {
      throw std::invalid_argument("DecodeOptions::channels must be 3 or 4");
    }
    if (!WebPInitDecoderConfig(&config_)) throw std::logic_error("libwebp's version mismatch");
  }

  ImageInfo begin(const uint8_t* data, size_t size) override {
    data_ = nullptr;
    WebPBitstreamFeatures& f = config_.input;
    const VP8StatusCode status = WebPGetFeatures(data, size, &f);
    if (status != VP8_STATUS_OK) fail("reading the header", status);
    if (f.has_animation) {
      throw ImageDecodeError("WebP decode failed: an animated WebP (only still images decode)");
    }
    // Shorter than its RIFF header says: truncated, as libwebp's decode of a whole buffer would
    // find, but before a buffer of the declared image's size is allocated.
    if (size >= 8 && std::memcmp(data, "RIFF", 4) == 0) {
      const uint64_t riff = uint64_t{data[4]} | uint64_t{data[5]} << 8 | uint64_t{data[6]} << 16 |
                            uint64_t{data[7]} << 24;
      if (riff + 8 > size) {
        throw ImageDecodeError("WebP decode failed: truncated: its RIFF header declares " +
                               std::to_string(riff + 8) + " bytes, the file has " +
                               std::to_string(size));
      }
    }
    const std::string over_limit = pixel_limit_exceeded(static_cast<uint64_t>(f.width),
                                                        static_cast<uint64_t>(f.height), limits_);
    if (!over_limit.empty()) throw ImageDecodeError("WebP rejected: " + over_limit);
    data_ = data;
    size_ = size;
    ImageInfo info;
    info.width = f.width;
    info.height = f.height;
    info.channels = f.has_alpha ? 4 : 3;
    info.bit_depth = 8;
    return info;
  }

  // MODE_RGBA's fourth byte is the alpha (255 in a WebP without it).
  RgbaRegion finish_rgba(int x, int y, int width, int height, int min_width, int min_height,
                         bool wide) override {
    const bool alpha = config_.input.has_alpha != 0;
    RgbaRegion region = ImageDecoder::finish_rgba(x, y, width, height, min_width, min_height, wide);
    region.alpha = alpha;
    return region;
  }

  DecodedImage finish_region(int x, int y, int width, int height, int, int) override {
    if (data_ == nullptr) throw std::logic_error("WebpDecoder::finish_region without begin");
    const uint8_t* data = data_;
    data_ = nullptr;  // one region per begin()
    const int full_w = config_.input.width;
    const int full_h = config_.input.height;
    x = std::clamp(x, 0, full_w - 1);
    y = std::clamp(y, 0, full_h - 1);
    width = std::clamp(width, 1, full_w - x);
    height = std::clamp(height, 1, full_h - y);
    // The crop asked of libwebp starts at an even column and row at or before (x, y) (libwebp
    // snaps it there in any case); for a lossy image it has a margin of one chroma sample (2
    // pixels) on each side where the image has room, so that the region's chroma is upsampled from
    // the same neighbours as in the full decode (at a crop's edge libwebp upsamples as at the
    // image's edge).
    const int margin = config_.input.format == 2 ? 0 : kLossyMargin;
    const int left = std::max(0, (x & ~1) - margin);
    const int top = std::max(0, (y & ~1) - margin);
    const int crop_w = std::min(full_w, x + width + margin) - left;
    const int crop_h = std::min(full_h, y + height + margin) - top;
    config_.options.use_cropping = 1;
    config_.options.crop_left = left;
    config_.options.crop_top = top;
    config_.options.crop_width = crop_w;
    config_.options.crop_height = crop_h;
    const size_t pixel = static_cast<size_t>(channels_);
    const size_t stride = static_cast<size_t>(crop_w) * pixel;
    const size_t bytes = stride * static_cast<size_t>(crop_h);
    if (region_bytes_ < bytes) {
      // Not zeroed: a few bytes can declare a large image, and libwebp writes every byte of a
      // region it decodes; pages a failed decode never wrote are never touched.
      region_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
      region_bytes_ = bytes;
    }
    WebPDecBuffer& out = config_.output;
    out.colorspace = channels_ == 4 ? MODE_RGBA : MODE_RGB;
    out.is_external_memory = 1;
    out.u.RGBA.rgba = region_.get();
    out.u.RGBA.stride = static_cast<int>(stride);
    out.u.RGBA.size = bytes;
    const VP8StatusCode status = WebPDecode(data, size_, &config_);
    WebPFreeDecBuffer(&out);  // external memory: frees nothing of ours
    if (status != VP8_STATUS_OK) {
      // A few bytes can declare a large image (its size is checked only against max_pixels):
      // the buffer they made is not kept past the failure.
      if (region_bytes_ > kKeptAfterFailure) {
        region_.reset();
        region_bytes_ = 0;
      }
      fail("decoding the image", status);
    }
    DecodedImage image;
    image.pixels = region_.get() + static_cast<size_t>(y - top) * stride +
                   static_cast<size_t>(x - left) * pixel;
    image.width = width;
    image.height = height;
    image.stride = stride;
    image.channels = channels_;
    image.scale = 8;
    return image;
  }

 private:
  [[noreturn]] static void fail(const char* what, VP8StatusCode status) {
    throw ImageDecodeError(std::string("WebP decode failed: ") + what + ": " + status_name(status));
  }

  DecodeLimits limits_;
  int channels_;
  WebPDecoderConfig config_{};
  const uint8_t* data_ = nullptr;  // the file begin() read, until finish_region()
  size_t size_ = 0;
  std::unique_ptr<uint8_t[]> region_;  // the decoded crop, reused
  size_t region_bytes_ = 0;
};

}  // namespace

std::unique_ptr<ImageDecoder> make_webp_decoder(const DecodeLimits& limits,
                                                const DecodeOptions& options) {
  return std::make_unique<WebpDecoder>(limits, options);
}

}  // namespace conveyor::detail
