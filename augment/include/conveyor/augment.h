// conveyor/augment.h: batch ops, the augmentations a loader runs on each whole batch, on the
// batch's device, before it hands the batch out (LoaderOptions::batch_transform).
//
// What it is for: the recipes' batch-level work (normalization, random erasing, MixUp and CutMix,
// and next the TrivialAugment / RandAugment family) done by the loader, off the training thread
// (on a CPU loader, by the worker that finished the batch) or on the loader's side stream (on a
// CUDA loader, after the batch's copy and before its fence), deterministically: what an op does
// to a batch is a pure function of the batch's content and its BatchContext, so batches are the
// same for any number of workers and after a state_dict resume.
//
// The contract of a BatchOp:
//   * out_fields(in): the batch's fields after the op, from those before it, known before the
//     first batch (the loader calls it once when it starts, with the source's fields, and refuses
//     a pipeline whose op refuses its input: std::invalid_argument naming the op and the field).
//     An op keeps every field, in order and by name; it may change a fixed field's dtype and
//     sample_shape (Normalize: uint8 -> float; MixUp: int64 [] -> float [classes]). Ragged and
//     host_only fields are not given to ops and stay as they are.
//   * apply(batch, ctx): writes its result into batch's tensors in place, or replaces a tensor
//     with a new one on the same device. Each tensor is [B, ...sample_shape] as out_fields()
//     said; apply_op() checks that the op kept its word (dtype and shape) and turns anything an
//     op throws into a BatchTransformError naming the op and the batch.
//   * Randomness: per sample from ctx.sample_rng(row), a pure function of (seed, epoch, dataset
//     index, view, repeat, op); per batch from ctx.batch_rng(), of (seed, epoch, sequence, op).
//     Never the global RNG.
//   * Written once with ATen operations, so that the same code runs on the CPU and on CUDA (under
//     the loader's side stream as the current stream).
//   * An op is immutable once made (apply is const) and may be called from several threads at
//     once, on different batches.
// Adding an op: its file in augment/src/ (a class deriving from BatchOp and a factory declared
// below), its test in tests/augment_test.cpp, its binding in python/src/augment.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "conveyor/augment_functional.h"
#include "conveyor/prefetch.h"
#include "conveyor/random.h"
#include "conveyor/sample_source.h"

namespace conveyor {

// What the ops drew for one batch, recorded when asked (LoaderOptions::record_augment_params,
// Batch::augment_params): for debugging, and for users who must transform their annotations along.
struct DrawnParam {
  std::string op;    // the op's short name: "RandomErasing", "TrivialAugmentWide", "CutMix", ...
  std::string name;  // what was drawn: an AutoAugment-family step's op ("Rotate": its signed
                     // magnitude), a box's "x0", "y0", "x1", "y1" (pixels, [x0, x1) x [y0, y1)),
                     // "lambda", "sigma", "brightness" (a factor), "applied" (1), ...
  double value = 0;
};
struct FieldRecord;
struct AugmentRecord {
  // rows[r]: what row r received, in the order the ops ran; an op that left the row alone (its p
  // not drawn, no box fitting) records nothing for it.
  std::vector<std::vector<DrawnParam>> rows;
  // The batch-level draws (MixUp's and CutMix's lambda, CutMix's box).
  std::vector<DrawnParam> batch;
  // What the pipelines of per_field() drew, one entry per field they ran on, in their order.
  std::vector<FieldRecord> fields;
};
// What one field's pipeline of per_field() drew: draws.rows[r * views + v] is what view v of row
// r received (views is 1 for a plain image field); draws.batch its batch-level draws.
struct FieldRecord {
  std::string field;
  size_t views = 1;
  AugmentRecord draws;
};

// What an op may know about the batch besides its tensors.
struct BatchContext {
  uint64_t seed = 0;              // the loader's seed (LoaderOptions::seed)
  uint64_t epoch = 0;             // the batch's epoch
  size_t sequence = 0;            // the batch's position in its epoch (Batch::sequence)
  std::vector<size_t> indices;    // the dataset index of each row
  std::vector<uint32_t> repeats;  // each row's repeat number (0 unless a sampler repeats samples);
                                  // empty means all 0
  uint32_t view = 0;              // the view the batch's images are (0: the only one)
  std::vector<uint32_t> views;    // each row's view when they differ (per_field() over a view
                                  // group's rows); empty means all `view`
  uint64_t op = 0;  // which op of a pipeline draws: Compose gives each of its ops its own stream
  // Where the ops write what they drew, or null (the default: nothing recorded). Its rows are
  // rows() long. Shared by the children of a Compose.
  AugmentRecord* record = nullptr;

  size_t rows() const { return indices.size(); }
  // Row `row`'s stream: a pure function of (seed, epoch, indices[row], the row's view,
  // repeats[row], op).
  SampleRng sample_rng(size_t row) const;
  // The batch's stream: a pure function of (seed, epoch, sequence, op).
  SampleRng batch_rng() const;
  // The context an op's child `k` draws from (Compose): the same batch, another stream.
  BatchContext child(size_t k) const;
  // Records that row `row` received `value` for `name` from `op`; does nothing unless recording.
  void note(size_t row, const char* op, const char* name, double value) const {
    if (record != nullptr) record->rows.at(row).push_back({op, name, value});
  }
  // Records a batch-level draw; does nothing unless recording.
  void note_batch(const char* op, const char* name, double value) const {
    if (record != nullptr) record->batch.push_back({op, name, value});
  }
};

// The batch's tensors an op sees, by name, with their specs: the fixed fields that live on the
// batch's device, [B, ...spec.sample_shape] each.
struct BatchFields {
  std::vector<FieldSpec> specs;
  std::vector<at::Tensor> tensors;

  // The position of field `name`. Throws std::out_of_range naming it and the fields there are.
  size_t find(const std::string& name) const;
  at::Tensor& operator[](const std::string& name) { return tensors[find(name)]; }
  const FieldSpec& spec(const std::string& name) const { return specs[find(name)]; }
};

class BatchOp {
 public:
  virtual ~BatchOp() = default;
  // The op and its parameters, as its Python constructor would be written: "RandomErasing(p=0.25)".
  virtual std::string name() const = 0;
  // See the contract above. Throws std::invalid_argument when the op cannot take `in`.
  virtual std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const = 0;
  virtual void apply(BatchFields& batch, const BatchContext& ctx) const = 0;
};

// An op failed on a batch; what() names the op, the batch (epoch, sequence) and the op's error.
class BatchTransformError : public std::runtime_error {
 public:
  BatchTransformError(const std::string& message, std::string op, uint64_t epoch, size_t sequence,
                      std::exception_ptr original);
  const std::string& op() const { return op_; }
  uint64_t epoch() const { return epoch_; }
  size_t sequence() const { return sequence_; }
  // The exception the op threw.
  std::exception_ptr original() const { return original_; }

 private:
  std::string op_;
  uint64_t epoch_;
  size_t sequence_;
  std::exception_ptr original_;
};

// Runs `op` on `batch`: out_fields() of the batch's specs, apply(), then checks that each tensor
// has the dtype and shape out_fields() declared, on the device it had, and sets the specs to the
// new ones. Anything thrown (a broken promise included) becomes a BatchTransformError naming
// `op` and the batch; one from an inner apply_op() (Compose's) passes unchanged.
void apply_op(const BatchOp& op, BatchFields& batch, const BatchContext& ctx);

// Which layout an image field has: [3, H, W] (kCHW) or [H, W, 3] (kHWC). Throws
// std::invalid_argument naming `op` and the field unless it is a 3-d field with 3 channels.
ImageLayout image_layout(const FieldSpec& field, const std::string& op);

// ---------------------------------------------------------------------------------------------
// The ops (torchvision.transforms.v2's names and semantics unless said otherwise)

// The ops in turn, each drawing its own stream (BatchContext::child).
std::shared_ptr<const BatchOp> compose(std::vector<std::shared_ptr<const BatchOp>> ops);

// A pipeline per image field or per view group (DINOv2's per-view recipe): each FieldPipeline
// runs its op(s) on one field only, which its ops see as a batch of one field named "image"
// (so an op's default image name is right; name no other field in it):
//   * a plain image field [3, H, W] or [H, W, 3]: its B rows;
//   * a view group [V, 3, S, S] or [V, S, S, 3] (ImageTransform::views) with one op: its B * V
//     views as rows, row r * V + v being view v of sample r;
//   * a view group with V ops (per_view[v]): view v's B images through per_view[v].
// View v of sample r draws from the stream of (seed, epoch, its index, view v, its repeat, the
// field's op stream, which mixes in the field's name), so one op for a group is V copies of it,
// bit for bit, and each field's draws are independent of the others'. The field keeps its place
// and name; its dtype and per-image shape become what the op makes of them (Normalize: float
// [V, 3, S, S]); the V ops of a group must make the same. Batch-level ops that mix samples
// (MixUp, CutMix) belong in a Compose around this, where they see the label too. Requires a
// field named once, each FieldPipeline with 1 op, or V for a view group of V views; throws
// std::invalid_argument naming the field otherwise (out_fields).
struct FieldPipeline {
  std::string field;
  std::vector<std::shared_ptr<const BatchOp>> per_view;  // 1 op, or 1 per view of a group
};
std::shared_ptr<const BatchOp> per_field(std::vector<FieldPipeline> pipelines);

// A uint8 image field to `dtype` (float32, float16 or bfloat16) [B,3,H,W]: (x / 255 - mean) / std,
// by normalize_images()'s rule (conveyor/prefetch.h), which it calls. An HWC field becomes CHW.
std::shared_ptr<const BatchOp> normalize(const NormalizeOptions& options,
                                         std::string image = "image");

// Per sample, with probability p, a box of area fraction in [scale_min, scale_max) of the image
// and aspect ratio in [ratio_min, ratio_max) (log-uniform) set to `value` (one value, or one per
// channel); torchvision draws up to 10 boxes and erases nothing when none fits, as this does.
struct RandomErasingOptions {
  double p = 0.5;
  double scale_min = 0.02, scale_max = 0.33;
  double ratio_min = 0.3, ratio_max = 3.3;
  std::vector<double> value{0.0};
  std::string image = "image";
};
std::shared_ptr<const BatchOp> random_erasing(RandomErasingOptions options);

// timm's Mixup: per batch, lambda ~ Beta(alpha, alpha), and the batch is mixed with itself in
// reverse row order (row r with row B-1-r). MixUp blends the images: x * lambda + flip(x) *
// (1 - lambda) (rounded back for uint8 images). CutMix pastes flip(x)'s box of area about
// (1 - lambda) into x, the box's centre uniform in the image and clipped to it, and corrects
// lambda to 1 - (the clipped box's area) / (the image's). The label field, int64 [B] of classes in
// [0, num_classes), becomes float32 [B, num_classes]: smoothed one-hot(y) * lambda + smoothed
// one-hot(flip(y)) * (1 - lambda), the one-hot smoothed as timm's (off = smoothing / classes,
// on = 1 - smoothing + off), so each row sums to 1. MixUpCutMix chooses CutMix with probability
// switch_prob when both alphas are > 0 (else the one that is), per batch, as timm's Mixup with
// mix_prob 1.
struct MixUpCutMixOptions {
  double mixup_alpha = 0.8;
  double cutmix_alpha = 1.0;
  double switch_prob = 0.5;
  double label_smoothing = 0.1;
  int64_t num_classes = 1000;
  std::string image = "image";
  std::string label = "label";
};
std::shared_ptr<const BatchOp> mixup_cutmix(MixUpCutMixOptions options);
// MixUp(alpha) alone, CutMix(alpha) alone: torchvision's defaults (alpha 1, no smoothing).
std::shared_ptr<const BatchOp> mixup(double alpha, int64_t num_classes,
                                     double label_smoothing = 0.0, std::string image = "image",
                                     std::string label = "label");
std::shared_ptr<const BatchOp> cutmix(double alpha, int64_t num_classes,
                                      double label_smoothing = 0.0, std::string image = "image",
                                      std::string label = "label");

// ---------------------------------------------------------------------------------------------
// Per-sample photometric ops: each image of the batch gets its own draw from ctx.sample_rng(row)
// and is transformed by the functions of conveyor/augment_functional.h (torchvision's kernels).

// torchvision's ColorJitter: each factor uniform in its [min, max] (brightness, contrast and
// saturation >= 0; hue in [-0.5, 0.5]), the four adjustments in a random order; a range whose ends
// are the identity (1, or 0 for hue) is skipped. Applied to a sample with probability p (1: always;
// RandomApply([ColorJitter(...)], p) as DINOv2 writes it).
struct ColorJitterOptions {
  double brightness_min = 1, brightness_max = 1;
  double contrast_min = 1, contrast_max = 1;
  double saturation_min = 1, saturation_max = 1;
  double hue_min = 0, hue_max = 0;
  double p = 1.0;
  std::string image = "image";
};
std::shared_ptr<const BatchOp> color_jitter(ColorJitterOptions options);

// With probability p, the image made gray (rgb_to_grayscale, on its 3 channels).
std::shared_ptr<const BatchOp> random_grayscale(double p = 0.1, std::string image = "image");

// With probability p, a Gaussian blur of kernel_size (x, y; odd) and sigma uniform in
// [sigma_min, sigma_max], the same in x and y (torchvision's GaussianBlur, reflect padding).
struct GaussianBlurOptions {
  std::vector<int64_t> kernel_size{23, 23};
  double sigma_min = 0.1, sigma_max = 2.0;
  double p = 1.0;
  std::string image = "image";
};
std::shared_ptr<const BatchOp> gaussian_blur(GaussianBlurOptions options);

// With probability p, solarize(image, threshold) (torchvision's RandomSolarize).
std::shared_ptr<const BatchOp> random_solarize(double threshold, double p = 0.5,
                                               std::string image = "image");

// ---------------------------------------------------------------------------------------------
// The AutoAugment family, per sample, over torchvision's op tables (augment_functional's
// apply_augment_op). Geometric ops use `interpolation` and `fill` (empty: torchvision's None).

// torchvision's TrivialAugmentWide: one op uniform among its 14, a magnitude bin uniform among
// num_magnitude_bins, the sign of a signed op's magnitude + or - with probability 1/2.
struct TrivialAugmentWideOptions {
  int64_t num_magnitude_bins = 31;
  augment_functional::Interpolation interpolation = augment_functional::Interpolation::kNearest;
  std::vector<double> fill;
  std::string image = "image";
};
std::shared_ptr<const BatchOp> trivial_augment_wide(TrivialAugmentWideOptions options);

// RandAugment. torchvision's (timm = false): num_ops ops, each uniform among its 14 (with
// replacement), at bin `magnitude` of num_magnitude_bins, a random sign. timm's (timm = true, the
// DeiT recipe's "rand-m9-mstd0.5-inc1", parse_timm_rand_augment): num_ops ops uniform (with
// replacement) among timm's 15 (the increasing set when `increasing`, else timm's standard set),
// each applied with probability op_prob, its magnitude on timm's 0..10 scale drawn per application
// as N(magnitude, magnitude_std) clipped to [0, magnitude_max], with timm's level functions.
struct RandAugmentOptions {
  int64_t num_ops = 2;
  double magnitude = 9;
  int64_t num_magnitude_bins = 31;
  augment_functional::Interpolation interpolation = augment_functional::Interpolation::kNearest;
  std::vector<double> fill;
  bool timm = false;
  double magnitude_std = 0;
  double magnitude_max = 10;
  bool increasing = false;
  double op_prob = 0.5;
  std::string image = "image";
};
std::shared_ptr<const BatchOp> rand_augment(RandAugmentOptions options);
// timm's config string "rand-m9-mstd0.5-inc1" (keys m, n, mstd, mmax, inc, p): timm's defaults
// (2 ops, probability 0.5, bilinear, fill timm's ImageNet mean (124, 116, 104)) with its values.
// Throws std::invalid_argument naming a part it cannot read.
RandAugmentOptions parse_timm_rand_augment(const std::string& config);

// torchvision's AutoAugment with the ImageNet policy: one of its 25 sub-policies uniform, each of
// its two ops applied with its probability at its magnitude bin (of 10), a random sign.
struct AutoAugmentOptions {
  augment_functional::Interpolation interpolation = augment_functional::Interpolation::kNearest;
  std::vector<double> fill;
  std::string image = "image";
};
std::shared_ptr<const BatchOp> auto_augment(AutoAugmentOptions options);

// Draws, shared by the ops and their tests (pure functions of the stream they are given).
namespace augment_draws {
// Beta(a, b) from two Gamma draws (Marsaglia and Tsang), a, b > 0.
double beta(SampleRng& rng, double a, double b);
// A box [y0, y1) x [x0, x1) in an h x w image.
struct Box {
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
  int64_t area() const { return (y1 - y0) * (x1 - x0); }
};
// CutMix's box for `lambda` (timm's rand_bbox): cut sides h * sqrt(1 - lambda) and
// w * sqrt(1 - lambda), the centre uniform, clipped to the image.
Box cutmix_box(SampleRng& rng, int64_t h, int64_t w, double lambda);
// RandomErasing's box, or an empty box when the sample is not erased (probability 1 - p) or no
// box fits in 10 tries (torchvision's get_params).
Box erasing_box(SampleRng& rng, int64_t h, int64_t w, const RandomErasingOptions& options);
// One step of an AutoAugment-family op: the op's torchvision name and its signed magnitude.
struct AugmentStep {
  std::string op;
  double magnitude = 0;
};
// The steps that `op` (TrivialAugmentWide, RandAugment or AutoAugment) draws for one h x w image
// from rng, in order (skipped ones left out). Throws std::invalid_argument for another op.
std::vector<AugmentStep> augment_steps(const BatchOp& op, SampleRng& rng, int64_t h, int64_t w);
}  // namespace augment_draws

}  // namespace conveyor
