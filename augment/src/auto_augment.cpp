// TrivialAugmentWide, RandAugment (torchvision's and timm's) and AutoAugment's ImageNet policy
// (conveyor/augment.h): per sample, steps (op, magnitude) drawn from the sample's stream over
// torchvision's (or timm's) op tables, applied by augment_functional::apply_augment_op.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <regex>
#include <sstream>

#include <ATen/ATen.h>

#include "conveyor/augment.h"
#include "per_image.h"

namespace conveyor {
namespace {

namespace F = augment_functional;
using augment_draws::AugmentStep;

// An op of a table: its name, whether its magnitude takes a random sign, and its magnitude bins
// (none for the ops without a magnitude).
struct TableOp {
  std::string name;
  bool is_signed = false;
  std::vector<double> bins;
};
using Table = std::vector<TableOp>;

std::vector<double> values(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}
// torch.linspace(lo, hi, n) in float32, as torchvision's tables.
std::vector<double> linspace(double lo, double hi, int64_t n) {
  return values(at::linspace(lo, hi, n, at::kFloat));
}
// (8 - (torch.arange(n) / ((n - 1) / k))).round().int()
std::vector<double> posterize_bins(int64_t n, double k) {
  return values(at::rsub(at::arange(n, at::kLong).div(static_cast<double>(n - 1) / k), 8)
                    .round()
                    .to(at::kInt));
}

// torchvision's _AUGMENTATION_SPACE of TrivialAugmentWide ("wide"), RandAugment and AutoAugment.
enum class Space { kTrivialWide, kRandAugment, kAutoAugment };
Table table(Space space, int64_t n, int64_t h, int64_t w) {
  const bool wide = space == Space::kTrivialWide;
  const double shear = wide ? 0.99 : 0.3, enhance = wide ? 0.99 : 0.9, rotate = wide ? 135 : 30;
  const double tx = wide ? 32.0 : 150.0 / 331.0 * static_cast<double>(w);
  const double ty = wide ? 32.0 : 150.0 / 331.0 * static_cast<double>(h);
  Table t;
  if (space != Space::kAutoAugment) t.push_back({"Identity", false, {}});
  t.push_back({"ShearX", true, linspace(0, shear, n)});
  t.push_back({"ShearY", true, linspace(0, shear, n)});
  t.push_back({"TranslateX", true, linspace(0, tx, n)});
  t.push_back({"TranslateY", true, linspace(0, ty, n)});
  t.push_back({"Rotate", true, linspace(0, rotate, n)});
  for (const char* e : {"Brightness", "Color", "Contrast", "Sharpness"}) {
    t.push_back({e, true, linspace(0, enhance, n)});
  }
  t.push_back({"Posterize", false, posterize_bins(n, wide ? 6.0 : 4.0)});
  t.push_back({"Solarize", false, linspace(1.0, 0.0, n)});
  t.push_back({"AutoContrast", false, {}});
  t.push_back({"Equalize", false, {}});
  if (space == Space::kAutoAugment) t.push_back({"Invert", false, {}});
  return t;
}

const TableOp& find(const Table& t, const std::string& name) {
  for (const TableOp& op : t) {
    if (op.name == name) return op;
  }
  throw std::logic_error("conveyor: no op " + name + " in the table");
}

double signed_magnitude(const TableOp& op, size_t bin, SampleRng& rng) {
  if (op.bins.empty()) return 0.0;
  double m = op.bins.at(bin);
  if (op.is_signed && rng.uniform(0, 1) < 0.5) m = -m;
  return m;
}

// torchvision's AutoAugmentPolicy.IMAGENET: (op, probability, magnitude bin) pairs.
struct PolicyStep {
  const char* op;
  double p;
  int bin;  // -1: no magnitude
};
constexpr PolicyStep kImageNetPolicy[25][2] = {
    {{"Posterize", 0.4, 8}, {"Rotate", 0.6, 9}},
    {{"Solarize", 0.6, 5}, {"AutoContrast", 0.6, -1}},
    {{"Equalize", 0.8, -1}, {"Equalize", 0.6, -1}},
    {{"Posterize", 0.6, 7}, {"Posterize", 0.6, 6}},
    {{"Equalize", 0.4, -1}, {"Solarize", 0.2, 4}},
    {{"Equalize", 0.4, -1}, {"Rotate", 0.8, 8}},
    {{"Solarize", 0.6, 3}, {"Equalize", 0.6, -1}},
    {{"Posterize", 0.8, 5}, {"Equalize", 1.0, -1}},
    {{"Rotate", 0.2, 3}, {"Solarize", 0.6, 8}},
    {{"Equalize", 0.6, -1}, {"Posterize", 0.4, 6}},
    {{"Rotate", 0.8, 8}, {"Color", 0.4, 0}},
    {{"Rotate", 0.4, 9}, {"Equalize", 0.6, -1}},
    {{"Equalize", 0.0, -1}, {"Equalize", 0.8, -1}},
    {{"Invert", 0.6, -1}, {"Equalize", 1.0, -1}},
    {{"Color", 0.6, 4}, {"Contrast", 1.0, 8}},
    {{"Rotate", 0.8, 8}, {"Color", 1.0, 2}},
    {{"Color", 0.8, 8}, {"Solarize", 0.8, 7}},
    {{"Sharpness", 0.4, 7}, {"Invert", 0.6, -1}},
    {{"ShearX", 0.6, 5}, {"Equalize", 1.0, -1}},
    {{"Color", 0.4, 0}, {"Equalize", 0.6, -1}},
    {{"Equalize", 0.4, -1}, {"Solarize", 0.2, 4}},
    {{"Solarize", 0.6, 5}, {"AutoContrast", 0.6, -1}},
    {{"Invert", 0.6, -1}, {"Equalize", 1.0, -1}},
    {{"Color", 0.6, 4}, {"Contrast", 1.0, 8}},
    {{"Equalize", 0.8, -1}, {"Equalize", 0.6, -1}},
};

// timm's RandAugment op sets (auto_augment.py: _RAND_TRANSFORMS, _RAND_INCREASING_TRANSFORMS).
const std::vector<std::string>& timm_ops(bool increasing) {
  static const std::vector<std::string> standard{
      "AutoContrast", "Equalize",    "Invert", "Rotate",        "Posterize",
      "Solarize",     "SolarizeAdd", "Color",  "Contrast",      "Brightness",
      "Sharpness",    "ShearX",      "ShearY", "TranslateXRel", "TranslateYRel"};
  static const std::vector<std::string> rising{"AutoContrast",
                                               "Equalize",
                                               "Invert",
                                               "Rotate",
                                               "PosterizeIncreasing",
                                               "SolarizeIncreasing",
                                               "SolarizeAdd",
                                               "ColorIncreasing",
                                               "ContrastIncreasing",
                                               "BrightnessIncreasing",
                                               "SharpnessIncreasing",
                                               "ShearX",
                                               "ShearY",
                                               "TranslateXRel",
                                               "TranslateYRel"};
  return increasing ? rising : standard;
}

// timm's level functions (level on 0..10) as a step of apply_augment_op.
AugmentStep timm_step(const std::string& op, double level, SampleRng& rng, int64_t h, int64_t w) {
  auto negate = [&](double v) { return rng.uniform(0, 1) > 0.5 ? -v : v; };
  const double l = level / 10.0;
  if (op == "AutoContrast" || op == "Equalize" || op == "Invert") return {op, 0.0};
  if (op == "Rotate") return {op, negate(l * 30.0)};
  if (op == "Posterize") return {op, std::trunc(l * 4.0)};
  if (op == "PosterizeIncreasing") return {"Posterize", 4.0 - std::trunc(l * 4.0)};
  // Solarize's threshold as a fraction of 255 (apply_augment_op's law); 256 leaves the image.
  const double solarize_threshold = std::min(256.0, std::trunc(l * 256.0));
  if (op == "Solarize") return {op, solarize_threshold / 255.0};
  if (op == "SolarizeIncreasing") return {"Solarize", (256.0 - solarize_threshold) / 255.0};
  if (op == "SolarizeAdd") return {op, std::min(128.0, std::trunc(l * 110.0))};
  for (const char* e : {"Color", "Contrast", "Brightness", "Sharpness"}) {
    if (op == e) return {op, l * 1.8 + 0.1 - 1.0};  // factor l * 1.8 + 0.1
    if (op == std::string(e) + "Increasing") {
      return {e, std::max(0.1, 1.0 + negate(l * 0.9)) - 1.0};
    }
  }
  if (op == "ShearX" || op == "ShearY") return {op, negate(l * 0.3)};
  if (op == "TranslateXRel") return {"TranslateX", negate(l * 0.45) * static_cast<double>(w)};
  if (op == "TranslateYRel") return {"TranslateY", negate(l * 0.45) * static_cast<double>(h)};
  throw std::logic_error("conveyor: no timm op " + op);
}

double normal(SampleRng& rng) {  // Box-Muller
  const double u1 = 1.0 - rng.uniform(0.0, 1.0);
  const double u2 = rng.uniform(0.0, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

std::string interpolation_name(F::Interpolation i) {
  return i == F::Interpolation::kBilinear ? "bilinear" : "nearest";
}
std::string fill_text(const std::vector<double>& fill) {
  if (fill.empty()) return "None";
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < fill.size(); ++i) out << (i ? ", " : "") << fill[i];
  out << ']';
  return out.str();
}

// The family's common machinery: steps drawn per sample, applied in turn.
class PolicyOp : public BatchOp {
 public:
  PolicyOp(std::string image, F::Interpolation interpolation, std::vector<double> fill)
      : image_(std::move(image)), interpolation_(interpolation), fill_(std::move(fill)) {}
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    image_layout(in[BatchFields{in, {}}.find(image_)], name());
    return in;
  }
  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    const auto [h, w] = augment_detail::image_size(batch, image_, name());
    const Table t = tables(h, w);
    augment_detail::for_each_image(
        batch, image_, name(), ctx, [&](const at::Tensor& image, SampleRng& rng, size_t r) {
          const std::vector<AugmentStep> s = steps(t, rng, h, w);
          if (s.empty()) return at::Tensor();
          at::Tensor out = image;
          for (const AugmentStep& step : s) {
            out = F::apply_augment_op(out, step.op, step.magnitude, interpolation_, fill_);
            ctx.note(r, kind(), step.op.c_str(), step.magnitude);
          }
          return out;
        });
  }
  // The op's short name, for the record (BatchContext::note).
  virtual const char* kind() const = 0;
  virtual Table tables(int64_t h, int64_t w) const = 0;
  virtual std::vector<AugmentStep> steps(const Table& t, SampleRng& rng, int64_t h,
                                         int64_t w) const = 0;

 protected:
  std::string geometry_text() const {
    return "interpolation=" + interpolation_name(interpolation_) + ", fill=" + fill_text(fill_);
  }

 private:
  std::string image_;
  F::Interpolation interpolation_;
  std::vector<double> fill_;
};

class TrivialAugmentWide final : public PolicyOp {
 public:
  explicit TrivialAugmentWide(TrivialAugmentWideOptions o)
      : PolicyOp(o.image, o.interpolation, o.fill), bins_(o.num_magnitude_bins) {}
  const char* kind() const override { return "TrivialAugmentWide"; }
  std::string name() const override {
    return "TrivialAugmentWide(num_magnitude_bins=" + std::to_string(bins_) + ", " +
           geometry_text() + ")";
  }
  Table tables(int64_t h, int64_t w) const override {
    return table(Space::kTrivialWide, bins_, h, w);
  }
  std::vector<AugmentStep> steps(const Table& t, SampleRng& rng, int64_t, int64_t) const override {
    const TableOp& op = t[static_cast<size_t>(rng.randint(0, static_cast<int>(t.size())))];
    const size_t bin = static_cast<size_t>(rng.randint(0, static_cast<int>(bins_)));
    return {{op.name, signed_magnitude(op, bin, rng)}};
  }

 private:
  int64_t bins_;
};

class RandAugment final : public PolicyOp {
 public:
  explicit RandAugment(RandAugmentOptions o)
      : PolicyOp(o.image, o.interpolation, o.fill), o_(std::move(o)) {}
  const char* kind() const override { return "RandAugment"; }
  std::string name() const override {
    std::ostringstream out;
    out << "RandAugment(num_ops=" << o_.num_ops << ", magnitude=" << o_.magnitude;
    if (o_.timm) {
      out << ", timm=True, magnitude_std=" << o_.magnitude_std
          << ", magnitude_max=" << o_.magnitude_max
          << ", increasing=" << (o_.increasing ? "True" : "False") << ", op_prob=" << o_.op_prob;
    } else {
      out << ", num_magnitude_bins=" << o_.num_magnitude_bins;
    }
    out << ", " << geometry_text() << ")";
    return out.str();
  }
  Table tables(int64_t h, int64_t w) const override {
    if (o_.timm) return {};
    return table(Space::kRandAugment, o_.num_magnitude_bins, h, w);
  }
  std::vector<AugmentStep> steps(const Table& t, SampleRng& rng, int64_t h,
                                 int64_t w) const override {
    std::vector<AugmentStep> out;
    for (int64_t k = 0; k < o_.num_ops; ++k) {
      if (!o_.timm) {
        const TableOp& op = t[static_cast<size_t>(rng.randint(0, static_cast<int>(t.size())))];
        out.push_back({op.name, signed_magnitude(op, static_cast<size_t>(o_.magnitude), rng)});
        continue;
      }
      const std::vector<std::string>& ops = timm_ops(o_.increasing);
      const std::string& op =
          ops[static_cast<size_t>(rng.randint(0, static_cast<int>(ops.size())))];
      if (o_.op_prob < 1.0 && rng.uniform(0, 1) > o_.op_prob) continue;
      double level = o_.magnitude;
      if (o_.magnitude_std == std::numeric_limits<double>::infinity()) {
        level = rng.uniform(0, level);
      } else if (o_.magnitude_std > 0) {
        level = level + o_.magnitude_std * normal(rng);
      }
      level = std::max(0.0, std::min(level, o_.magnitude_max));
      out.push_back(timm_step(op, level, rng, h, w));
    }
    return out;
  }

 private:
  RandAugmentOptions o_;
};

class AutoAugment final : public PolicyOp {
 public:
  explicit AutoAugment(const AutoAugmentOptions& o) : PolicyOp(o.image, o.interpolation, o.fill) {}
  const char* kind() const override { return "AutoAugment"; }
  std::string name() const override {
    return "AutoAugment(policy=IMAGENET, " + geometry_text() + ")";
  }
  Table tables(int64_t h, int64_t w) const override { return table(Space::kAutoAugment, 10, h, w); }
  std::vector<AugmentStep> steps(const Table& t, SampleRng& rng, int64_t, int64_t) const override {
    std::vector<AugmentStep> out;
    const auto& policy = kImageNetPolicy[rng.randint(0, 25)];
    for (const PolicyStep& step : policy) {
      if (!(rng.uniform(0, 1) < step.p)) continue;
      const TableOp& op = find(t, step.op);
      out.push_back(
          {op.name, step.bin < 0 ? 0.0 : signed_magnitude(op, static_cast<size_t>(step.bin), rng)});
    }
    return out;
  }
};

void check_fill(const std::vector<double>& fill, const std::string& op) {
  if (!fill.empty() && fill.size() != 1 && fill.size() != 3) {
    throw std::invalid_argument("conveyor: " + op + " takes no fill, one value or three");
  }
}

}  // namespace

std::shared_ptr<const BatchOp> trivial_augment_wide(TrivialAugmentWideOptions o) {
  check_fill(o.fill, "TrivialAugmentWide");
  if (o.num_magnitude_bins < 2) {
    throw std::invalid_argument("conveyor: TrivialAugmentWide needs num_magnitude_bins >= 2");
  }
  return std::make_shared<const TrivialAugmentWide>(std::move(o));
}

std::shared_ptr<const BatchOp> rand_augment(RandAugmentOptions o) {
  check_fill(o.fill, "RandAugment");
  const bool bins_ok = o.timm || (o.num_magnitude_bins >= 2 && o.magnitude >= 0 &&
                                  o.magnitude < static_cast<double>(o.num_magnitude_bins) &&
                                  o.magnitude == std::trunc(o.magnitude));
  if (o.num_ops < 0 || !bins_ok || !(o.magnitude_std >= 0) || !(o.op_prob >= 0 && o.op_prob <= 1) ||
      !(o.magnitude_max >= 0)) {
    throw std::invalid_argument(
        "conveyor: RandAugment needs num_ops >= 0 and, torchvision's, an integer magnitude in [0, "
        "num_magnitude_bins); timm's, magnitude_std >= 0, magnitude_max >= 0 and op_prob in [0, "
        "1]");
  }
  return std::make_shared<const RandAugment>(std::move(o));
}

RandAugmentOptions parse_timm_rand_augment(const std::string& config) {
  RandAugmentOptions o;
  o.timm = true;
  o.interpolation = F::Interpolation::kBilinear;
  o.fill = {124, 116, 104};
  std::vector<std::string> parts;
  std::stringstream in(config);
  for (std::string part; std::getline(in, part, '-');) parts.push_back(part);
  if (parts.empty() || parts[0] != "rand") {
    throw std::invalid_argument("conveyor: a timm RandAugment config starts with \"rand\": \"" +
                                config + "\"");
  }
  static const std::regex key_value(R"(([a-z]+)(\d.*))");
  for (size_t i = 1; i < parts.size(); ++i) {
    std::smatch m;
    if (!std::regex_match(parts[i], m, key_value)) {
      throw std::invalid_argument("conveyor: cannot read \"" + parts[i] + "\" of \"" + config +
                                  "\"");
    }
    const std::string key = m[1];
    double value = 0;
    try {
      size_t used = 0;
      const std::string text = m[2];
      value = std::stod(text, &used);
      if (used != text.size()) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      throw std::invalid_argument("conveyor: cannot read the value of \"" + parts[i] + "\" of \"" +
                                  config + "\"");
    }
    if (key == "mstd") {
      o.magnitude_std = value > 100 ? std::numeric_limits<double>::infinity() : value;
    } else if (key == "mmax") {
      o.magnitude_max = value;
    } else if (key == "inc") {
      o.increasing = value != 0;
    } else if (key == "m") {
      o.magnitude = value;
    } else if (key == "n") {
      o.num_ops = static_cast<int64_t>(value);
    } else if (key == "p") {
      o.op_prob = value;
    } else {
      throw std::invalid_argument("conveyor: timm RandAugment key \"" + key + "\" of \"" + config +
                                  "\" is not supported (m, n, mstd, mmax, inc, p)");
    }
  }
  return o;
}

std::shared_ptr<const BatchOp> auto_augment(AutoAugmentOptions o) {
  check_fill(o.fill, "AutoAugment");
  return std::make_shared<const AutoAugment>(o);
}

namespace augment_draws {
std::vector<AugmentStep> augment_steps(const BatchOp& op, SampleRng& rng, int64_t h, int64_t w) {
  const auto* policy = dynamic_cast<const PolicyOp*>(&op);
  if (!policy) {
    throw std::invalid_argument("conveyor: " + op.name() +
                                " is not TrivialAugmentWide, RandAugment or AutoAugment");
  }
  return policy->steps(policy->tables(h, w), rng, h, w);
}
}  // namespace augment_draws

}  // namespace conveyor
