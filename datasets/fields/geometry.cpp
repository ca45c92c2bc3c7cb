// conveyor/geometry.h: the arithmetic that maps a source image's annotations into one view.
#include "conveyor/geometry.h"

#include <algorithm>

namespace conveyor {

namespace {

// Source coordinate -> the view's output coordinate, before any flip.
double map_x(const ViewPlan& view, double x) {
  return (x - view.x) * (static_cast<double>(view.out_width) / view.width);
}
double map_y(const ViewPlan& view, double y) {
  return (y - view.y) * (static_cast<double>(view.out_height) / view.height);
}

}  // namespace

MappedBox map_box(const ViewPlan& view, const std::array<double, 4>& box, const BoxRule& rule) {
  const double w = view.out_width, h = view.out_height;
  const double x1 = map_x(view, box[0]), y1 = map_y(view, box[1]);
  const double x2 = map_x(view, box[2]), y2 = map_y(view, box[3]);
  MappedBox out;
  out.x1 = std::clamp(x1, 0.0, w);
  out.y1 = std::clamp(y1, 0.0, h);
  out.x2 = std::clamp(x2, 0.0, w);
  out.y2 = std::clamp(y2, 0.0, h);
  const double kept_w = out.x2 - out.x1, kept_h = out.y2 - out.y1;
  out.kept = kept_w >= rule.min_size && kept_h >= rule.min_size &&
             kept_w * kept_h >= rule.min_visibility * ((x2 - x1) * (y2 - y1));
  if (view.flip) {
    const double left = w - out.x2;
    out.x2 = w - out.x1;
    out.x1 = left;
  }
  return out;
}

MappedPoint map_point(const ViewPlan& view, double x, double y) {
  MappedPoint out;
  out.x = map_x(view, x);
  out.y = map_y(view, y);
  if (view.flip) out.x = view.out_width - out.x;
  out.inside = out.x >= 0 && out.x <= view.out_width && out.y >= 0 && out.y <= view.out_height;
  return out;
}

std::array<int32_t, kPlanRowValues> plan_row(const ViewPlan& view) {
  return {view.x,         view.y,         view.width, view.height, view.flip ? 1 : 0,
          view.out_width, view.out_height};
}

}  // namespace conveyor
