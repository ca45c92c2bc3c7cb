// The points field (conveyor/fields.h): [N, 2] (x, y) or [N, 3] (x, y, visibility) points in the
// upright image's pixels that follow an image field's plan, mapped into the view by map_point
// (conveyor/geometry.h) and never clipped: [N, 3] float32 whose visibility is the member's (1
// for an [N, 2] member) inside the view and 0 outside it. A point of visibility 0 is carried as
// it maps (its coordinates may be anything, NaN included); any other must be finite. Points that
// follow a group of views are mapped into each view in turn, view after view, with each view's
// count (the member's rows) in the per-view counts row.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "conveyor/geometry.h"
#include "fields/field_writer.h"
#include "fields/number_rows.h"

namespace conveyor::detail {

namespace {

class PointWriter final : public FieldWriter {
 public:
  PointWriter(std::string name, const Field& field, const FieldSpec& spec, size_t views)
      : name_(std::move(name)), views_(views) {
    shape_.items = "points";
    shape_.min_columns = 2;
    shape_.max_columns = 3;
    shape_.flat_columns = static_cast<size_t>(field.point_columns);
    // The row holds each view's points: the member holds at most a view's room.
    shape_.max_rows = spec.max_items / std::max<size_t>(views, 1);
    shape_.max_bytes = shape_.max_rows * spec.item_bytes();
  }

  void write(const Member&, const SampleContext&, std::byte*) override {
    throw std::logic_error("conveyor: " + field_label(name_) + " written without its image's plan");
  }

  void write_following(const Member& member, const SampleContext&, const ImagePlan& plan,
                       std::byte* const* rows) override {
    read_number_rows(name_, member, shape_, points_);
    if (plan.views.size() != std::max<size_t>(views_, 1)) {
      throw std::logic_error("conveyor: " + field_label(name_) + " follows a plan of " +
                             std::to_string(plan.views.size()) + " views, not its " +
                             std::to_string(std::max<size_t>(views_, 1)));
    }
    const size_t columns = points_.columns;
    for (size_t r = 0; r < points_.rows; ++r) {
      const double* p = points_.values.data() + columns * r;
      const double visibility = columns == 3 ? p[2] : 1.0;
      if (visibility != 0 && !(std::isfinite(p[0]) && std::isfinite(p[1]))) {
        throw std::runtime_error(field_label(name_) + ": point " + std::to_string(r) + " (" +
                                 std::to_string(p[0]) + ", " + std::to_string(p[1]) +
                                 ") is not finite and its visibility is not 0");
      }
    }
    RaggedRow out(rows[0]);
    auto* values = reinterpret_cast<float*>(out.items());
    for (size_t v = 0; v < plan.views.size(); ++v) {
      for (size_t r = 0; r < points_.rows; ++r) {
        const double* p = points_.values.data() + columns * r;
        const double visibility = columns == 3 ? p[2] : 1.0;
        const MappedPoint m = map_point(plan.views[v], p[0], p[1]);
        float* o = values + 3 * (v * points_.rows + r);
        o[0] = static_cast<float>(m.x);
        o[1] = static_cast<float>(m.y);
        o[2] = m.inside ? static_cast<float>(visibility) : 0.0f;
      }
      if (views_ > 0) {
        const auto count = static_cast<int64_t>(points_.rows);
        std::memcpy(rows[1] + v * sizeof count, &count, sizeof count);
      }
    }
    out.set_count(static_cast<int64_t>(plan.views.size() * points_.rows));
  }

 private:
  std::string name_;
  size_t views_;  // the group's count for points that follow a group of views; 0 otherwise
  RowShape shape_;
  NumberRows points_;  // the member's points, reused
};

}  // namespace

std::unique_ptr<FieldWriter> make_point_writer(const std::string& name, const Field& field,
                                               const FieldSpec& spec, size_t views) {
  return std::make_unique<PointWriter>(name, field, spec, views);
}

}  // namespace conveyor::detail
