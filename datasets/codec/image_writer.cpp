// ImageWriter (conveyor/datasets.h): an image file's bytes to one transformed row of a batch. The
// decoder is the codec table's for the format the bytes hold (image_codec.h: by content, never by
// name); the crop is chosen from the header (choose_crop: torchvision's rules, the same for every
// format), the decoder decodes only that region (a JPEG at the smallest DCT scale that covers the
// output), and libyuv resizes, mirrors and splits the pixels into the row (OpenCV only turns an
// EXIF-rotated square upright). An image with several views (ImageTransform::views) is decoded
// once, the bounding box of its views' boxes at the finest scale any of them needs, and each view
// is resized from that decode.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
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
  o.own_entropy_decoder = t.own_entropy_decoder;
  o.entropy_index = t.entropy_index;
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

// Where one view lies in the decode of a region (the union of the views' boxes, or the view's own
// box): the pixels of stored box `b` in a decode of stored box `decoded` at DCT scale
// `scale` / 8, rounded outwards as the decoder rounds a region (JpegDecoder::decode_region), so
// that a view cut from a larger decode at its own scale is the decode of its own box.
struct ViewPixels {
  const uint8_t* pixels;
  int stride, width, height;
};
ViewPixels view_pixels(const DecodedImage& image, const CropBox& decoded, const CropBox& b) {
  const auto floor_scaled = [&](int v) { return static_cast<int>(int64_t{v} * image.scale / 8); };
  const auto ceil_scaled = [&](int v) {
    return static_cast<int>((int64_t{v} * image.scale + 7) / 8);
  };
  const int ox = floor_scaled(decoded.x), oy = floor_scaled(decoded.y);
  const int x1 = std::min(ceil_scaled(b.x + b.width) - ox, image.width);
  const int y1 = std::min(ceil_scaled(b.y + b.height) - oy, image.height);
  const int x0 = std::clamp(floor_scaled(b.x) - ox, 0, x1 - 1);
  const int y0 = std::clamp(floor_scaled(b.y) - oy, 0, y1 - 1);
  const size_t channels = static_cast<size_t>(image.channels);
  return {
      image.pixels + static_cast<size_t>(y0) * image.stride + static_cast<size_t>(x0) * channels,
      static_cast<int>(image.stride), x1 - x0, y1 - y0};
}

// The smallest box holding every box of `boxes` (not empty).
CropBox bounding_box(const std::vector<CropBox>& boxes) {
  int x0 = boxes.front().x, y0 = boxes.front().y;
  int x1 = x0 + boxes.front().width, y1 = y0 + boxes.front().height;
  for (const CropBox& b : boxes) {
    x0 = std::min(x0, b.x);
    y0 = std::min(y0, b.y);
    x1 = std::max(x1, b.x + b.width);
    y1 = std::max(y1, b.y + b.height);
  }
  return {x0, y0, x1 - x0, y1 - y0, false};
}

}  // namespace

size_t view_bytes(const ImageTransform& transform, size_t group) {
  const size_t side = static_cast<size_t>(view_groups(transform).at(group).transform.size);
  return side * side * 3;
}

struct ImageWriter::State {
  ImageTransform transform;
  ImageOutput output;             // RGB uint8 unless asked
  std::vector<ViewGroup> groups;  // view_groups(transform)
  // One decoder per format met so far (the codec table's, image_codec.h), made on first use.
  std::array<std::unique_ptr<detail::ImageDecoder>, detail::kImageFormatCount> decoders;
  std::vector<uint8_t> scaled;         // side x side RGBX scratch (the largest group's), reused
  std::vector<uint8_t> mirrored;       // side x side RGBX scratch for the flip, reused
  cv::Mat rotated;                     // side x side RGBX scratch for EXIF rotations, reused
  std::vector<uint8_t> gray;           // an output other than RGB: the region's L as 4-byte pixels
  std::vector<uint16_t> wide_in;       // the region's plane of one channel, 16 bits
  std::vector<uint16_t> plane16;       // side x side, one channel, 16 bits
  std::vector<CropBox> stored;         // the plan's boxes in stored pixels, reused
  std::vector<std::byte*> group_rows;  // write()'s rows per group, reused
  int last_scale = 8;
  ImagePlan last_plan;  // the plan the last write executed
  ImageWriter::Timing last_timing;
  State(ImageTransform t, const ImageOutput& o) : transform(t), output(o), groups(view_groups(t)) {
    int side = 0;
    for (const ViewGroup& g : groups) side = std::max(side, g.transform.size);
    const size_t bytes = static_cast<size_t>(side) * static_cast<size_t>(side) * 4;
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

  // One view's decoded pixels (stored orientation, RGBX) -> its side x side row: resized (straight
  // from the decoder's buffer when no resize is needed), upright, flipped if asked, then split
  // into the row's planes or packed as RGB. libyuv does the pixel work (BENCHMARKS.md, "JPEG
  // pipeline"): it calls RGBX "ABGR", and its ARGB functions see the bytes R,G,B,X as B,G,R,A,
  // which only renames the planes below.
  void finish_view(ViewPixels in, int side, int orientation, bool flip, uint8_t* dst) {
    const ViewPixels upright = upright_rgbx(in, side, orientation, flip);
    const uint8_t* pixels = upright.pixels;
    const int stride = upright.stride;
    if (transform.layout == ImageLayout::kHWC) {
      libyuv::ARGBToRGB24(pixels, stride, dst, side * 3, side, side);  // bytes 0,1,2 of each pixel
      return;
    }
    const size_t plane = static_cast<size_t>(side) * static_cast<size_t>(side);
    // libyuv's "B" plane is byte 0 of each pixel (R), its "R" plane byte 2 (B); X is dropped.
    libyuv::SplitARGBPlane(pixels, stride, dst + 2 * plane, side, dst + plane, side, dst, side,
                           nullptr, 0, side, side);
  }

  // finish_view()'s pixel work before the layout: the view resized to side x side, upright and
  // flipped if asked, as RGBX pixels in the decoder's buffer or a scratch buffer.
  ViewPixels upright_rgbx(ViewPixels in, int side, int orientation, bool flip) {
    const int row = side * 4;
    const uint8_t* pixels = in.pixels;
    int stride = in.stride;
    if (in.width != side || in.height != side) {
      libyuv::ARGBScale(pixels, stride, in.width, in.height, scaled.data(), row, side, side,
                        libyuv::kFilterBilinear);
      pixels = scaled.data();
      stride = row;
    }
    if (orientation != 1) {  // rare: OpenCV turns the square upright
      cv::Mat square(side, side, CV_8UC4, scaled.data(), static_cast<size_t>(row));
      if (pixels != scaled.data()) {  // the decoder's pixels are read-only
        cv::Mat(side, side, CV_8UC4, const_cast<uint8_t*>(pixels), static_cast<size_t>(stride))
            .copyTo(square);
      }
      cv::Mat upright = orient(square, orientation, rotated);
      pixels = upright.data;
      stride = static_cast<int>(upright.step);
    }
    if (flip) {
      libyuv::ARGBMirror(pixels, stride, mirrored.data(), row, side, side);
      pixels = mirrored.data();
      stride = row;
    }
    return {pixels, stride, side, side};
  }

  // An output other than RGB uint8 (ImageOutput): one view's RGBA region (stored orientation) ->
  // its row of output.channels() planes (CHW) or interleaved samples (HWC), uint8 or uint16.
  // 8-bit samples take finish_view()'s own steps (upright_rgbx), so RGBA's R, G, B are the RGB
  // row's bytes and L is resized by the same filter; 16-bit samples go plane by plane through
  // libyuv's 16-bit bilinear plane scaler (the same box and sampling positions; libyuv has no
  // 16-bit ARGBScale), then OpenCV's rotations and flip.
  void finish_output_view(const detail::RgbaRegion& in, int side, int orientation, bool flip,
                          uint8_t* dst) {
    const size_t area = static_cast<size_t>(side) * static_cast<size_t>(side);
    const int channels = output.channels();
    const size_t in_area = static_cast<size_t>(in.width) * static_cast<size_t>(in.height);
    if (in.bit_depth == 8 && output.mode != ImageOutput::Mode::kL) {
      const ViewPixels upright = upright_rgbx(
          {in.pixels, static_cast<int>(in.stride), in.width, in.height}, side, orientation, flip);
      for (int y = 0; y < side; ++y) {
        const uint8_t* from = upright.pixels + static_cast<size_t>(y) * upright.stride;
        for (int x = 0; x < side; ++x, from += 4) {
          const size_t at = static_cast<size_t>(y) * static_cast<size_t>(side) + x;
          for (int c = 0; c < channels; ++c) {
            put(dst, at, c, c == 3 && !in.alpha ? uint16_t{255} : from[c], side, true);
          }
        }
      }
      return;
    }
    if (in.bit_depth == 8) {
      // L from 8-bit pixels, converted before the resize, in the first byte of 4-byte pixels:
      // libyuv's ScalePlane rounds otherwise than ARGBScale (up to 3 apart on the same samples),
      // so L goes through the RGB path's own steps (upright_rgbx), which keeps its filter.
      if (gray.size() < in_area * 4) gray.resize(in_area * 4);
      for (int y = 0; y < in.height; ++y) {
        const uint8_t* from = in.pixels + static_cast<size_t>(y) * in.stride;
        uint8_t* to = gray.data() + static_cast<size_t>(y) * static_cast<size_t>(in.width) * 4;
        for (int x = 0; x < in.width; ++x, from += 4, to += 4) {
          to[0] = static_cast<uint8_t>(
              (from[0] * 19595u + from[1] * 38470u + from[2] * 7471u + 0x8000u) >> 16);
        }
      }
      const ViewPixels upright =
          upright_rgbx({gray.data(), in.width * 4, in.width, in.height}, side, orientation, flip);
      for (int y = 0; y < side; ++y) {
        const uint8_t* from = upright.pixels + static_cast<size_t>(y) * upright.stride;
        for (int x = 0; x < side; ++x, from += 4) {
          put(dst, static_cast<size_t>(y) * static_cast<size_t>(side) + x, 0, from[0], side, true);
        }
      }
      return;
    }
    // 16-bit samples: each output channel's plane of the region, resized and turned alone.
    if (wide_in.size() < in_area) wide_in.resize(in_area);
    for (int c = 0; c < channels; ++c) {
      for (int y = 0; y < in.height; ++y) {
        const uint8_t* from = in.pixels + static_cast<size_t>(y) * in.stride;
        uint16_t* to = wide_in.data() + static_cast<size_t>(y) * static_cast<size_t>(in.width);
        for (int x = 0; x < in.width; ++x, from += 8) {
          uint16_t rgba[4];
          std::memcpy(rgba, from, sizeof rgba);
          if (output.mode == ImageOutput::Mode::kL) {
            to[x] = static_cast<uint16_t>((uint64_t{rgba[0]} * 19595u + uint64_t{rgba[1]} * 38470u +
                                           uint64_t{rgba[2]} * 7471u + 0x8000u) >>
                                          16);
          } else {
            to[x] = c == 3 && !in.alpha ? uint16_t{65535} : rgba[c];
          }
        }
      }
      const uint16_t* plane =
          upright_plane(wide_in.data(), in.width, in.height, side, orientation, flip, plane16);
      for (size_t at = 0; at < area; ++at) put(dst, at, c, plane[at], side, false);
    }
  }

  // A plane of width x height 16-bit samples (contiguous) resized to side x side (libyuv's
  // bilinear filter), turned upright and mirrored if asked: contiguous in `out`.
  const uint16_t* upright_plane(const uint16_t* in, int width, int height, int side,
                                int orientation, bool flip, std::vector<uint16_t>& out) {
    const size_t area = static_cast<size_t>(side) * static_cast<size_t>(side);
    if (out.size() < area) out.resize(area);
    if (width != side || height != side) {
      libyuv::ScalePlane_16(in, width, width, height, out.data(), side, side, side,
                            libyuv::kFilterBilinear);
    } else {
      std::copy(in, in + area, out.data());
    }
    cv::Mat square(side, side, CV_16UC1, out.data());
    if (orientation != 1) {
      cv::Mat upright = orient(square, orientation, rotated);
      if (upright.data != square.data) upright.copyTo(square);
    }
    if (flip) cv::flip(square, square, 1);
    return out.data();
  }

  // Sample `at` (y * side + x) of channel `c` into the output row: its layout and dtype; an
  // 8-bit value (`narrow`) in a uint16 row is v * 257.
  void put(uint8_t* dst, size_t at, int c, uint16_t v, int side, bool narrow) const {
    const size_t channels = static_cast<size_t>(output.channels());
    const size_t index =
        transform.layout == ImageLayout::kHWC
            ? at * channels + static_cast<size_t>(c)
            : static_cast<size_t>(c) * static_cast<size_t>(side) * static_cast<size_t>(side) + at;
    if (output.dtype == c10::ScalarType::Byte) {
      dst[index] = static_cast<uint8_t>(v);
      return;
    }
    const uint16_t wide = narrow ? static_cast<uint16_t>(v * 257u) : v;
    std::memcpy(dst + 2 * index, &wide, sizeof wide);
  }
};

ImageWriter::ImageWriter(ImageTransform transform) : ImageWriter(transform, ImageOutput{}) {}

ImageWriter::ImageWriter(ImageTransform transform, const ImageOutput& output) {
  if (transform.size <= 0) throw std::invalid_argument("ImageTransform.size must be positive");
  output.check("ImageWriter");
  if (!output.is_default() && !transform.views.empty()) {
    throw std::invalid_argument(
        "ImageWriter: an image with views is RGB uint8 (the default output), for now");
  }
  state_ = std::make_unique<State>(transform, output);  // view_groups() checks the groups
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
  s.group_rows.clear();
  for (size_t g = 0; g < s.groups.size(); ++g) {
    s.group_rows.push_back(out);
    out += static_cast<size_t>(s.groups[g].count) * view_bytes(s.transform, g);
  }
  write_groups(bytes, size, ctx, s.group_rows.data());
}

void ImageWriter::write_groups(const uint8_t* bytes, size_t size, const SampleContext& ctx,
                               std::byte* const* group_rows) {
  State& s = *state_;
  std::optional<trace::Range> stage(std::in_place, trace::Name::kDecode);  // for a profiler
  const auto started = std::chrono::steady_clock::now();
  detail::ImageDecoder& decoder = s.decoder_for(bytes, size);
  const detail::ImageInfo header = decoder.begin(bytes, size);
  const bool swapped = header.orientation >= 5;  // displayed with width and height exchanged
  const int width = swapped ? header.height : header.width;
  const int height = swapped ? header.width : header.height;
  s.last_plan = plan_image(s.transform, width, height, ctx.draw_seed(), ctx.epoch, ctx.index);
  const std::vector<ViewPlan>& views = s.last_plan.views;
  s.stored.clear();
  for (const ViewPlan& v : views) {
    s.stored.push_back(
        stored_box({v.x, v.y, v.width, v.height, v.flip}, header.orientation, width, height));
  }
  // Where each view goes: its group's row, after the group's earlier views.
  const auto destination = [&](const ViewPlan& v) {
    const size_t first =
        static_cast<size_t>(std::find_if(views.begin(), views.end(),
                                         [&](const ViewPlan& u) { return u.group == v.group; }) -
                            views.begin());
    const size_t bytes_per_view = view_bytes(s.transform, static_cast<size_t>(v.group));
    return reinterpret_cast<uint8_t*>(group_rows[v.group]) +
           (static_cast<size_t>(v.view) - first) * bytes_per_view;
  };
  // The rest of write_groups() is the transform, however it returns.
  struct TransformClock {
    ImageWriter::Timing& timing;
    std::chrono::steady_clock::time_point from;
    std::chrono::nanoseconds decoding{0};
    ~TransformClock() {
      timing.decode = decoding;
      timing.transform = std::chrono::steady_clock::now() - from - decoding;
    }
  } clock{s.last_timing, started};

  if (views.size() == 1 || !s.transform.decode_views_once) {
    // Each view decoded on its own: its box at the smallest DCT scale covering its output.
    s.last_scale = 1;
    for (size_t i = 0; i < views.size(); ++i) {
      const auto decode_started = i == 0 ? started : std::chrono::steady_clock::now();
      if (i > 0) {
        stage.emplace(trace::Name::kDecode);
        decoder.begin(bytes, size);
      }
      const CropBox& b = s.stored[i];
      if (!s.output.is_default()) {  // no views: this is the one view
        const detail::RgbaRegion region =
            decoder.finish_rgba(b.x, b.y, b.width, b.height, views[i].out_width,
                                views[i].out_height, s.output.dtype == c10::ScalarType::UInt16);
        s.last_scale = region.scale;
        clock.decoding += std::chrono::steady_clock::now() - decode_started;
        stage.emplace(trace::Name::kResize);
        s.finish_output_view(region, views[i].out_width, header.orientation, views[i].flip,
                             destination(views[i]));
        return;
      }
      const DecodedImage image = decoder.finish_region(b.x, b.y, b.width, b.height,
                                                       views[i].out_width, views[i].out_height);
      s.last_scale = std::max(s.last_scale, image.scale);
      clock.decoding += std::chrono::steady_clock::now() - decode_started;
      stage.emplace(trace::Name::kResize);
      s.finish_view({image.pixels, static_cast<int>(image.stride), image.width, image.height},
                    views[i].out_width, header.orientation, views[i].flip, destination(views[i]));
    }
    return;
  }
  // One decode for every view: the bounding box of their boxes at the finest DCT scale any view
  // needs alone, so a view decoded at its own scale is the bytes it has alone, and a view whose
  // own scale is coarser is resized from sharper pixels (docs/design.md, "Views").
  const DecodeOptions options = writer_decode_options(s.transform);
  int scale = 1;
  for (size_t i = 0; i < views.size(); ++i) {
    const CropBox& b = s.stored[i];
    scale = std::max(scale, detail::dct_scale_for(b.width, b.height, views[i].out_width,
                                                  views[i].out_height, options));
  }
  const CropBox all = bounding_box(s.stored);
  const int min_width = static_cast<int>((int64_t{all.width} * scale + 7) / 8);
  const int min_height = static_cast<int>((int64_t{all.height} * scale + 7) / 8);
  const DecodedImage image =
      decoder.finish_region(all.x, all.y, all.width, all.height, min_width, min_height);
  s.last_scale = image.scale;
  clock.decoding = std::chrono::steady_clock::now() - started;
  stage.emplace(trace::Name::kResize);
  for (size_t i = 0; i < views.size(); ++i) {
    s.finish_view(view_pixels(image, all, s.stored[i]), views[i].out_width, header.orientation,
                  views[i].flip, destination(views[i]));
  }
}

}  // namespace conveyor
