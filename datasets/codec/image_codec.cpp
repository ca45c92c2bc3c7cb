// The codec table (image_codec.h): one row per image format, its magic bytes and its decoder.
#include "codec/image_codec.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor::detail {

namespace {

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t length) {
  return size >= length && std::memcmp(data, magic, length) == 0;
}

bool is_jpeg(const uint8_t* d, size_t n) { return starts_with(d, n, "\xFF\xD8\xFF", 3); }
bool is_png(const uint8_t* d, size_t n) { return starts_with(d, n, "\x89PNG\r\n\x1A\n", 8); }
bool is_webp(const uint8_t* d, size_t n) {
  return n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0;
}
bool is_bmp(const uint8_t* d, size_t n) { return starts_with(d, n, "BM", 2); }
bool is_pnm(const uint8_t* d, size_t n) {
  return n >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6';
}
bool is_gif(const uint8_t* d, size_t n) {
  return starts_with(d, n, "GIF87a", 6) || starts_with(d, n, "GIF89a", 6);
}
bool is_tiff(const uint8_t* d, size_t n) {
  return starts_with(d, n, "II*\0", 4) || starts_with(d, n, "MM\0*", 4);
}

// The table. A new codec fills its row's decoder (image_codec.h says how); the order is the
// order of detection (no two magics overlap).
constexpr ImageCodec kCodecs[] = {
    {ImageFormat::kJpeg, is_jpeg, make_jpeg_decoder},
    {ImageFormat::kPng, is_png, make_png_decoder},
    {ImageFormat::kWebp, is_webp, make_webp_decoder},
    {ImageFormat::kBmp, is_bmp, nullptr},
    {ImageFormat::kPnm, is_pnm, nullptr},
    {ImageFormat::kGif, is_gif, nullptr},
    {ImageFormat::kTiff, is_tiff, nullptr},
};

const ImageCodec* row_of(ImageFormat format) {
  for (const ImageCodec& codec : kCodecs) {
    if (codec.format == format) return &codec;
  }
  return nullptr;
}

}  // namespace

const ImageCodec* image_codecs(size_t& count) {
  count = sizeof kCodecs / sizeof kCodecs[0];
  return kCodecs;
}

ImageFormat detect_format(const uint8_t* data, size_t size) {
  if (data == nullptr) return ImageFormat::kUnknown;
  for (const ImageCodec& codec : kCodecs) {
    if (codec.recognises(data, size)) return codec.format;
  }
  return ImageFormat::kUnknown;
}

const char* format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kPnm:
      return "PNM";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

std::unique_ptr<ImageDecoder> make_image_decoder(ImageFormat format, const DecodeLimits& limits,
                                                 const DecodeOptions& options) {
  const ImageCodec* codec = row_of(format);
  if (codec == nullptr || codec->make_decoder == nullptr) return nullptr;
  return codec->make_decoder(limits, options);
}

std::string no_codec_message(ImageFormat format, const uint8_t* data, size_t size) {
  std::vector<std::string> names;  // the formats that have a decoder, from the table
  for (const ImageCodec& codec : kCodecs) {
    if (codec.make_decoder != nullptr) names.emplace_back(format_name(codec.format));
  }
  std::string decoded;  // "JPEG and PNG", "JPEG, PNG and WebP"
  for (size_t i = 0; i < names.size(); ++i) {
    decoded += i == 0 ? "" : i + 1 == names.size() ? " and " : ", ";
    decoded += names[i];
  }
  const std::string known = " (Conveyor decodes " + decoded + ")";
  if (format != ImageFormat::kUnknown) {
    const std::string name = format_name(format);
    return "a " + name + " image: no codec for " + name + known;
  }
  if (size == 0) return "an empty file: not an image" + known;
  std::string first;
  for (size_t i = 0; i < size && i < 8; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, "%s%02x", i == 0 ? "" : " ", data[i]);
    first += hex;
  }
  return "not an image of a known format (first bytes " + first + "): no codec for it" + known;
}

std::string pixel_limit_exceeded(uint64_t width, uint64_t height, const DecodeLimits& limits) {
  const uint64_t pixels = width * height;  // both below 2^32: no overflow
  if (pixels <= limits.max_pixels) return {};
  return std::to_string(width) + "x" + std::to_string(height) + " = " + std::to_string(pixels) +
         " pixels exceeds the limit of " + std::to_string(limits.max_pixels);
}

SampleRegion ImageDecoder::finish_samples(int, int, int, int) {
  throw ImageDecodeError("this format has no samples mode: a mask is a gray or palette PNG");
}

RgbaRegion ImageDecoder::finish_rgba(int x, int y, int width, int height, int min_width,
                                     int min_height, bool) {
  const DecodedImage image = finish_region(x, y, width, height, min_width, min_height);
  if (image.channels != 4) throw std::logic_error("finish_rgba needs a decoder of 4 channels");
  RgbaRegion region;
  region.pixels = image.pixels;
  region.width = image.width;
  region.height = image.height;
  region.stride = image.stride;
  region.scale = image.scale;
  return region;
}

}  // namespace conveyor::detail
