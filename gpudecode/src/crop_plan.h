// gpudecode/src/crop_plan.h (build-only): the per-pixel math of the GPU crop kernel, as plain
// functions that compile for the host and the device, so that a CPU test runs exactly the math the
// kernel runs (gpudecode_test, CropPlan.*) against the CPU path (ImageWriter).
//
// The CPU path (datasets/codec/image_writer.cpp) decodes a crop box at the smallest DCT scale M/8
// that keeps it at least `size` pixels on each side, then resizes the decoded region to size x size
// with libyuv's ARGBScale(kFilterBilinear) and mirrors it when the sample is flipped. nvJPEG's
// hardware backend decodes the box's region at full scale, so the kernel follows the same steps on
// it:
//   1. the region the CPU decodes at scale M/8 (rounded outwards to whole scaled pixels) is decoded
//      at 8/8 instead (plan_crop: the ROI); each scaled pixel is the mean of the f x f full-scale
//      pixels it stands for (f = 8/M), which is what the scaled IDCT approximates;
//   2. that scaled region is resized with libyuv's bilinear geometry and arithmetic: its 16.16
//      fixed-point start and step (ScaleSlope: the filter centred when shrinking, the end pixels
//      kept when enlarging), 8-bit vertical and 7-bit horizontal weights, the vertical pass first
//      when shrinking vertically (ScaleARGBBilinearDown) and the horizontal pass first when
//      enlarging (ScaleARGBBilinearUp). libyuv's 7-bit horizontal weights sum to 127, not 128, so
//      its output (and therefore the CPU path's) is up to 2 levels darker than exact bilinear (255
//      becomes 253); the kernel does the same, so that both decoders agree;
//   3. the mirror for a flipped sample, and the row written as CHW planes or HWC pixels.
// Only the power-of-two scales (1/8, 2/8, 4/8, 8/8) that ImageTransform::dct_scales allows are
// considered; with a mask holding other scales the CPU may pick, say, 3/8 where the GPU picks 4/8:
// the same box, resized from another intermediate size.
//
// Guarantees: for a scale of 8/8, the output equals the CPU path's for the same decoded pixels
// (gpudecode_test: byte for byte against libyuv on random images of every size relation, and
// against ImageWriter on photos decoded at 8/8); at M/8 < 8/8 the box mean stands in for
// libjpeg-turbo's scaled IDCT (measured there: max abs diff 18, PSNR >= 48.8 dB on photos). Pure
// functions; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CONVEYOR_HOST_DEVICE __host__ __device__
#else
#define CONVEYOR_HOST_DEVICE
#endif

namespace conveyor::gpudecode {

// Which of libyuv's ARGBScale paths the CPU path's resize takes for a scaled region (libyuv
// picks one from the sizes alone; each rounds in its own way).
enum class ResizePath : int {
  kCopy,          // the region is already side x side: ImageWriter copies it
  kBox,           // an even whole-number step both ways: 2x2 box means (ScaleARGBDown2/DownEven)
  kPoint,         // an odd whole-number step both ways, or a reduced filter: nearest samples
  kVertical,      // the same width: rows blended only (ScalePlaneVertical)
  kHorizontal,    // the same height (or 3x): columns blended only (kFilterLinear)
  kBilinearDown,  // rows blended, then columns (ScaleARGBBilinearDown)
  kBilinearUp,    // columns blended, then rows (ScaleARGBBilinearUp: enlarging vertically)
};

// How one image's crop becomes a size x size row.
struct CropPlan {
  // The region decoded at full scale (nvJPEG's ROI), in source pixels.
  int roi_x = 0, roi_y = 0, roi_w = 0, roi_h = 0;
  // Scaled pixel (i, j) is the mean of ROI pixels [i*factor, (i+1)*factor) x [j*factor, ...),
  // clipped to the ROI; factor = 8 / M for the DCT scale M/8 the CPU path would use.
  int factor = 1;
  int scaled_w = 0, scaled_h = 0;  // the scaled region the resize reads
  // libyuv's geometry over the scaled region: the source x of output column c is x0 + c * dx
  // (16.16 fixed point), likewise y.
  int64_t x0 = 0, dx = 0, y0 = 0, dy = 0;
  ResizePath path = ResizePath::kCopy;
  int side = 0;       // output height and width
  bool flip = false;  // mirrored horizontally
  bool hwc = false;   // the row's layout: HWC pixels, else CHW planes
};

CONVEYOR_HOST_DEVICE inline int min_int(int a, int b) { return a < b ? a : b; }
CONVEYOR_HOST_DEVICE inline int max_int(int a, int b) { return a > b ? a : b; }

// libyuv's ScaleSlope for a blending filter, one axis: the start and step of `dst` samples over
// `src` (centred when shrinking, the end pixels kept when enlarging).
CONVEYOR_HOST_DEVICE inline void blend_slope(int src, int dst, int64_t& start, int64_t& step) {
  start = 0;
  step = 0;
  if (dst <= src) {
    step = (static_cast<int64_t>(src) << 16) / dst;
    start = (step >> 1) - 32768;
  } else if (src > 1 && dst > 1) {
    step = ((static_cast<int64_t>(src) << 16) - 0x00010001) / (dst - 1);
  }
}

// libyuv's choice of path and geometry for ARGBScale(src_w x src_h -> side x side, bilinear), in
// the order its ScaleARGB makes it: the filter reduced by the sizes (ScaleFilterReduce), the slope
// for that filter (ScaleSlope), then the whole-number steps and the unscaled width.
CONVEYOR_HOST_DEVICE inline void plan_resize(CropPlan& p) {
  const int w = p.scaled_w, h = p.scaled_h, s = p.side;
  if (w == s && h == s) {
    p.path = ResizePath::kCopy;
    return;
  }
  enum { kNone, kLinear, kBilinear } filter = kBilinear;
  if (h == 1 || s == h || s * 3 == h) filter = kLinear;
  if (w == 1) filter = kNone;
  if (filter == kLinear && (s == w || s * 3 == w)) filter = kNone;
  if (filter == kBilinear) {
    blend_slope(w, s, p.x0, p.dx);
    blend_slope(h, s, p.y0, p.dy);
  } else if (filter == kLinear) {
    blend_slope(w, s, p.x0, p.dx);
    p.dy = (static_cast<int64_t>(h) << 16) / s;
    p.y0 = p.dy >> 1;
  } else {
    p.dx = (static_cast<int64_t>(w) << 16) / s;
    p.dy = (static_cast<int64_t>(h) << 16) / s;
    p.x0 = p.dx >> 1;
    p.y0 = p.dy >> 1;
  }
  if (((p.dx | p.dy) & 0xffff) == 0) {
    if (p.dx == 0 || p.dy == 0) {
      filter = kNone;
    } else if ((p.dx & 0x10000) == 0 && (p.dy & 0x10000) == 0) {
      p.path = filter == kNone ? ResizePath::kPoint : ResizePath::kBox;
      return;
    } else if ((p.dx & 0x10000) != 0 && (p.dy & 0x10000) != 0) {
      filter = kNone;
    }
  }
  if (p.dx == 0x10000 && (p.x0 & 0xffff) == 0) {
    p.path = filter == kNone ? ResizePath::kPoint : ResizePath::kVertical;
  } else if (filter == kNone) {
    p.path = ResizePath::kPoint;
  } else if (filter == kLinear) {
    p.path = ResizePath::kHorizontal;
  } else {
    p.path = p.dy < 65536 ? ResizePath::kBilinearUp : ResizePath::kBilinearDown;
  }
}

// The plan for a crop `box` (source pixels, clamped as JpegDecoder clamps it) of a width x height
// image, for a `side` x `side` output, with DCT scales allowed by `dct_scales` (bit M: M/8).
CONVEYOR_HOST_DEVICE inline CropPlan plan_crop(int width, int height, int box_x, int box_y,
                                               int box_w, int box_h, bool flip, int side,
                                               unsigned dct_scales, bool hwc) {
  CropPlan p;
  box_x = min_int(max_int(box_x, 0), width - 1);
  box_y = min_int(max_int(box_y, 0), height - 1);
  box_w = min_int(max_int(box_w, 1), width - box_x);
  box_h = min_int(max_int(box_h, 1), height - box_y);
  int scale = 8;
  for (int m = 1; m <= 4; m *= 2) {  // the smallest allowed power-of-two scale that covers side
    if ((dct_scales >> m & 1u) == 0) continue;
    if ((static_cast<int64_t>(box_w) * m + 7) / 8 >= side &&
        (static_cast<int64_t>(box_h) * m + 7) / 8 >= side) {
      scale = m;
      break;
    }
  }
  const int f = 8 / scale;
  // The scaled region, rounded outwards, as JpegDecoder's read_rows computes it.
  const int out_w = static_cast<int>((static_cast<int64_t>(width) * scale + 7) / 8);
  const int out_h = static_cast<int>((static_cast<int64_t>(height) * scale + 7) / 8);
  const int sx1 = min_int(out_w, static_cast<int>(((box_x + box_w) * int64_t{scale} + 7) / 8));
  const int sy1 = min_int(out_h, static_cast<int>(((box_y + box_h) * int64_t{scale} + 7) / 8));
  const int sx0 = min_int(static_cast<int>(box_x * int64_t{scale} / 8), sx1 - 1);
  const int sy0 = min_int(static_cast<int>(box_y * int64_t{scale} / 8), sy1 - 1);
  p.factor = f;
  p.scaled_w = sx1 - sx0;
  p.scaled_h = sy1 - sy0;
  p.roi_x = sx0 * f;
  p.roi_y = sy0 * f;
  p.roi_w = min_int(width, sx1 * f) - p.roi_x;
  p.roi_h = min_int(height, sy1 * f) - p.roi_y;
  p.side = side;
  p.flip = flip;
  p.hwc = hwc;
  plan_resize(p);
  return p;
}

// The region nvJPEG decodes for a plan of a width x height image: the plan's ROI widened to whole
// 16 x 16 blocks (the largest MCU) and clamped to the image, so that no MCU is cut. nvJPEG writes
// it as h rows of w interleaved RGB pixels, region_pitch() bytes apart.
struct DecodedRegion {
  int x = 0, y = 0, w = 0, h = 0;
};
CONVEYOR_HOST_DEVICE inline DecodedRegion decoded_region(const CropPlan& p, int width, int height) {
  DecodedRegion r;
  r.x = p.roi_x / 16 * 16;
  r.y = p.roi_y / 16 * 16;
  r.w = min_int(width, (p.roi_x + p.roi_w + 15) / 16 * 16) - r.x;
  r.h = min_int(height, (p.roi_y + p.roi_h + 15) / 16 * 16) - r.y;
  return r;
}
CONVEYOR_HOST_DEVICE inline size_t region_pitch(const DecodedRegion& r) {
  return static_cast<size_t>(r.w) * 3;
}
// Where the plan's ROI starts in the decoded region, in bytes: what the kernel reads as `roi`.
CONVEYOR_HOST_DEVICE inline size_t roi_offset(const CropPlan& p, const DecodedRegion& r) {
  return static_cast<size_t>(p.roi_y - r.y) * region_pitch(r) +
         static_cast<size_t>(p.roi_x - r.x) * 3;
}

// Channel c of scaled pixel (i, j): the rounded mean of the ROI pixels it stands for. `roi` holds
// roi_h rows of roi_w interleaved RGB pixels, `pitch` bytes apart.
CONVEYOR_HOST_DEVICE inline int scaled_pixel(const uint8_t* roi, size_t pitch, const CropPlan& p,
                                             int i, int j, int c) {
  i = min_int(max_int(i, 0), p.scaled_w - 1);
  j = min_int(max_int(j, 0), p.scaled_h - 1);
  if (p.factor == 1) return roi[static_cast<size_t>(j) * pitch + static_cast<size_t>(i) * 3 + c];
  const int x0 = i * p.factor, y0 = j * p.factor;
  const int x1 = min_int(x0 + p.factor, p.roi_w), y1 = min_int(y0 + p.factor, p.roi_h);
  int sum = 0;
  for (int y = y0; y < y1; ++y) {
    const uint8_t* row = roi + static_cast<size_t>(y) * pitch + c;
    for (int x = x0; x < x1; ++x) sum += row[static_cast<size_t>(x) * 3];
  }
  const int n = (x1 - x0) * (y1 - y0);
  return (sum + n / 2) / n;
}

// libyuv's InterpolateRow (8-bit weight f of b) and ScaleARGBFilterCols (7-bit weight f of b,
// with weights 127 - f and f).
CONVEYOR_HOST_DEVICE inline int blend_rows(int a, int b, int f) {
  return f == 0 ? a : (a * (256 - f) + b * f + 128) >> 8;
}
CONVEYOR_HOST_DEVICE inline int blend_cols(int a, int b, int f) {
  return (a * (127 - f) + b * f) >> 7;
}

// Output pixel (ox, oy) of the plan: its three channels in `rgb`.
CONVEYOR_HOST_DEVICE inline void crop_pixel(const uint8_t* roi, size_t pitch, const CropPlan& p,
                                            int ox, int oy, uint8_t rgb[3]) {
  const int column = p.flip ? p.side - 1 - ox : ox;
  if (p.path == ResizePath::kCopy) {
    for (int c = 0; c < 3; ++c)
      rgb[c] = static_cast<uint8_t>(scaled_pixel(roi, pitch, p, column, oy, c));
    return;
  }
  const int64_t x = p.x0 + column * p.dx;
  int64_t y = p.y0 + oy * p.dy;
  const int64_t max_y = static_cast<int64_t>(p.scaled_h - 1) << 16;
  if (p.path != ResizePath::kBox && p.path != ResizePath::kPoint && y > max_y) y = max_y;
  const int xi = static_cast<int>(x >> 16), yi = static_cast<int>(y >> 16);
  const int xf = static_cast<int>((x >> 9) & 0x7f), yf = static_cast<int>((y >> 8) & 0xff);
  for (int c = 0; c < 3; ++c) {
    const int tl = scaled_pixel(roi, pitch, p, xi, yi, c);
    int v = tl;
    switch (p.path) {
      case ResizePath::kBox: {
        const int tr = scaled_pixel(roi, pitch, p, xi + 1, yi, c);
        const int bl = scaled_pixel(roi, pitch, p, xi, yi + 1, c);
        const int br = scaled_pixel(roi, pitch, p, xi + 1, yi + 1, c);
        // libyuv's SIMD rows (4 pixels at a time) average twice with rounding (pavgb), rows
        // first; the last side % 4 pixels of a row go through its C code, one rounding.
        v = column < (p.side & ~3) ? (((tl + bl + 1) >> 1) + ((tr + br + 1) >> 1) + 1) >> 1
                                   : (tl + tr + bl + br + 2) >> 2;
        break;
      }
      case ResizePath::kVertical:
        v = blend_rows(tl, scaled_pixel(roi, pitch, p, xi, yi + 1, c), yf);
        break;
      case ResizePath::kHorizontal:
        v = blend_cols(tl, scaled_pixel(roi, pitch, p, xi + 1, yi, c), xf);
        break;
      case ResizePath::kBilinearDown:
        v = blend_cols(blend_rows(tl, scaled_pixel(roi, pitch, p, xi, yi + 1, c), yf),
                       blend_rows(scaled_pixel(roi, pitch, p, xi + 1, yi, c),
                                  scaled_pixel(roi, pitch, p, xi + 1, yi + 1, c), yf),
                       xf);
        break;
      case ResizePath::kBilinearUp:
        v = blend_rows(blend_cols(tl, scaled_pixel(roi, pitch, p, xi + 1, yi, c), xf),
                       blend_cols(scaled_pixel(roi, pitch, p, xi, yi + 1, c),
                                  scaled_pixel(roi, pitch, p, xi + 1, yi + 1, c), xf),
                       yf);
        break;
      default:  // kPoint
        break;
    }
    rgb[c] = static_cast<uint8_t>(v);
  }
}

// Where channel c of output pixel (ox, oy) goes in the row.
CONVEYOR_HOST_DEVICE inline size_t output_offset(const CropPlan& p, int ox, int oy, int c) {
  const size_t side = static_cast<size_t>(p.side);
  const size_t pixel = static_cast<size_t>(oy) * side + static_cast<size_t>(ox);
  return p.hwc ? pixel * 3 + static_cast<size_t>(c) : static_cast<size_t>(c) * side * side + pixel;
}

}  // namespace conveyor::gpudecode
