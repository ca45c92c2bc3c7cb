// The plan field (conveyor/fields.h): no member; the plan its image field executed for the
// sample, a row of plan_row() (conveyor/geometry.h) per view it follows (the image's one view,
// or each view of a group): int32 [V, 7].
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "conveyor/geometry.h"
#include "fields/field_writer.h"

namespace conveyor::detail {

namespace {

class PlanWriter final : public FieldWriter {
 public:
  PlanWriter(std::string name, const FieldSpec& spec)
      : name_(std::move(name)), views_(static_cast<size_t>(spec.sample_shape.at(0))) {}

  void write(const Member&, const SampleContext&, std::byte*) override {
    throw std::logic_error("conveyor: " + field_label(name_) + " written without its image's plan");
  }

  void write_following(const Member&, const SampleContext&, const ImagePlan& plan,
                       std::byte* const* rows) override {
    std::byte* row = rows[0];
    if (plan.views.size() != views_) {
      throw std::logic_error("conveyor: " + field_label(name_) + " follows a plan of " +
                             std::to_string(plan.views.size()) + " views, not its " +
                             std::to_string(views_));
    }
    for (size_t v = 0; v < views_; ++v) {
      const auto values = plan_row(plan.views[v]);
      std::memcpy(row + v * sizeof values, values.data(), sizeof values);
    }
  }

 private:
  std::string name_;
  size_t views_;
};

}  // namespace

std::unique_ptr<FieldWriter> make_plan_writer(const std::string& name, const FieldSpec& spec) {
  return std::make_unique<PlanWriter>(name, spec);
}

}  // namespace conveyor::detail
