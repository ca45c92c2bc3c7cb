// RandomErasing: per sample, a box of the image set to a value (conveyor/augment.h).
#include <sstream>

#include <ATen/ATen.h>

#include "conveyor/augment.h"

namespace conveyor {
namespace {

class RandomErasing final : public BatchOp {
 public:
  explicit RandomErasing(RandomErasingOptions options) : o_(std::move(options)) {}
  std::string name() const override {
    std::ostringstream out;
    out << "RandomErasing(p=" << o_.p << ", scale=(" << o_.scale_min << ", " << o_.scale_max
        << "), ratio=(" << o_.ratio_min << ", " << o_.ratio_max << "), value=[";
    for (size_t i = 0; i < o_.value.size(); ++i) out << (i ? ", " : "") << o_.value[i];
    out << "])";
    return out.str();
  }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    image_layout(in[BatchFields{in, {}}.find(o_.image)], name());
    return in;
  }
  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    const bool chw = image_layout(batch.spec(o_.image), name()) == ImageLayout::kCHW;
    at::Tensor& images = batch[o_.image];
    const int64_t hdim = chw ? 1 : 0;  // of one row
    const int64_t h = images.size(hdim + 1), w = images.size(hdim + 2);
    at::Tensor value;
    if (o_.value.size() == 3) {
      value = at::tensor(o_.value, at::kDouble)
                  .view(chw ? std::vector<int64_t>{3, 1, 1} : std::vector<int64_t>{1, 1, 3})
                  .to(images.options());
    }
    for (size_t r = 0; r < ctx.rows(); ++r) {
      SampleRng rng = ctx.sample_rng(r);
      const augment_draws::Box box = augment_draws::erasing_box(rng, h, w, o_);
      if (box.area() == 0) continue;
      ctx.note(r, "RandomErasing", "x0", static_cast<double>(box.x0));
      ctx.note(r, "RandomErasing", "y0", static_cast<double>(box.y0));
      ctx.note(r, "RandomErasing", "x1", static_cast<double>(box.x1));
      ctx.note(r, "RandomErasing", "y1", static_cast<double>(box.y1));
      at::Tensor region = images[static_cast<int64_t>(r)]
                              .narrow(hdim, box.y0, box.y1 - box.y0)
                              .narrow(hdim + 1, box.x0, box.x1 - box.x0);
      if (value.defined()) {
        region.copy_(value.expand_as(region));
      } else {
        region.fill_(o_.value[0]);
      }
    }
  }

 private:
  RandomErasingOptions o_;
};

}  // namespace

std::shared_ptr<const BatchOp> random_erasing(RandomErasingOptions options) {
  const auto& o = options;
  if (!(o.p >= 0 && o.p <= 1) || !(o.scale_min >= 0 && o.scale_min <= o.scale_max) ||
      !(o.ratio_min > 0 && o.ratio_min <= o.ratio_max) ||
      (o.value.size() != 1 && o.value.size() != 3)) {
    throw std::invalid_argument(
        "conveyor: RandomErasing needs p in [0, 1], 0 <= scale_min <= scale_max, 0 < ratio_min <= "
        "ratio_max and one value or three");
  }
  return std::make_shared<const RandomErasing>(std::move(options));
}

}  // namespace conveyor
