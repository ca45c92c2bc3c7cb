// JPEG's row of the codec table (image_codec.h): the JpegDecoder (jpeg_decode.cpp) behind the
// ImageDecoder interface, unchanged: DCT scaling, restart segments and EXIF orientation stay its.
#include <memory>

#include "codec/image_codec.h"

namespace conveyor::detail {

namespace {

class JpegImageDecoder final : public ImageDecoder {
 public:
  JpegImageDecoder(const DecodeLimits& limits, const DecodeOptions& options)
      : decoder_(limits, options) {}

  ImageInfo begin(const uint8_t* data, size_t size) override {
    const JpegHeader header = decoder_.begin(data, size);
    ImageInfo info;
    info.width = header.width;
    info.height = header.height;
    info.channels = header.components;
    info.bit_depth = 8;
    info.orientation = header.orientation;
    return info;
  }

  DecodedImage finish_region(int x, int y, int width, int height, int min_width,
                             int min_height) override {
    return decoder_.finish_region(x, y, width, height, min_width, min_height);
  }

 private:
  JpegDecoder decoder_;
};

}  // namespace

std::unique_ptr<ImageDecoder> make_jpeg_decoder(const DecodeLimits& limits,
                                                const DecodeOptions& options) {
  return std::make_unique<JpegImageDecoder>(limits, options);
}

}  // namespace conveyor::detail
