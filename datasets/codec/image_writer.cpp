// ImageWriter (conveyor/datasets.h): an image file's bytes to one transformed row of a batch. The
// decoder is the codec table's for the format the bytes hold (image_codec.h: by content, never by
// name); the crop is chosen from the header (choose_crop: torchvision's rules, the same for every
// format), the decoder decodes only that region (a JPEG at the smallest DCT scale that covers the
// output), and libyuv resizes, mirrors and splits the pixels into the row (OpenCV only turns an
// EXIF-rotated square upright).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <libyuv.h>

#include "codec/image_codec.h"
#include "conveyor/datasets.h"
#include "conveyor/image_plan.h"
#include "conveyor/internal/trace.h"
#include "conveyor/random.h"

namespace conveyor {

ImageTransform ImageTransform::train(int size) {
  ImageTransform t;
  t.mode = Mode::kRandomResizedCrop;
  t.size = size;
  return t;
}

ImageTransform ImageTransform::eval(int size, int resize) {
  ImageTransform t;
  t.mode = Mode::kResizeCenterCrop;
  t.size = size;
  t.resize = resize;
  t.flip_probability = 0.0;
  return t;
}

CropBox choose_crop(const ImageTransform& transform, int width, int height, uint64_t seed,
                    uint64_t epoch, size_t index) {
  const ViewPlan v = plan_image(transform, width, height, seed, epoch, index).views.front();
  return {v.x, v.y, v.width, v.height, v.flip};
}

// ---------------------------------------------------------------------------------------------
// ImageWriter

namespace {

// The decoder options ImageWriter uses, chosen by measurement (BENCHMARKS.md, "JPEG pipeline vs
// decode ceiling"): RGBX pixels, which libyuv scales, mirrors and splits into planes with its
// SIMD 4-byte-pixel kernels; SIMD DCT scales only; replicated chroma, whose
// one-pixel chroma shift the following resize mostly averages away.
DecodeOptions writer_decode_options(const ImageTransform& t) {
  DecodeOptions o;
  o.channels = 4;
  o.fast_upsampling = true;
  o.read_orientation = t.exif_orientation;
  o.dct_scales = t.dct_scales;
  o.discard_outside_crop = t.discard_outside_crop;
  return o;
}

// The source region that shows the display-oriented box `b` of an image whose EXIF orientation is
// `orientation` and whose display size is width x height (see JpegHeader::orientation).
CropBox stored_box(const CropBox& b, int orientation, int width, int height) {
  switch (orientation) {
    case 2:  // mirrored horizontally
      return {width - b.x - b.width, b.y, b.width, b.height, b.flip};
    case 3:  // rotated 180
      return {width - b.x - b.width, height - b.y - b.height, b.width, b.height, b.flip};
    case 4:  // mirrored vertically
      return {b.x, height - b.y - b.height, b.width, b.height, b.flip};
    case 5:  // transposed
      return {b.y, b.x, b.height, b.width, b.flip};
    case 6:  // to be rotated 90 degrees clockwise
      return {b.y, width - b.x - b.width, b.height, b.width, b.flip};
    case 7:  // transversed
      return {height - b.y - b.height, width - b.x - b.width, b.height, b.width, b.flip};
    case 8:  // to be rotated 90 degrees counter-clockwise
      return {height - b.y - b.height, b.x, b.height, b.width, b.flip};
    default:
      return b;
  }
}

// Turns the square `img` (stored orientation) upright as EXIF `orientation` says, into `scratch`
// when it cannot be done in place; returns the upright image.
cv::Mat orient(cv::Mat img, int orientation, cv::Mat& scratch) {
  switch (orientation) {
    case 2:
      cv::flip(img, img, 1);
      return img;
    case 3:
      cv::flip(img, img, -1);
      return img;
    case 4:
      cv::flip(img, img, 0);
      return img;
    case 5:
      cv::transpose(img, scratch);
      return scratch;
    case 6:
      cv::rotate(img, scratch, cv::ROTATE_90_CLOCKWISE);
      return scratch;
    case 7:
      cv::transpose(img, scratch);
      cv::flip(scratch, scratch, -1);
      return scratch;
    case 8:
      cv::rotate(img, scratch, cv::ROTATE_90_COUNTERCLOCKWISE);
      return scratch;
    default:
      return img;
  }
}

}  // namespace

struct ImageWriter::State {
  ImageTransform transform;
  // One decoder per format met so far (the codec table's, image_codec.h), made on first use.
  std::array<std::unique_ptr<detail::ImageDecoder>, detail::kImageFormatCount> decoders;
  std::vector<uint8_t> scaled;    // size x size RGBX scratch, reused
  std::vector<uint8_t> mirrored;  // size x size RGBX scratch for the flip, reused
  cv::Mat rotated;                // size x size RGBX scratch for EXIF rotations, reused
  int last_scale = 8;
  ImagePlan last_plan;  // the plan the last write executed
  ImageWriter::Timing last_timing;
  explicit State(ImageTransform t) : transform(t) {
    const size_t bytes = static_cast<size_t>(t.size) * static_cast<size_t>(t.size) * 4;
    scaled.resize(bytes);
    mirrored.resize(bytes);
    // JPEG's is made at once, which checks the limits and options when the writer is made.
    decoders[static_cast<size_t>(detail::ImageFormat::kJpeg)] =
        detail::make_image_decoder(detail::ImageFormat::kJpeg, t.limits, writer_decode_options(t));
  }

  // The decoder of the format `bytes` hold, by their content; throws ImageDecodeError naming the
  // format when it has no codec.
  detail::ImageDecoder& decoder_for(const uint8_t* bytes, size_t size) {
    const detail::ImageFormat format = detail::detect_format(bytes, size);
    std::unique_ptr<detail::ImageDecoder>& decoder = decoders[static_cast<size_t>(format)];
    if (!decoder) {
      decoder =
          detail::make_image_decoder(format, transform.limits, writer_decode_options(transform));
      if (!decoder) throw detail::ImageDecodeError(detail::no_codec_message(format, bytes, size));
    }
    return *decoder;
  }
};

ImageWriter::ImageWriter(ImageTransform transform) {
  if (transform.size <= 0) throw std::invalid_argument("ImageTransform.size must be positive");
  state_ = std::make_unique<State>(transform);
}
ImageWriter::~ImageWriter() = default;
ImageWriter::ImageWriter(ImageWriter&&) noexcept = default;
ImageWriter& ImageWriter::operator=(ImageWriter&&) noexcept = default;
const ImageTransform& ImageWriter::transform() const { return state_->transform; }
int ImageWriter::last_scale() const { return state_->last_scale; }
ImageWriter::Timing ImageWriter::last_timing() const { return state_->last_timing; }
const ImagePlan& ImageWriter::last_plan() const { return state_->last_plan; }

void ImageWriter::write(const uint8_t* bytes, size_t size, const SampleContext& ctx,
                        std::byte* out) {
  State& s = *state_;
  std::optional<trace::Range> stage(std::in_place, trace::Name::kDecode);  // for a profiler
  const auto started = std::chrono::steady_clock::now();
  const int side = s.transform.size;
  detail::ImageDecoder& decoder = s.decoder_for(bytes, size);
  const detail::ImageInfo header = decoder.begin(bytes, size);
  const bool swapped = header.orientation >= 5;  // displayed with width and height exchanged
  const int width = swapped ? header.height : header.width;
  const int height = swapped ? header.width : header.height;
  s.last_plan = plan_image(s.transform, width, height, ctx.draw_seed(), ctx.epoch, ctx.index);
  const ViewPlan& view = s.last_plan.views.front();
  const CropBox box{view.x, view.y, view.width, view.height, view.flip};
  const CropBox src_box = stored_box(box, header.orientation, width, height);
  const DecodedImage image =
      decoder.finish_region(src_box.x, src_box.y, src_box.width, src_box.height, side, side);
  s.last_scale = image.scale;
  const auto decoded = std::chrono::steady_clock::now();
  s.last_timing.decode = decoded - started;
  stage.emplace(trace::Name::kResize);
  // The rest of write() is the transform, however it returns.
  struct TransformClock {
    ImageWriter::Timing& timing;
    std::chrono::steady_clock::time_point from;
    ~TransformClock() { timing.transform = std::chrono::steady_clock::now() - from; }
  } transform_clock{s.last_timing, decoded};

  // Decoded RGBX -> size x size RGBX (straight from the decoder's buffer when no resize is
  // needed), upright, flipped if asked, then split into the row's planes or packed as RGB.
  // libyuv does the pixel work (BENCHMARKS.md, "JPEG pipeline"): it calls RGBX "ABGR", and its
  // ARGB functions see the bytes R,G,B,X as B,G,R,A, which only renames the planes below.
  const int row = side * 4;
  const uint8_t* pixels = image.pixels;
  int stride = static_cast<int>(image.stride);
  if (image.width != side || image.height != side) {
    libyuv::ARGBScale(pixels, stride, image.width, image.height, s.scaled.data(), row, side, side,
                      libyuv::kFilterBilinear);
    pixels = s.scaled.data();
    stride = row;
  }
  if (header.orientation != 1) {  // rare: OpenCV turns the square upright
    cv::Mat square(side, side, CV_8UC4, s.scaled.data(), static_cast<size_t>(row));
    if (pixels != s.scaled.data()) {  // the decoder's pixels are read-only
      cv::Mat(side, side, CV_8UC4, const_cast<uint8_t*>(pixels), static_cast<size_t>(stride))
          .copyTo(square);
    }
    cv::Mat upright = orient(square, header.orientation, s.rotated);
    pixels = upright.data;
    stride = static_cast<int>(upright.step);
  }
  if (box.flip) {
    libyuv::ARGBMirror(pixels, stride, s.mirrored.data(), row, side, side);
    pixels = s.mirrored.data();
    stride = row;
  }
  auto* dst = reinterpret_cast<uint8_t*>(out);
  if (s.transform.layout == ImageLayout::kHWC) {
    libyuv::ARGBToRGB24(pixels, stride, dst, side * 3, side, side);  // bytes 0,1,2 of each pixel
    return;
  }
  const size_t plane = static_cast<size_t>(side) * static_cast<size_t>(side);
  // libyuv's "B" plane is byte 0 of each pixel (R), its "R" plane byte 2 (B); X is dropped.
  libyuv::SplitARGBPlane(pixels, stride, dst + 2 * plane, side, dst + plane, side, dst, side,
                         nullptr, 0, side, side);
}

}  // namespace conveyor
