// The seam of the batch stage: BatchContext's streams, BatchFields, apply_op()'s checks and
// errors, Compose, and the draws the ops share (conveyor/augment.h).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <utility>

#include "conveyor/augment.h"

namespace conveyor {
namespace {

// A stream's seed: the loader's seed mixed with what tells the stream apart.
uint64_t stream_seed(uint64_t seed, uint64_t kind, uint64_t op, uint64_t view, uint64_t repeat) {
  uint64_t h = splitmix64(seed ^ splitmix64(kind));
  h = splitmix64(h ^ op);
  h = splitmix64(h ^ view);
  return splitmix64(h ^ repeat);
}

constexpr uint64_t kSampleStream = 0x53414d504c45ull;  // "SAMPLE"
constexpr uint64_t kBatchStream = 0x4241544348ull;     // "BATCH"

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

class Compose final : public BatchOp {
 public:
  explicit Compose(std::vector<std::shared_ptr<const BatchOp>> ops) : ops_(std::move(ops)) {
    for (const auto& op : ops_) {
      if (!op) throw std::invalid_argument("conveyor: Compose was given a null op");
    }
  }
  std::string name() const override {
    std::string text = "Compose([";
    for (size_t k = 0; k < ops_.size(); ++k) text += (k ? ", " : "") + ops_[k]->name();
    return text + "])";
  }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    for (const auto& op : ops_) in = op->out_fields(std::move(in));
    return in;
  }
  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    for (size_t k = 0; k < ops_.size(); ++k) apply_op(*ops_[k], batch, ctx.child(k));
  }

 private:
  std::vector<std::shared_ptr<const BatchOp>> ops_;
};

}  // namespace

SampleRng BatchContext::sample_rng(size_t row) const {
  const uint32_t repeat = row < repeats.size() ? repeats[row] : 0;
  const uint32_t row_view = row < views.size() ? views[row] : view;
  return SampleRng(stream_seed(seed, kSampleStream, op, row_view, repeat), epoch, indices.at(row));
}

SampleRng BatchContext::batch_rng() const {
  return SampleRng(stream_seed(seed, kBatchStream, op, view, 0), epoch, sequence);
}

BatchContext BatchContext::child(size_t k) const {
  BatchContext c = *this;
  c.op = splitmix64(op ^ splitmix64(k + 1));
  return c;
}

size_t BatchFields::find(const std::string& name) const {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) return i;
  }
  std::string known;
  for (const FieldSpec& f : specs) known += (known.empty() ? "" : ", ") + f.name;
  throw std::out_of_range("no field \"" + name + "\" among the batch's fixed device fields (" +
                          (known.empty() ? "none" : known) + ")");
}

BatchTransformError::BatchTransformError(const std::string& message, std::string op, uint64_t epoch,
                                         size_t sequence, std::exception_ptr original)
    : std::runtime_error(message),
      op_(std::move(op)),
      epoch_(epoch),
      sequence_(sequence),
      original_(std::move(original)) {}

void apply_op(const BatchOp& op, BatchFields& batch, const BatchContext& ctx) {
  try {
    std::vector<FieldSpec> out = op.out_fields(batch.specs);
    if (out.size() != batch.specs.size()) {
      throw std::logic_error("the op changed the number of fields");
    }
    std::vector<c10::Device> devices;
    for (const at::Tensor& t : batch.tensors) devices.push_back(t.device());
    op.apply(batch, ctx);
    for (size_t i = 0; i < out.size(); ++i) {
      const at::Tensor& t = batch.tensors[i];
      std::vector<int64_t> want{static_cast<int64_t>(ctx.rows())};
      want.insert(want.end(), out[i].sample_shape.begin(), out[i].sample_shape.end());
      if (out[i].name != batch.specs[i].name || !t.defined() || t.scalar_type() != out[i].dtype ||
          t.sizes().vec() != want || t.device() != devices[i]) {
        throw std::logic_error("the op broke its declared output for field \"" + out[i].name +
                               "\": declared " + std::string(c10::toString(out[i].dtype)) + " " +
                               shape_text(want) + " on " + devices[i].str() + ", got " +
                               (t.defined()
                                    ? std::string(c10::toString(t.scalar_type())) + " " +
                                          shape_text(t.sizes().vec()) + " on " + t.device().str()
                                    : std::string("no tensor")));
      }
    }
    batch.specs = std::move(out);
  } catch (const BatchTransformError&) {
    throw;
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    throw BatchTransformError("conveyor: batch transform " + op.name() + " failed on batch " +
                                  std::to_string(ctx.sequence) + " of epoch " +
                                  std::to_string(ctx.epoch) + ": " + message_of(error),
                              op.name(), ctx.epoch, ctx.sequence, error);
  }
}

ImageLayout image_layout(const FieldSpec& field, const std::string& op) {
  const auto& s = field.sample_shape;
  if (s.size() == 3 && s[0] == 3) return ImageLayout::kCHW;
  if (s.size() == 3 && s[2] == 3) return ImageLayout::kHWC;
  throw std::invalid_argument(op + ": field \"" + field.name +
                              "\" is not an RGB image ([3, H, W] or [H, W, 3]): its samples are " +
                              shape_text(s));
}

std::shared_ptr<const BatchOp> compose(std::vector<std::shared_ptr<const BatchOp>> ops) {
  return std::make_shared<const Compose>(std::move(ops));
}

namespace augment_draws {
namespace {

double normal(SampleRng& rng) {                   // Box-Muller
  const double u1 = 1.0 - rng.uniform(0.0, 1.0);  // (0, 1]
  const double u2 = rng.uniform(0.0, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double gamma(SampleRng& rng, double a) {  // Marsaglia and Tsang (2000)
  if (a < 1.0) {
    const double u = 1.0 - rng.uniform(0.0, 1.0);
    return gamma(rng, a + 1.0) * std::pow(u, 1.0 / a);
  }
  const double d = a - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0, v = 0;
    do {
      x = normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = 1.0 - rng.uniform(0.0, 1.0);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

}  // namespace

double beta(SampleRng& rng, double a, double b) {
  const double x = gamma(rng, a);
  const double y = gamma(rng, b);
  return x + y > 0 ? x / (x + y) : 0.5;
}

Box cutmix_box(SampleRng& rng, int64_t h, int64_t w, double lambda) {
  const double ratio = std::sqrt(std::max(0.0, 1.0 - lambda));
  const auto cut_h = static_cast<int64_t>(static_cast<double>(h) * ratio);
  const auto cut_w = static_cast<int64_t>(static_cast<double>(w) * ratio);
  const int64_t cy = rng.randint(0, static_cast<int>(h));
  const int64_t cx = rng.randint(0, static_cast<int>(w));
  Box box;
  box.y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, h);
  box.y1 = std::clamp<int64_t>(cy + cut_h / 2, 0, h);
  box.x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, w);
  box.x1 = std::clamp<int64_t>(cx + cut_w / 2, 0, w);
  return box;
}

Box erasing_box(SampleRng& rng, int64_t h, int64_t w, const RandomErasingOptions& o) {
  if (rng.uniform(0.0, 1.0) >= o.p) return {};
  const double area = static_cast<double>(h * w);
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * rng.uniform(o.scale_min, o.scale_max);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const auto eh = static_cast<int64_t>(std::lround(std::sqrt(erase_area * aspect)));
    const auto ew = static_cast<int64_t>(std::lround(std::sqrt(erase_area / aspect)));
    if (!(eh < h && ew < w)) continue;
    Box box;
    box.y0 = rng.randint(0, static_cast<int>(h - eh + 1));
    box.x0 = rng.randint(0, static_cast<int>(w - ew + 1));
    box.y1 = box.y0 + eh;
    box.x1 = box.x0 + ew;
    return box;
  }
  return {};
}

}  // namespace augment_draws
}  // namespace conveyor
