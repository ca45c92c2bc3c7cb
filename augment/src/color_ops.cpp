// The per-sample photometric ops: ColorJitter, RandomGrayscale, GaussianBlur, RandomSolarize
// (conveyor/augment.h), torchvision's semantics through conveyor/augment_functional.h.
#include <array>
#include <limits>
#include <sstream>

#include "conveyor/augment.h"
#include "per_image.h"

namespace conveyor {
namespace {

namespace F = augment_functional;

class ColorJitter final : public BatchOp {
 public:
  explicit ColorJitter(ColorJitterOptions o) : o_(std::move(o)) {}
  std::string name() const override {
    std::ostringstream out;
    out << "ColorJitter(brightness=(" << o_.brightness_min << ", " << o_.brightness_max
        << "), contrast=(" << o_.contrast_min << ", " << o_.contrast_max << "), saturation=("
        << o_.saturation_min << ", " << o_.saturation_max << "), hue=(" << o_.hue_min << ", "
        << o_.hue_max << "), p=" << o_.p << ")";
    return out.str();
  }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    image_layout(in[BatchFields{in, {}}.find(o_.image)], name());
    return in;
  }
  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    augment_detail::for_each_image(
        batch, o_.image, name(), ctx, [&](const at::Tensor& image, SampleRng& rng, size_t r) {
          if (o_.p < 1 && rng.uniform(0, 1) >= o_.p) return at::Tensor();
          std::array<int, 4> order{0, 1, 2, 3};  // Fisher-Yates: torch.randperm(4)'s law
          for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.randint(0, i + 1)]);
          const double b = rng.uniform(o_.brightness_min, o_.brightness_max);
          const double c = rng.uniform(o_.contrast_min, o_.contrast_max);
          const double s = rng.uniform(o_.saturation_min, o_.saturation_max);
          const double h = rng.uniform(o_.hue_min, o_.hue_max);
          at::Tensor out = image;
          for (const int fn : order) {
            if (fn == 0 && !(o_.brightness_min == 1 && o_.brightness_max == 1)) {
              out = F::adjust_brightness(out, b);
              ctx.note(r, "ColorJitter", "brightness", b);
            } else if (fn == 1 && !(o_.contrast_min == 1 && o_.contrast_max == 1)) {
              out = F::adjust_contrast(out, c);
              ctx.note(r, "ColorJitter", "contrast", c);
            } else if (fn == 2 && !(o_.saturation_min == 1 && o_.saturation_max == 1)) {
              out = F::adjust_saturation(out, s);
              ctx.note(r, "ColorJitter", "saturation", s);
            } else if (fn == 3 && !(o_.hue_min == 0 && o_.hue_max == 0)) {
              out = F::adjust_hue(out, h);
              ctx.note(r, "ColorJitter", "hue", h);
            }
          }
          return out;
        });
  }

 private:
  ColorJitterOptions o_;
};

// An op that, per sample with probability p, replaces the image by fn(image, rng, note); `kind`
// is its short name for the record, where fn notes what it drew (note(name, value)) and the op
// notes "applied".
template <class Fn>
class PerSampleOp final : public BatchOp {
 public:
  PerSampleOp(const char* kind, std::string name, std::string image, double p, Fn fn)
      : kind_(kind), name_(std::move(name)), image_(std::move(image)), p_(p), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    image_layout(in[BatchFields{in, {}}.find(image_)], name_);
    return in;
  }
  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    augment_detail::for_each_image(
        batch, image_, name_, ctx, [&](const at::Tensor& image, SampleRng& rng, size_t r) {
          if (rng.uniform(0, 1) >= p_) return at::Tensor();
          ctx.note(r, kind_, "applied", 1);
          return fn_(image, rng,
                     [&](const char* what, double value) { ctx.note(r, kind_, what, value); });
        });
  }

 private:
  const char* kind_;
  std::string name_, image_;
  double p_;
  Fn fn_;
};

template <class Fn>
std::shared_ptr<const BatchOp> per_sample_op(const char* kind, std::string name, std::string image,
                                             double p, Fn fn) {
  if (!(p >= 0 && p <= 1)) {
    throw std::invalid_argument("conveyor: " + name + " needs p in [0, 1]");
  }
  return std::make_shared<const PerSampleOp<Fn>>(kind, std::move(name), std::move(image), p,
                                                 std::move(fn));
}

bool in_range(double lo, double hi, double min, double max) {
  return lo >= min && lo <= hi && hi <= max;
}

}  // namespace

std::shared_ptr<const BatchOp> color_jitter(ColorJitterOptions o) {
  const double inf = std::numeric_limits<double>::infinity();
  if (!in_range(o.brightness_min, o.brightness_max, 0, inf) ||
      !in_range(o.contrast_min, o.contrast_max, 0, inf) ||
      !in_range(o.saturation_min, o.saturation_max, 0, inf) ||
      !in_range(o.hue_min, o.hue_max, -0.5, 0.5) || !(o.p >= 0 && o.p <= 1)) {
    throw std::invalid_argument(
        "conveyor: ColorJitter needs ranges min <= max, brightness, contrast and saturation >= 0, "
        "hue in [-0.5, 0.5] and p in [0, 1]");
  }
  return std::make_shared<const ColorJitter>(std::move(o));
}

std::shared_ptr<const BatchOp> random_grayscale(double p, std::string image) {
  std::ostringstream name;
  name << "RandomGrayscale(p=" << p << ")";
  return per_sample_op(
      "RandomGrayscale", name.str(), std::move(image), p,
      [](const at::Tensor& x, SampleRng&, const auto&) { return F::rgb_to_grayscale(x); });
}

std::shared_ptr<const BatchOp> gaussian_blur(GaussianBlurOptions o) {
  auto& k = o.kernel_size;
  if (k.size() == 1) k.push_back(k[0]);
  if (k.size() != 2 || k[0] < 1 || k[1] < 1 || k[0] % 2 == 0 || k[1] % 2 == 0 ||
      !(o.sigma_min > 0 && o.sigma_min <= o.sigma_max)) {
    throw std::invalid_argument(
        "conveyor: GaussianBlur needs odd positive kernel sizes and 0 < sigma_min <= sigma_max");
  }
  std::ostringstream name;
  name << "GaussianBlur(kernel_size=(" << k[0] << ", " << k[1] << "), sigma=(" << o.sigma_min
       << ", " << o.sigma_max << "), p=" << o.p << ")";
  return per_sample_op("GaussianBlur", name.str(), o.image, o.p,
                       [k, lo = o.sigma_min, hi = o.sigma_max](const at::Tensor& x, SampleRng& rng,
                                                               const auto& note) {
                         const double sigma = rng.uniform(lo, hi);
                         note("sigma", sigma);
                         return F::gaussian_blur(x, k, {sigma, sigma});
                       });
}

std::shared_ptr<const BatchOp> random_solarize(double threshold, double p, std::string image) {
  if (!(threshold <= 255)) {
    throw std::invalid_argument("conveyor: RandomSolarize needs a threshold <= 255");
  }
  std::ostringstream name;
  name << "RandomSolarize(threshold=" << threshold << ", p=" << p << ")";
  return per_sample_op("RandomSolarize", name.str(), std::move(image), p,
                       [threshold](const at::Tensor& x, SampleRng&, const auto&) {
                         return F::solarize(x, threshold);
                       });
}

}  // namespace conveyor
