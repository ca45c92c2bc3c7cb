// conveyor/geometry.h: where an annotation of the source image lands in one view of its plan
// (conveyor/image_plan.h). Pure functions of ONE ViewPlan: a plan of several views maps an
// annotation into each by calling them once per view.
//
// What it is for: the fields that follow an image (Field::boxes, Field::points, Field::plan in
// conveyor/fields.h) and users who transform their own annotations in C++ take their arithmetic
// from here, so boxes, points and the image always agree on the crop, the scale and the flip.
//
// Coordinates are continuous pixel coordinates: pixel (i, j) of an image covers [i, i + 1) x
// [j, j + 1), so a box of the whole W x H image is [0, 0, W, H] and its centre is (W/2, H/2).
// A view's box (x, y, width, height) is resized to out_width x out_height: source x maps to
// (x - view.x) * out_width / width, and, when the view is flipped, then to out_width - that
// (likewise for y, never flipped). This is torchvision v2's resized_crop followed by
// horizontal_flip on BoundingBoxes and KeyPoints.
//
// Requires: a view of width, height, out_width, out_height >= 1 (every plan_image() view).
// Guarantees: the same results on every platform (double arithmetic, no library calls that round
// differently); NaN in, NaN out for points (boxes are checked by their field before mapping).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "conveyor/fields.h"  // BoxRule
#include "conveyor/image_plan.h"

namespace conveyor {

// A box in a view's output pixels, XYXY, clipped to [0, out_width] x [0, out_height] and mirrored
// when the view is flipped; `kept` is false when the rule drops it.
struct MappedBox {
  double x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  bool kept = false;
};

// Box [x1, y1, x2, y2] of the source (upright) image, x1 <= x2 and y1 <= y2, in `view`, under
// `rule`: mapped, clipped, mirrored, then kept when its clipped width and height are at least
// rule.min_size and its clipped area is at least rule.min_visibility times its mapped area.
MappedBox map_box(const ViewPlan& view, const std::array<double, 4>& box, const BoxRule& rule);

// A point in a view's output pixels (mapped, never clipped) and whether it lies in the view:
// 0 <= x <= out_width and 0 <= y <= out_height (closed, so that a flip maps the view onto itself;
// NaN is outside).
struct MappedPoint {
  double x = 0, y = 0;
  bool inside = false;
};

MappedPoint map_point(const ViewPlan& view, double x, double y);

// A view as the plan field's row: x, y, width, height, flip (0 or 1), out_width, out_height.
constexpr size_t kPlanRowValues = 7;
std::array<int32_t, kPlanRowValues> plan_row(const ViewPlan& view);

}  // namespace conveyor
