// The boxes field (conveyor/fields.h): [N, 4] XYXY boxes in the upright image's pixels that
// follow an image field's plan. Each box is checked (finite, x1 <= x2, y1 <= y2, inside the
// image), then mapped into the view by map_box (conveyor/geometry.h): clipped, mirrored with the
// view, and dropped under the field's BoxRule. The rows kept are published, for FieldSource to
// drop the same rows of the fields paired with the boxes (their class labels). Boxes that follow
// a group of views are mapped into each view in turn, view after view, with each view's count
// in the per-view counts row.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/geometry.h"
#include "fields/field_writer.h"
#include "fields/number_rows.h"

namespace conveyor::detail {

namespace {

std::string box_text(const double* b) {
  std::string s = "[";
  for (int i = 0; i < 4; ++i) s += (i ? ", " : "") + std::to_string(b[i]);
  return s + "]";
}

class BoxWriter final : public FieldWriter {
 public:
  BoxWriter(std::string name, const Field& field, const FieldSpec& spec, size_t views)
      : name_(std::move(name)), follows_(field.follows), rule_(field.box_rule), views_(views) {
    shape_.items = "boxes";
    shape_.min_columns = shape_.max_columns = shape_.flat_columns = 4;
    // The row holds each view's boxes: the member holds at most a view's room.
    shape_.max_rows = spec.max_items / std::max<size_t>(views, 1);
    shape_.max_bytes = shape_.max_rows * spec.item_bytes();
  }

  void write(const Member&, const SampleContext&, std::byte*) override {
    throw std::logic_error("conveyor: " + field_label(name_) + " written without its image's plan");
  }

  void write_following(const Member& member, const SampleContext&, const ImagePlan& plan,
                       std::byte* const* rows) override {
    kept_.rows = 0;
    kept_.kept.clear();
    read_number_rows(name_, member, shape_, boxes_);
    if (plan.views.size() != std::max<size_t>(views_, 1)) {
      throw std::logic_error("conveyor: " + field_label(name_) + " follows a plan of " +
                             std::to_string(plan.views.size()) + " views, not its " +
                             std::to_string(std::max<size_t>(views_, 1)));
    }
    for (size_t r = 0; r < boxes_.rows; ++r) check(boxes_.values.data() + 4 * r, r, plan);
    RaggedRow out(rows[0]);
    auto* values = reinterpret_cast<float*>(out.items());
    for (size_t v = 0; v < plan.views.size(); ++v) {
      const size_t before = kept_.kept.size();
      for (size_t r = 0; r < boxes_.rows; ++r) {
        const double* b = boxes_.values.data() + 4 * r;
        const MappedBox m = map_box(plan.views[v], {b[0], b[1], b[2], b[3]}, rule_);
        if (!m.kept) continue;
        float* o = values + 4 * kept_.kept.size();
        o[0] = static_cast<float>(m.x1);
        o[1] = static_cast<float>(m.y1);
        o[2] = static_cast<float>(m.x2);
        o[3] = static_cast<float>(m.y2);
        kept_.kept.push_back(r);
      }
      if (views_ > 0) {
        const auto count = static_cast<int64_t>(kept_.kept.size() - before);
        std::memcpy(rows[1] + v * sizeof count, &count, sizeof count);
      }
    }
    kept_.rows = boxes_.rows;
    out.set_count(static_cast<int64_t>(kept_.kept.size()));
  }

  const KeptRows* published_kept_rows() const override { return &kept_; }

 private:
  // Box r of the member: finite, ordered, inside the width x height image.
  void check(const double* b, size_t r, const ImagePlan& plan) const {
    const auto bad = [&](const std::string& why) {
      return std::runtime_error(field_label(name_) + ": box " + std::to_string(r) + " " +
                                box_text(b) + " " + why);
    };
    for (int i = 0; i < 4; ++i) {
      if (!std::isfinite(b[i])) throw bad("is not finite");
    }
    if (b[2] < b[0] || b[3] < b[1]) throw bad("is not [x1, y1, x2, y2] with x1 <= x2, y1 <= y2");
    if (b[0] < 0 || b[1] < 0 || b[2] > plan.width || b[3] > plan.height) {
      throw bad("lies outside its image (field \"" + follows_ + "\": " +
                std::to_string(plan.width) + "x" + std::to_string(plan.height) + ", upright)");
    }
  }

  std::string name_;
  std::string follows_;
  BoxRule rule_;
  size_t views_;  // the group's count for boxes that follow a group of views; 0 otherwise
  RowShape shape_;
  NumberRows boxes_;  // the member's boxes, reused
  KeptRows kept_;     // what the last write kept
};

}  // namespace

std::unique_ptr<FieldWriter> make_box_writer(const std::string& name, const Field& field,
                                             const FieldSpec& spec, size_t views) {
  return std::make_unique<BoxWriter>(name, field, spec, views);
}

}  // namespace conveyor::detail
