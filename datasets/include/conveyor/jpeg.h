// conveyor/jpeg.h: JPEG decoding with libjpeg-turbo, decoding only what is needed.
//
// What it is for: turning JPEG bytes into RGB uint8 pixels as cheaply as possible. A request names
// a region of the source image and the smallest size the caller needs it at; the decoder picks the
// smallest DCT scale M/8 (M = 1..8) that keeps the region at least that large, skips the rows above
// and below it (jpeg_skip_scanlines, and stopping after its last row) and decodes only the iMCU
// columns that cover it (jpeg_crop_scanline).
//
// Requires: one JpegDecoder per thread; it is reused across images and is not thread-safe.
// Guarantees: every JPEG that libjpeg-turbo reads decodes to RGB (baseline, progressive,
// arithmetic-coded, restart markers, any subsampling; grayscale is expanded to three channels;
// CMYK and YCCK, Adobe-inverted or not, are converted to RGB). Anything libjpeg-turbo reports as
// an error or as corrupt data (a truncated file among them) throws JpegError instead of returning
// a partly grey image. An image with more than DecodeLimits::max_pixels pixels is rejected after
// reading the header and before any pixel buffer is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor {

class JpegError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DecodeLimits {
  uint64_t max_pixels = 100'000'000;  // width x height above this is rejected (decompression bomb)
};

struct JpegHeader {
  int width = 0;
  int height = 0;
  int components = 0;
  bool progressive = false;
  std::string color_space;  // "gray", "ycbcr", "rgb", "cmyk", "ycck" or "unknown"
};

// A decoded region: `height` rows of `width` RGB pixels, `stride` bytes apart. `scale` is the DCT
// numerator used (of 8); the region maps to source pixels by the factor scale/8. Valid until the
// next call on the same decoder.
struct DecodedImage {
  const uint8_t* pixels = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
  int scale = 8;
};

class JpegDecoder {
 public:
  explicit JpegDecoder(DecodeLimits limits = {});
  ~JpegDecoder();
  JpegDecoder(JpegDecoder&&) noexcept;
  JpegDecoder& operator=(JpegDecoder&&) noexcept;
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads only the header. Throws JpegError on non-JPEG data.
  JpegHeader read_header(const uint8_t* data, size_t size);

  // Decodes the whole image at full size.
  DecodedImage decode(const uint8_t* data, size_t size);

  // Decodes the source region (x, y, width, height) at the smallest scale M/8 whose scaled region
  // is at least min_width x min_height (full scale if none is). The returned image is exactly the
  // scaled region (rounded outwards to whole pixels).
  DecodedImage decode_region(const uint8_t* data, size_t size, int x, int y, int width, int height,
                             int min_width, int min_height);

  // The same in two steps, for callers that choose the region from the header: begin() reads the
  // header (throwing as read_header does) and finish_region() decodes, as decode_region() does.
  // The data must stay valid until finish_region() returns.
  JpegHeader begin(const uint8_t* data, size_t size);
  DecodedImage finish_region(int x, int y, int width, int height, int min_width, int min_height);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Encodes interleaved RGB pixels as a baseline JPEG (4:2:0), for generating test data.
std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality = 90);

}  // namespace conveyor
