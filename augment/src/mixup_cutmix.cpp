// MixUp, CutMix and timm's switch between them: the batch mixed with its flip, the labels made
// soft targets (conveyor/augment.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>

#include "conveyor/augment.h"
#include "mix.h"

namespace conveyor {
namespace augment_detail {
namespace {

// MixUp's blend, the rule: round(x * lambda + flip(x) * (1 - lambda)) in float32, rounded half to
// even and written back (uint8 images: the nearest level).
void blend_with_flip(at::Tensor& images, double lambda) {
  const at::Tensor x = images.to(at::kFloat);
  at::Tensor mixed = x * lambda + x.flip(0) * (1.0 - lambda);
  if (!images.is_floating_point()) mixed = mixed.round_();
  images.copy_(mixed);
}

// The same for a contiguous uint8 batch on the CPU, in one pass over row pairs (r, B-1-r): a pixel
// pair (a, b) takes only 256 x 256 values, so the blend is a table of the rule's float32
// results, round(float(a) * float(lambda) + float(b) * float(1 - lambda)), the products and the
// sum computed in float32 as ATen's kernels do. Bit-identical to blend_with_flip (augment_test
// checks it on random batches and lambdas); 10x fewer passes over the batch.
void blend_with_flip_uint8(at::Tensor& images, double lambda) {
  const float keep = static_cast<float>(lambda), take = static_cast<float>(1.0 - lambda);
  std::array<float, 256> kept{}, taken{};
  for (int v = 0; v < 256; ++v) {
    kept[static_cast<size_t>(v)] = static_cast<float>(v) * keep;
    taken[static_cast<size_t>(v)] = static_cast<float>(v) * take;
  }
  std::vector<uint8_t> table(256 * 256);  // table[a * 256 + b]: a's pixel mixed with b's
  for (size_t a = 0; a < 256; ++a) {
    for (size_t b = 0; b < 256; ++b) {
      const float sum = kept[a] + taken[b];
      table[a * 256 + b] = static_cast<uint8_t>(std::nearbyint(sum));
    }
  }
  const int64_t rows = images.size(0);
  if (rows == 0) return;
  const int64_t pixels = images.numel() / std::max<int64_t>(rows, 1);
  uint8_t* data = images.data_ptr<uint8_t>();
  for (int64_t r = 0; r <= (rows - 1) / 2; ++r) {
    uint8_t* mine = data + r * pixels;
    uint8_t* theirs = data + (rows - 1 - r) * pixels;
    for (int64_t i = 0; i < pixels; ++i) {
      const size_t a = mine[i], b = theirs[i];
      mine[i] = table[a * 256 + b];
      theirs[i] = table[b * 256 + a];  // for the middle row (mine == theirs) the same value
    }
  }
}

}  // namespace

void mix_with_flip(at::Tensor& images, double lambda) {
  if (images.device().is_cpu() && images.scalar_type() == at::kByte && images.is_contiguous()) {
    blend_with_flip_uint8(images, lambda);
  } else {
    blend_with_flip(images, lambda);
  }
}

}  // namespace augment_detail

namespace {

class MixUpCutMix final : public BatchOp {
 public:
  MixUpCutMix(MixUpCutMixOptions options, std::string name)
      : o_(std::move(options)), name_(std::move(name)) {}
  std::string name() const override { return name_; }

  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    const BatchFields specs{in, {}};
    image_layout(in[specs.find(o_.image)], name());
    FieldSpec& label = in[specs.find(o_.label)];
    if (label.dtype != c10::ScalarType::Long || !label.sample_shape.empty()) {
      throw std::invalid_argument(name() + ": the label field \"" + o_.label +
                                  "\" must be one int64 class per sample, not " +
                                  c10::toString(label.dtype) + " of " +
                                  std::to_string(label.sample_shape.size()) + " dimensions");
    }
    label.dtype = c10::ScalarType::Float;
    label.sample_shape = {o_.num_classes};
    return in;
  }

  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    const bool chw = image_layout(batch.spec(o_.image), name()) == ImageLayout::kCHW;
    at::Tensor& images = batch[o_.image];
    at::Tensor& labels = batch[o_.label];
    SampleRng rng = ctx.batch_rng();
    bool use_cutmix = o_.mixup_alpha <= 0;
    if (o_.mixup_alpha > 0 && o_.cutmix_alpha > 0) use_cutmix = rng.uniform(0, 1) < o_.switch_prob;
    const double alpha = use_cutmix ? o_.cutmix_alpha : o_.mixup_alpha;
    double lambda = augment_draws::beta(rng, alpha, alpha);
    if (use_cutmix) {
      const int64_t hdim = chw ? 2 : 1;
      const int64_t h = images.size(hdim), w = images.size(hdim + 1);
      const augment_draws::Box box = augment_draws::cutmix_box(rng, h, w, lambda);
      if (box.area() > 0) {
        at::Tensor region =
            images.narrow(hdim, box.y0, box.y1 - box.y0).narrow(hdim + 1, box.x0, box.x1 - box.x0);
        region.copy_(region.flip(0));  // flip() makes a new tensor: no overlap
      }
      lambda = 1.0 - static_cast<double>(box.area()) / static_cast<double>(h * w);
      ctx.note_batch("CutMix", "x0", static_cast<double>(box.x0));
      ctx.note_batch("CutMix", "y0", static_cast<double>(box.y0));
      ctx.note_batch("CutMix", "x1", static_cast<double>(box.x1));
      ctx.note_batch("CutMix", "y1", static_cast<double>(box.y1));
      ctx.note_batch("CutMix", "lambda", lambda);
    } else {
      augment_detail::mix_with_flip(images, lambda);
      ctx.note_batch("MixUp", "lambda", lambda);
    }
    labels = soft_targets(labels, lambda, ctx);
  }

 private:
  at::Tensor soft_targets(const at::Tensor& labels, double lambda, const BatchContext& ctx) const {
    const int64_t classes = o_.num_classes;
    if (!labels.is_cuda()) {  // checked where reading the values costs no device sync
      const at::Tensor bad = (labels < 0).logical_or(labels >= classes).nonzero();
      if (bad.numel() > 0) {
        const int64_t row = bad[0][0].item<int64_t>();
        throw std::invalid_argument(
            "label " + std::to_string(labels[row].item<int64_t>()) + " of sample " +
            std::to_string(ctx.indices.at(static_cast<size_t>(row))) + " (row " +
            std::to_string(row) + ") is not a class in [0, " + std::to_string(classes) + ")");
      }
    }
    const double off = o_.label_smoothing / static_cast<double>(classes);
    const double on = 1.0 - o_.label_smoothing + off;
    const at::Tensor hot = labels.unsqueeze(1) == at::arange(classes, labels.options());
    at::Tensor y = hot.to(at::kFloat) * (on - off) + off;
    // On CUDA an out-of-range label makes its row NaN (visible in the loss) instead of a sync.
    if (labels.is_cuda()) y = y.masked_fill(hot.logical_not().all(1, true), NAN);
    return y * lambda + y.flip(0) * (1.0 - lambda);
  }

  MixUpCutMixOptions o_;
  std::string name_;
};

void check(const MixUpCutMixOptions& o) {
  if (!(o.mixup_alpha >= 0) || !(o.cutmix_alpha >= 0) ||
      !(o.mixup_alpha > 0 || o.cutmix_alpha > 0) || !(o.switch_prob >= 0 && o.switch_prob <= 1) ||
      !(o.label_smoothing >= 0 && o.label_smoothing < 1) || o.num_classes < 1) {
    throw std::invalid_argument(
        "conveyor: MixUp/CutMix need alphas >= 0 (one > 0), switch_prob in [0, 1], "
        "label_smoothing in [0, 1) and num_classes >= 1");
  }
}

}  // namespace

std::shared_ptr<const BatchOp> mixup_cutmix(MixUpCutMixOptions options) {
  check(options);
  std::ostringstream name;
  name << "MixUpCutMix(mixup_alpha=" << options.mixup_alpha
       << ", cutmix_alpha=" << options.cutmix_alpha << ", num_classes=" << options.num_classes
       << ", label_smoothing=" << options.label_smoothing << ", switch_prob=" << options.switch_prob
       << ")";
  return std::make_shared<const MixUpCutMix>(std::move(options), name.str());
}

std::shared_ptr<const BatchOp> mixup(double alpha, int64_t num_classes, double label_smoothing,
                                     std::string image, std::string label) {
  MixUpCutMixOptions o{alpha,           0.0, 0.0, label_smoothing, num_classes, std::move(image),
                       std::move(label)};
  if (!(alpha > 0)) throw std::invalid_argument("conveyor: MixUp needs alpha > 0");
  check(o);
  std::ostringstream name;
  name << "MixUp(alpha=" << alpha << ", num_classes=" << num_classes << ")";
  return std::make_shared<const MixUpCutMix>(std::move(o), name.str());
}

std::shared_ptr<const BatchOp> cutmix(double alpha, int64_t num_classes, double label_smoothing,
                                      std::string image, std::string label) {
  MixUpCutMixOptions o{
      0.0, alpha, 1.0, label_smoothing, num_classes, std::move(image), std::move(label)};
  if (!(alpha > 0)) throw std::invalid_argument("conveyor: CutMix needs alpha > 0");
  check(o);
  std::ostringstream name;
  name << "CutMix(alpha=" << alpha << ", num_classes=" << num_classes << ")";
  return std::make_shared<const MixUpCutMix>(std::move(o), name.str());
}

}  // namespace conveyor
