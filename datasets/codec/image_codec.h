// datasets/codec/image_codec.h (build-only): the codec seam. An image file's format is recognised
// by its magic bytes, never by its name, and each format is one row of one table (image_codec.cpp)
// with its decoder, in the style of DALI's imgcodec (a parser that recognises a format and reads
// its header, a decoder per format).
//
// What it is for: ImageWriter (image_writer.cpp) decodes whatever image a sample holds through
// the decoder of the format detect_format() finds, and applies the same crop rule (choose_crop),
// resize, EXIF orientation and flip to every format. The loader's GPU decode sends every file that
// is not a JPEG to the CPU by detect_format(), before it is queued to the device.
//
// Adding a codec is one file and one row: a datasets/codec/<format>_decode.cpp that defines its
// make_<format>_decoder(), declared below, and that function in the format's row of the table
// (image_codec.cpp). Nothing else changes: not the sources, the shard readers nor the engine.
// A format whose row has no decoder (BMP, PNM, GIF and TIFF: docs/design.md says why) is
// recognised, and a file of it is refused with a message naming the format ("a GIF image: no codec
// for GIF"), which the loader's on_error policy reports or counts as a skip with the file's name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "conveyor/jpeg.h"

namespace conveyor::detail {

// Every format detect_format() tells apart. kUnknown: bytes no row recognises.
enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kBmp, kPnm, kGif, kTiff };
constexpr size_t kImageFormatCount = 8;

// The format `data` holds, by its first bytes alone (JPEG FF D8 FF; PNG's 8-byte signature;
// WebP RIFF....WEBP; BMP "BM"; PNM "P1".."P6"; GIF87a/GIF89a; TIFF "II*\0" / "MM\0*").
ImageFormat detect_format(const uint8_t* data, size_t size);

// The format's name in messages: "JPEG", "PNG", "WebP", "BMP", "PNM", "GIF", "TIFF", "unknown".
const char* format_name(ImageFormat format);

// A file that a codec refuses: no codec for its format, a header or data the codec cannot read,
// or a limit (DecodeLimits) exceeded. JPEG's own errors stay JpegError (conveyor/jpeg.h).
class ImageDecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a decoder's begin() reads from the header, before any pixel is decoded: what choose_crop
// needs, and what DecodeLimits::max_pixels is checked against.
struct ImageInfo {
  int width = 0;  // stored pixels (before any EXIF orientation)
  int height = 0;
  int channels = 0;   // in the file: 1 gray, 2 gray + alpha, 3 RGB or palette, 4 RGBA or CMYK
  int bit_depth = 8;  // bits per sample in the file (a palette's index bits for palette PNGs)
  // EXIF orientation 1..8 as JpegHeader::orientation; 1 unless the codec reads it and it is asked
  // for (only JPEG's APP1 is read: a PNG's rare eXIf chunk is ignored, as Pillow's
  // convert("RGB") and torchvision's decode_png ignore it).
  int orientation = 1;
};

// A decoded region's samples (ImageDecoder::finish_samples): `height` rows of `width` samples,
// `stride` bytes apart, each one byte (bit_depth 1 to 8, unpacked) or a host-endian uint16
// (bit_depth 16). Valid until the next call on the same decoder.
struct SampleRegion {
  const uint8_t* samples = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
  int bit_depth = 8;
};

// A decoded region's RGBA pixels (ImageDecoder::finish_rgba): `height` rows of `width` pixels of
// four samples, `stride` bytes apart, each sample one byte (bit_depth 8) or a host-endian uint16
// (bit_depth 16). `alpha`: whether the fourth sample is the file's alpha; when false the image is
// opaque and the fourth sample unspecified. `scale` as DecodedImage's. Valid until the next call on
// the same decoder.
struct RgbaRegion {
  const uint8_t* pixels = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
  int bit_depth = 8;
  bool alpha = false;
  int scale = 8;
};

// The DCT scale numerator M (of 8) at which JPEG's finish_region decodes a region of width x
// height asked for at least min_width x min_height: the smallest M that `options` allow
// (dct_scales, any_scale) whose scaled region, ceil(width * M / 8) x ceil(height * M / 8), is at
// least that large; 8 when none is. The other codecs decode at 8/8 whatever they are asked.
int dct_scale_for(int width, int height, int min_width, int min_height,
                  const DecodeOptions& options);

// One format's decoder, made by its table row for one thread and reused across images (not
// thread-safe).
class ImageDecoder {
 public:
  virtual ~ImageDecoder() = default;
  // Reads the header of `data` (which must stay valid until finish_region() returns) and checks
  // DecodeLimits::max_pixels before allocating anything of the image's size. Throws
  // ImageDecodeError (JpegError for JPEG) when the header is unreadable or over the limit.
  virtual ImageInfo begin(const uint8_t* data, size_t size) = 0;
  // Decodes the stored region (x, y, width, height) of the image begin() read, as
  // JpegDecoder::finish_region does: 8-bit RGB or RGBX pixels (DecodeOptions::channels), alpha
  // dropped, gray replicated, 16-bit samples scaled to 8 bits by rounding, v * 255 / 65535 to the
  // nearest ((v * 255 + 32767) / 65535; Pillow clips them instead). A codec without scaled
  // decoding returns the region at full size (scale 8). Rows below the region are not decoded
  // where the format allows it, so damage below the region goes unnoticed there, as it does for
  // JPEG. Throws on corrupt or truncated data, never returns a partly decoded region.
  virtual DecodedImage finish_region(int x, int y, int width, int height, int min_width,
                                     int min_height) = 0;
  // Instead of finish_region(): the stored region's samples as they are in the file, one channel,
  // no colour conversion, no scaling (for masks): a gray image's values, a palette image's
  // indices (tRNS and the palette's colours ignored). Throws ImageDecodeError for an image of
  // more than one channel, naming its kind; the default throws it for any format without the mode.
  virtual SampleRegion finish_samples(int x, int y, int width, int height);
  // Instead of finish_region(), for an image output that keeps alpha or 16 bits (ImageOutput):
  // the same region at the same scale, with the same R, G, B bytes as finish_region()'s RGBX
  // (requires a decoder made with DecodeOptions::channels 4), the fourth byte the file's alpha
  // (a PNG's alpha channel or tRNS chunk, a WebP's alpha) where it has one. With `wide`, a 16-bit
  // file's samples come as they are (bit_depth 16, not rounded to 8 bits); an 8-bit file's come
  // as 8 bits whatever `wide`. The default: finish_region(), alpha false (JPEG: no alpha, no 16
  // bits).
  virtual RgbaRegion finish_rgba(int x, int y, int width, int height, int min_width, int min_height,
                                 bool wide);
};

// One row of the codec table.
struct ImageCodec {
  ImageFormat format;
  // Whether `data` starts as a file of this format does.
  bool (*recognises)(const uint8_t* data, size_t size);
  // Makes a decoder; null for a format recognised but not decoded.
  std::unique_ptr<ImageDecoder> (*make_decoder)(const DecodeLimits& limits,
                                                const DecodeOptions& options);
};

// The table: one row per format, in the order detect_format() tries them.
const ImageCodec* image_codecs(size_t& count);

// A decoder for `format`'s files; null when its row has no decoder (or the format is unknown).
std::unique_ptr<ImageDecoder> make_image_decoder(ImageFormat format, const DecodeLimits& limits,
                                                 const DecodeOptions& options);

// Why `data`, found to be of `format`, has no decoder: "a GIF image: no codec for GIF (Conveyor
// decodes JPEG, PNG and WebP)", or for bytes of no known format, their first bytes in hex.
std::string no_codec_message(ImageFormat format, const uint8_t* data, size_t size);

// Why an image of width x height is refused by `limits` (max_pixels), or an empty string: the
// one wording every codec's "rejected" message uses.
std::string pixel_limit_exceeded(uint64_t width, uint64_t height, const DecodeLimits& limits);

// The codecs' decoders, one file each (jpeg_codec.cpp, png_decode.cpp, webp_decode.cpp).
std::unique_ptr<ImageDecoder> make_jpeg_decoder(const DecodeLimits& limits,
                                                const DecodeOptions& options);
std::unique_ptr<ImageDecoder> make_png_decoder(const DecodeLimits& limits,
                                               const DecodeOptions& options);
// WebP (libwebp): lossy and lossless still images, alpha dropped; an animated WebP is refused.
std::unique_ptr<ImageDecoder> make_webp_decoder(const DecodeLimits& limits,
                                                const DecodeOptions& options);

}  // namespace conveyor::detail
