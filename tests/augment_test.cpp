// augment_test: the batch ops of conveyor/augment.h on the CPU, alone (no loader): Normalize
// against normalize_images, RandomErasing's rate and boxes, MixUp's and CutMix's soft targets and
// CutMix's pasted area, the draws' laws, apply_op()'s checks and errors. The loader's batch stage
// is batch_stage_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "conveyor/augment.h"
#include "cpu_kernels.h"
#include "mix.h"

namespace conveyor {
namespace {

std::vector<FieldSpec> image_label_specs(int64_t s, bool hwc = false) {
  return {{"image", c10::ScalarType::Byte,
           hwc ? std::vector<int64_t>{s, s, 3} : std::vector<int64_t>{3, s, s}},
          {"label", c10::ScalarType::Long, {}}};
}

// A batch of b random images (s x s) and labels in [0, classes).
BatchFields make_batch(int64_t b, int64_t s, int64_t classes, bool hwc = false, uint64_t seed = 1) {
  at::manual_seed(seed);
  BatchFields batch;
  batch.specs = image_label_specs(s, hwc);
  batch.tensors = {
      at::randint(0, 256, hwc ? std::vector<int64_t>{b, s, s, 3} : std::vector<int64_t>{b, 3, s, s},
                  at::kByte),
      at::randint(0, classes, {b}, at::kLong)};
  return batch;
}

BatchContext context(size_t rows, uint64_t seed = 7, uint64_t epoch = 0, size_t sequence = 0,
                     size_t first_index = 0) {
  BatchContext ctx;
  ctx.seed = seed;
  ctx.epoch = epoch;
  ctx.sequence = sequence;
  for (size_t r = 0; r < rows; ++r) ctx.indices.push_back(first_index + r);
  return ctx;
}

TEST(Normalize, EqualsNormalizeImagesForBothLayouts) {
  for (const bool hwc : {false, true}) {
    BatchFields batch = make_batch(5, 16, 10, hwc);
    const at::Tensor images = batch.tensors[0].clone();
    const at::Tensor labels = batch.tensors[1].clone();
    NormalizeOptions o;
    o.mean = {0.5f, 0.4f, 0.3f};
    o.std = {0.2f, 0.25f, 0.3f};
    apply_op(*normalize(o), batch, context(5));
    o.hwc = hwc;
    const at::Tensor want = normalize_images(images, o);
    EXPECT_TRUE(batch.tensors[0].equal(want)) << "hwc " << hwc;
    EXPECT_EQ(batch.specs[0].dtype, c10::ScalarType::Float);
    EXPECT_EQ(batch.specs[0].sample_shape, (std::vector<int64_t>{3, 16, 16}));
    EXPECT_TRUE(batch.tensors[1].equal(labels)) << "labels untouched";
  }
}

TEST(RandomErasing, ErasesAtItsRateWithBoxesInsideTheImageAndFollowsItsDraws) {
  RandomErasingOptions o;
  o.p = 0.3;
  o.value = {0.0};
  const auto op = random_erasing(o);
  const int64_t s = 20, b = 64;
  size_t erased = 0, rows = 0;
  for (size_t round = 0; round < 40; ++round) {
    BatchFields batch = make_batch(b, s, 10, false, round + 1);
    batch.tensors[0].clamp_min_(1);  // so that a zero is an erased pixel
    const BatchContext ctx = context(b, 7, 0, round, round * b);
    apply_op(*op, batch, ctx);
    for (int64_t r = 0; r < b; ++r, ++rows) {
      SampleRng rng = ctx.sample_rng(static_cast<size_t>(r));
      const augment_draws::Box box = augment_draws::erasing_box(rng, s, s, o);
      const at::Tensor zero = batch.tensors[0][r].eq(0);
      // Exactly the drawn box is erased, in every channel, and it lies inside the image.
      at::Tensor want = at::zeros({3, s, s}, at::kBool);
      if (box.area() > 0) {
        ++erased;
        EXPECT_TRUE(box.y0 >= 0 && box.y1 <= s && box.x0 >= 0 && box.x1 <= s && box.y0 < box.y1 &&
                    box.x0 < box.x1);
        const double fraction = static_cast<double>(box.area()) / (s * s);
        EXPECT_GE(fraction, 0.01) << "scale 0.02-0.33 of the area, rounded";
        EXPECT_LE(fraction, 0.40);
        want.narrow(1, box.y0, box.y1 - box.y0).narrow(2, box.x0, box.x1 - box.x0).fill_(true);
      }
      ASSERT_TRUE(zero.equal(want)) << "row " << r << " of round " << round;
    }
  }
  // 2,560 draws at p 0.3 (a few boxes do not fit in 10 tries): 4 sigma is 0.036.
  const double rate = static_cast<double>(erased) / static_cast<double>(rows);
  EXPECT_NEAR(rate, 0.3, 0.04) << erased << " of " << rows;
}

TEST(RandomErasing, PerChannelValueAndHwcLayout) {
  RandomErasingOptions o;
  o.p = 1.0;
  o.value = {10, 20, 30};
  BatchFields batch = make_batch(8, 24, 10, /*hwc=*/true);
  const BatchContext ctx = context(8);
  apply_op(*random_erasing(o), batch, ctx);
  for (int64_t r = 0; r < 8; ++r) {
    SampleRng rng = ctx.sample_rng(static_cast<size_t>(r));
    const augment_draws::Box box = augment_draws::erasing_box(rng, 24, 24, o);
    ASSERT_GT(box.area(), 0);
    const at::Tensor region =
        batch.tensors[0][r].narrow(0, box.y0, box.y1 - box.y0).narrow(1, box.x0, box.x1 - box.x0);
    for (int c = 0; c < 3; ++c) {
      EXPECT_TRUE(region.select(2, c).eq(10 * (c + 1)).all().item<bool>()) << r << " " << c;
    }
  }
}

TEST(MixUpCutMix, MixUpTargetsSumToOneAndImagesAreTheBlend) {
  const int64_t b = 6, classes = 5;
  BatchFields batch = make_batch(b, 8, classes);
  const at::Tensor images = batch.tensors[0].clone();
  const at::Tensor labels = batch.tensors[1].clone();
  const BatchContext ctx = context(b, 3, 1, 4);
  apply_op(*mixup(0.4, classes, 0.1), batch, ctx);
  SampleRng rng = ctx.batch_rng();
  const double lambda = augment_draws::beta(rng, 0.4, 0.4);
  const at::Tensor x = images.to(at::kFloat);
  EXPECT_TRUE(
      batch.tensors[0].equal((x * lambda + x.flip(0) * (1 - lambda)).round().to(at::kByte)));
  const at::Tensor& y = batch.tensors[1];
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{b, classes}));
  EXPECT_TRUE(y.sum(1).allclose(at::ones({b}), 0, 1e-6));
  for (int64_t r = 0; r < b; ++r) {  // lambda on the row's class, 1 - lambda on its flip's
    const int64_t mine = labels[r].item<int64_t>(), theirs = labels[b - 1 - r].item<int64_t>();
    const double off = 0.1 / classes, on = 0.9 + off;
    const double want = mine == theirs ? on : on * lambda + off * (1 - lambda);
    EXPECT_NEAR(y[r][mine].item<float>(), want, 1e-6) << r;
  }
}

// The uint8 CPU fast path (a table of the rule's float32 results, one pass over row pairs)
// against the rule written with ATen, on random batches (even and odd rows, CHW and HWC, all
// 256 levels) and many lambdas, extreme ones included.
TEST(MixUpCutMix, TheUint8FastPathIsBitIdenticalToTheFloatRule) {
  at::manual_seed(7);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t b = 1 + trial % 9;
    const bool hwc = trial % 2 == 1;
    const at::Tensor images = hwc ? at::randint(0, 256, {b, 12, 10, 3}, at::kByte)
                                  : at::randint(0, 256, {b, 3, 12, 10}, at::kByte);
    BatchFields batch;
    batch.specs = {{"image", at::kByte,
                    std::vector<int64_t>(images.sizes().begin() + 1, images.sizes().end())},
                   {"label", at::kLong, {}}};
    batch.tensors = {images.clone(), at::zeros({b}, at::kLong)};
    const BatchContext ctx = context(static_cast<size_t>(b), 5, static_cast<size_t>(trial), 2);
    const double alpha = trial < 20 ? 0.2 : trial < 40 ? 1.0 : 8.0;
    apply_op(*mixup(alpha, 3), batch, ctx);
    SampleRng rng = ctx.batch_rng();
    const double lambda = augment_draws::beta(rng, alpha, alpha);
    const at::Tensor x = images.to(at::kFloat);
    const at::Tensor want = (x * lambda + x.flip(0) * (1.0 - lambda)).round().to(at::kByte);
    ASSERT_TRUE(batch.tensors[0].equal(want)) << "trial " << trial << ", lambda " << lambda;
    ++checked;
  }
  // Every pair of levels, at lambdas where float32 rounding ties are likeliest.
  const at::Tensor levels = at::arange(256, at::kInt).to(at::kByte);
  const at::Tensor a = levels.repeat_interleave(256), bb = levels.repeat(256);
  for (const double lambda : {0.5, 0.25, 0.125, 0.1, 1.0 / 3, 0.999999, 1e-7, 0.0, 1.0}) {
    at::Tensor images = at::stack({a.view({256, 256}), bb.view({256, 256})}).unsqueeze(1);
    images = images.expand({2, 3, 256, 256}).contiguous();
    const at::Tensor x = images.to(at::kFloat);
    const at::Tensor want = (x * lambda + x.flip(0) * (1.0 - lambda)).round().to(at::kByte);
    augment_detail::mix_with_flip(images, lambda);
    EXPECT_TRUE(images.equal(want)) << "lambda " << lambda;
    ++checked;
  }
  EXPECT_EQ(checked, 69);
}

TEST(MixUpCutMix, CutMixWeightsAreThePastedAreaExactly) {
  const int64_t b = 6, s = 32, classes = 4;
  size_t pasted_batches = 0;
  for (size_t sequence = 0; sequence < 30; ++sequence) {
    BatchFields batch = make_batch(b, s, classes, false, sequence + 1);
    // Each row's pixels are its row number, so each pixel tells where it came from.
    for (int64_t r = 0; r < b; ++r) batch.tensors[0][r].fill_(r);
    batch.tensors[1] = at::arange(b, at::kLong) % classes;
    const BatchContext ctx = context(b, 5, 0, sequence);
    apply_op(*cutmix(1.0, classes), batch, ctx);
    const at::Tensor& y = batch.tensors[1];
    EXPECT_TRUE(y.sum(1).allclose(at::ones({b}), 0, 1e-6));
    for (int64_t r = 0; r < b; ++r) {
      const int64_t flip = b - 1 - r;
      // The share of the image that is the flipped row's pixels, counted.
      const double pasted =
          batch.tensors[0][r].eq(flip).sum().item<double>() / static_cast<double>(3 * s * s);
      const double own = r == flip ? 1.0 : 1.0 - pasted;
      if (r != flip && pasted > 0) ++pasted_batches;
      EXPECT_NEAR(y[r][r % classes].item<float>(), r % classes == flip % classes ? 1.0 : own, 1e-6)
          << "sequence " << sequence << " row " << r;
      if (r % classes != flip % classes) {
        EXPECT_NEAR(y[r][flip % classes].item<float>(), pasted, 1e-6);
      }
    }
  }
  EXPECT_GT(pasted_batches, 0u);
}

TEST(MixUpCutMix, SwitchesAtItsRateAndIsAFunctionOfTheBatch) {
  MixUpCutMixOptions o;
  o.mixup_alpha = 0.2;
  o.cutmix_alpha = 1.0;
  o.switch_prob = 0.5;
  o.num_classes = 10;
  const auto op = mixup_cutmix(o);
  size_t cut = 0;
  const size_t n = 400;
  for (size_t sequence = 0; sequence < n; ++sequence) {
    BatchFields batch = make_batch(4, 8, 10);
    for (int64_t r = 0; r < 4; ++r) batch.tensors[0][r].fill_(r * 50);
    apply_op(*op, batch, context(4, 9, 2, sequence));
    // CutMix leaves pixels that are one row's or the other's; MixUp blends every pixel alike.
    const at::Tensor row0 = batch.tensors[0][0];
    const bool pure = row0.eq(0).logical_or(row0.eq(150)).all().item<bool>();
    const bool uniform = row0.eq(row0.flatten()[0]).all().item<bool>();
    if (pure && !uniform) ++cut;
    BatchFields again = make_batch(4, 8, 10);
    for (int64_t r = 0; r < 4; ++r) again.tensors[0][r].fill_(r * 50);
    apply_op(*op, again, context(4, 9, 2, sequence));
    ASSERT_TRUE(again.tensors[0].equal(batch.tensors[0])) << "the same batch, the same result";
  }
  // Some CutMix boxes are empty or whole: the rate of visible boxes is a little under 0.5.
  EXPECT_NEAR(static_cast<double>(cut) / n, 0.45, 0.1) << cut;
}

TEST(Draws, BetaHasItsMean) {
  for (const double a : {0.2, 1.0, 3.0}) {
    SampleRng rng(1, 2, 3);
    double sum = 0, sq = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
      const double x = augment_draws::beta(rng, a, a);
      ASSERT_TRUE(x >= 0 && x <= 1);
      sum += x;
      sq += x * x;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 0.01) << a;
    EXPECT_NEAR(var, 1.0 / (4 * (2 * a + 1)), 0.01) << a;  // Beta(a, a)'s variance
  }
}

TEST(Draws, StreamsDifferByOpViewRepeatAndIndex) {
  BatchContext ctx = context(2);
  const uint64_t base = ctx.sample_rng(0).next();
  EXPECT_NE(base, ctx.sample_rng(1).next());
  EXPECT_NE(base, ctx.child(0).sample_rng(0).next());
  EXPECT_NE(ctx.child(0).sample_rng(0).next(), ctx.child(1).sample_rng(0).next());
  BatchContext view = ctx;
  view.view = 1;
  EXPECT_NE(base, view.sample_rng(0).next());
  BatchContext repeat = ctx;
  repeat.repeats = {1, 0};
  EXPECT_NE(base, repeat.sample_rng(0).next());
  EXPECT_EQ(ctx.sample_rng(1).next(), repeat.sample_rng(1).next());
  EXPECT_NE(ctx.batch_rng().next(), base);
}

TEST(ApplyOp, ComposeRunsInTurnAndDeclaresTheLastSpecs) {
  NormalizeOptions n;
  const auto op = compose({random_erasing({}), normalize(n), mixup_cutmix({})});
  const std::vector<FieldSpec> out = op->out_fields(image_label_specs(8));
  EXPECT_EQ(out[0].dtype, c10::ScalarType::Float);
  EXPECT_EQ(out[1].dtype, c10::ScalarType::Float);
  EXPECT_EQ(out[1].sample_shape, (std::vector<int64_t>{1000}));
  BatchFields batch = make_batch(3, 8, 1000);
  apply_op(*op, batch, context(3));
  EXPECT_EQ(batch.tensors[1].sizes().vec(), (std::vector<int64_t>{3, 1000}));
  EXPECT_NE(op->name().find("Compose([RandomErasing(p=0.5"), std::string::npos) << op->name();
}

TEST(ApplyOp, RefusesWhatAnOpCannotTakeNamingTheOpAndField) {
  const auto op = mixup(1.0, 10);
  std::vector<FieldSpec> specs = image_label_specs(8);
  specs[1].dtype = c10::ScalarType::Float;
  try {
    op->out_fields(specs);
    FAIL() << "float labels taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MixUp(alpha=1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"label\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(random_erasing({.p = 2.0}), std::invalid_argument);
}

TEST(ApplyOp, ALabelOutOfRangeIsTheBatchsErrorNamingTheSample) {
  BatchFields batch = make_batch(4, 8, 10);
  batch.tensors[1][2] = 12;
  try {
    apply_op(*mixup(1.0, 10), batch, context(4, 1, 3, 9, 100));
    FAIL() << "label 12 of 10 classes taken";
  } catch (const BatchTransformError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.sequence(), 9u);
    EXPECT_EQ(e.epoch(), 3u);
    EXPECT_NE(what.find("MixUp(alpha=1"), std::string::npos) << what;
    EXPECT_NE(what.find("batch 9 of epoch 3"), std::string::npos) << what;
    EXPECT_NE(what.find("label 12 of sample 102"), std::string::npos) << what;
  }
}

// An op that says it keeps its field but replaces it with something else.
class Liar final : public BatchOp {
 public:
  std::string name() const override { return "Liar()"; }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override { return in; }
  void apply(BatchFields& batch, const BatchContext&) const override {
    batch["label"] = batch["label"].to(at::kFloat);
  }
};

TEST(ApplyOp, AnOpThatBreaksItsDeclaredSpecIsTheBatchsError) {
  BatchFields batch = make_batch(2, 8, 10);
  try {
    apply_op(*compose({normalize({}), std::make_shared<Liar>()}), batch, context(2));
    FAIL() << "a broken promise passed";
  } catch (const BatchTransformError& e) {
    EXPECT_EQ(e.op(), "Liar()");  // the innermost op, not Compose
    EXPECT_NE(std::string(e.what()).find("declared Long [2]"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// The photometric and geometric functions and the per-sample ops (torchvision's semantics; the
// exact comparison with torchvision is tests/python/test_augment_ops.py, which needs it).

namespace F = augment_functional;

// Photo-like images: smooth gradients plus noise, so that every op has something to change.
at::Tensor photos(int64_t b, int64_t s, uint64_t seed = 5) {
  at::manual_seed(seed);
  const at::Tensor ramp = at::linspace(0, 1, s, at::kFloat);
  const at::Tensor base = (ramp.view({1, 1, s, 1}) * at::rand({b, 3, 1, 1}) * 200 +
                           ramp.view({1, 1, 1, s}) * at::rand({b, 3, 1, 1}) * 55);
  return (base + at::randn({b, 3, s, s}) * 12).clamp(0, 255).to(at::kByte);
}

TEST(Functional, PosterizeAndSolarizeAreTheirFormulasOnRandomImages) {
  const at::Tensor x = at::randint(0, 256, {4, 3, 17, 23}, at::kByte);
  const at::Tensor xi = x.to(at::kInt);
  for (int64_t bits = 0; bits <= 8; ++bits) {
    const at::Tensor want = (xi.div(1 << (8 - bits), "floor") * (1 << (8 - bits))).to(at::kByte);
    EXPECT_TRUE(F::posterize(x, bits).equal(want)) << "bits " << bits;
  }
  for (const double t : {0.0, 1.0, 100.5, 128.0, 255.0}) {
    const at::Tensor want = at::where(xi.to(at::kDouble) >= t, 255 - xi, xi).to(at::kByte);
    EXPECT_TRUE(F::solarize(x, t).equal(want)) << "threshold " << t;
  }
  EXPECT_TRUE(F::invert(x).equal((255 - xi).to(at::kByte)));
  const at::Tensor added = F::solarize_add(x, 60);
  EXPECT_TRUE(added.equal(at::where(xi < 128, (xi + 60).clamp_max(255), xi).to(at::kByte)));
}

TEST(Functional, EveryOpIsTheIdentityAtMagnitudeZero) {
  const at::Tensor x = photos(3, 32);
  for (const char* op : {"Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate",
                         "Brightness", "Color", "Contrast", "Sharpness"}) {
    for (const auto mode : {F::Interpolation::kNearest, F::Interpolation::kBilinear}) {
      const at::Tensor y = F::apply_augment_op(x, op, 0.0, mode, {});
      EXPECT_TRUE(y.equal(x)) << op << " changed " << y.ne(x).sum().item<int64_t>() << " pixels";
    }
  }
  EXPECT_TRUE(F::posterize(x, 8).equal(x));
  EXPECT_TRUE(F::apply_augment_op(x, "Solarize", 1.0, F::Interpolation::kNearest, {})
                  .eq(x.lt(255).to(at::kByte) * x + x.eq(255).to(at::kByte) * 0)
                  .all()
                  .item<bool>());
}

TEST(Functional, ColourAndContrastLawsHold) {
  const at::Tensor x = photos(4, 24);
  // Saturation 0 and grayscale are gray: three equal channels.
  for (const at::Tensor& g : {F::adjust_saturation(x, 0.0), F::rgb_to_grayscale(x)}) {
    EXPECT_TRUE(g.select(1, 0).equal(g.select(1, 1)) && g.select(1, 1).equal(g.select(1, 2)));
  }
  // Contrast 0 is the image's mean luma everywhere.
  const at::Tensor flat = F::adjust_contrast(x, 0.0);
  EXPECT_TRUE(flat.eq(flat.flatten(1).select(1, 0).view({4, 1, 1, 1})).all().item<bool>());
  // Brightness scales and clamps.
  EXPECT_TRUE(
      F::adjust_brightness(x, 2.0).equal((x.to(at::kFloat) * 2).clamp(0, 255).to(at::kByte)));
  // Hue 0 keeps the image within one level (the HSV round trip in float32); hue 0.5 twice is
  // the identity up to the same.
  EXPECT_LE((F::adjust_hue(x, 0.0).to(at::kInt) - x.to(at::kInt)).abs().max().item<int>(), 1);
  // Autocontrast stretches each channel to [0, 255] (its float32 scale can land the maximum just
  // under 255, truncated to 254, as torchvision's does).
  const at::Tensor a = F::autocontrast(x);
  EXPECT_TRUE(a.amin({-2, -1}).eq(0).all().item<bool>());
  EXPECT_TRUE(a.amax({-2, -1}).ge(254).all().item<bool>());
  // Equalize is a monotone map of each channel, and leaves a constant image as it is.
  const at::Tensor e = F::equalize(x);
  for (int64_t c = 0; c < 3; ++c) {
    const at::Tensor order = x[0][c].flatten().argsort();
    const at::Tensor sorted = e[0][c].flatten().index_select(0, order).to(at::kInt);
    EXPECT_TRUE(sorted.diff().ge(0).all().item<bool>()) << "channel " << c;
  }
  const at::Tensor constant = at::full({1, 3, 8, 8}, 77, at::kByte);
  EXPECT_TRUE(F::equalize(constant).equal(constant));
  // The blur keeps a constant image and smooths noise.
  EXPECT_TRUE(F::gaussian_blur(constant, {5, 5}, {1.5, 1.5}).equal(constant));
  const at::Tensor noise = at::randint(0, 256, {1, 3, 32, 32}, at::kByte);
  EXPECT_LT(F::gaussian_blur(noise, {9, 9}, {2.0, 2.0}).to(at::kFloat).std().item<double>(),
            noise.to(at::kFloat).std().item<double>() / 2);
}

TEST(Functional, GeometryMovesPixelsWhereItSays) {
  const at::Tensor x = photos(2, 20);
  // A translation by (3, -2) pixels: out[y][x] = in[y + 2][x - 3], zeros (or the fill) outside.
  const at::Tensor t = F::affine(x, 0, {3, -2}, 1.0, {0, 0}, F::Interpolation::kNearest, {});
  EXPECT_TRUE(t.narrow(-2, 0, 18).narrow(-1, 3, 17).equal(x.narrow(-2, 2, 18).narrow(-1, 0, 17)));
  EXPECT_TRUE(t.narrow(-1, 0, 3).eq(0).all().item<bool>());
  const at::Tensor filled =
      F::affine(x, 0, {3, -2}, 1.0, {0, 0}, F::Interpolation::kBilinear, {9, 8, 7});
  EXPECT_TRUE(filled.narrow(-1, 0, 3).select(1, 1).eq(8).all().item<bool>());
  // Rotations by 90 degrees are exact; four of 90 are the identity.
  at::Tensor r = x;
  for (int k = 0; k < 4; ++k) r = F::rotate(r, 90, F::Interpolation::kNearest, {});
  EXPECT_TRUE(r.equal(x));
  EXPECT_TRUE(F::rotate(x, 90, F::Interpolation::kBilinear, {}).equal(at::rot90(x, 1, {-2, -1})));
  // A shear about the top-left corner keeps the first row.
  const at::Tensor s = F::apply_augment_op(x, "ShearX", 0.4, F::Interpolation::kNearest, {});
  EXPECT_TRUE(s.narrow(-2, 0, 1).equal(x.narrow(-2, 0, 1)));
  EXPECT_FALSE(s.equal(x));
}

BatchFields photo_batch(int64_t b, int64_t s, bool hwc) {
  BatchFields batch;
  batch.specs = image_label_specs(s, hwc);
  at::Tensor images = photos(b, s);
  if (hwc) images = images.permute({0, 2, 3, 1}).contiguous();
  batch.tensors = {images, at::zeros({b}, at::kLong)};
  return batch;
}

std::vector<std::shared_ptr<const BatchOp>> per_sample_ops() {
  ColorJitterOptions jitter;
  jitter.brightness_min = 0.6, jitter.brightness_max = 1.4;
  jitter.contrast_min = 0.6, jitter.contrast_max = 1.4;
  jitter.saturation_min = 0.8, jitter.saturation_max = 1.2;
  jitter.hue_min = -0.1, jitter.hue_max = 0.1;
  jitter.p = 0.8;
  GaussianBlurOptions blur;
  blur.kernel_size = {9, 9};
  blur.p = 0.5;
  RandAugmentOptions torchvision_ra;
  return {color_jitter(jitter),
          random_grayscale(0.2),
          gaussian_blur(blur),
          random_solarize(128, 0.2),
          trivial_augment_wide({}),
          rand_augment(torchvision_ra),
          rand_augment(parse_timm_rand_augment("rand-m9-mstd0.5-inc1")),
          auto_augment({})};
}

TEST(PerSampleOps, EachRowIsAFunctionOfItsStreamInBothLayouts) {
  const int64_t b = 12, s = 24;
  for (const auto& op : per_sample_ops()) {
    BatchFields chw = photo_batch(b, s, false), hwc = photo_batch(b, s, true);
    const at::Tensor before = chw.tensors[0].clone();
    const BatchContext ctx = context(b, 11, 2, 0, 100);
    apply_op(*op, chw, ctx);
    apply_op(*op, hwc, ctx);
    EXPECT_TRUE(hwc.tensors[0].permute({0, 3, 1, 2}).equal(chw.tensors[0])) << op->name();
    EXPECT_FALSE(chw.tensors[0].equal(before)) << op->name() << " changed nothing";
    // The same samples in another batch, in another order, get the same images.
    BatchFields shuffled = photo_batch(b, s, false);
    BatchContext reversed = ctx;
    std::reverse(reversed.indices.begin(), reversed.indices.end());
    shuffled.tensors[0] = shuffled.tensors[0].flip(0).contiguous();
    apply_op(*op, shuffled, reversed);
    EXPECT_TRUE(shuffled.tensors[0].flip(0).equal(chw.tensors[0])) << op->name();
    // Another epoch draws again.
    BatchFields next = photo_batch(b, s, false);
    BatchContext later = ctx;
    later.epoch = 3;
    apply_op(*op, next, later);
    EXPECT_FALSE(next.tensors[0].equal(chw.tensors[0])) << op->name();
  }
}

TEST(PerSampleOps, PolicyOpsApplyExactlyTheStepsTheyDraw) {
  const int64_t b = 16, s = 24;
  for (const auto& op : per_sample_ops()) {
    if (op->name().find("Augment") == std::string::npos) continue;
    BatchFields batch = photo_batch(b, s, false);
    const at::Tensor before = batch.tensors[0].clone();
    const BatchContext ctx = context(b, 3);
    apply_op(*op, batch, ctx);
    const bool timm = op->name().find("timm") != std::string::npos;
    const auto mode = timm ? F::Interpolation::kBilinear : F::Interpolation::kNearest;
    const std::vector<double> fill =
        timm ? std::vector<double>{124, 116, 104} : std::vector<double>{};
    for (int64_t r = 0; r < b; ++r) {
      SampleRng rng = ctx.sample_rng(static_cast<size_t>(r));
      at::Tensor want = before[r];
      for (const auto& step : augment_draws::augment_steps(*op, rng, s, s)) {
        want = F::apply_augment_op(want, step.op, step.magnitude, mode, fill);
      }
      EXPECT_TRUE(batch.tensors[0][r].equal(want)) << op->name() << " row " << r;
    }
  }
}

TEST(PerSampleOps, TheIdentityRangesLeaveTheImages) {
  BatchFields batch = photo_batch(6, 16, false);
  const at::Tensor before = batch.tensors[0].clone();
  apply_op(*color_jitter({}), batch, context(6));
  apply_op(*random_grayscale(0.0), batch, context(6));
  apply_op(*random_solarize(100, 0.0), batch, context(6));
  EXPECT_TRUE(batch.tensors[0].equal(before));
}

TEST(PerSampleOps, RefuseFloatImagesAndBadParameters) {
  BatchFields batch = make_batch(2, 8, 10);
  apply_op(*normalize({}), batch, context(2));
  EXPECT_THROW(apply_op(*trivial_augment_wide({}), batch, context(2)), BatchTransformError);
  ColorJitterOptions bad;
  bad.hue_max = 0.7;
  EXPECT_THROW(color_jitter(bad), std::invalid_argument);
  EXPECT_THROW(random_grayscale(1.5), std::invalid_argument);
  EXPECT_THROW(parse_timm_rand_augment("rand-m9-w3"), std::invalid_argument);
  EXPECT_THROW(parse_timm_rand_augment("auto-m9"), std::invalid_argument);
  RandAugmentOptions ra;
  ra.magnitude = 31;
  EXPECT_THROW(rand_augment(ra), std::invalid_argument);
}

TEST(PerSampleOps, TimmConfigIsRead) {
  const RandAugmentOptions o = parse_timm_rand_augment("rand-m9-mstd0.5-inc1");
  EXPECT_TRUE(o.timm && o.increasing);
  EXPECT_EQ(o.magnitude, 9);
  EXPECT_EQ(o.magnitude_std, 0.5);
  EXPECT_EQ(o.num_ops, 2);
  EXPECT_EQ(o.op_prob, 0.5);
  EXPECT_EQ(parse_timm_rand_augment("rand-n3-m7-mmax9-p0.7").num_ops, 3);
}

// Over many samples, the draws follow the laws of torchvision's and timm's definitions.
TEST(PerSampleOps, TheDrawsFollowTheirLaws) {
  const size_t n = 70000;
  BatchContext ctx = context(n, 17);
  std::map<std::string, size_t> ta_ops;
  size_t negative = 0, signed_ops = 0;
  const auto ta = trivial_augment_wide({});
  for (size_t i = 0; i < n; ++i) {
    SampleRng rng = ctx.sample_rng(i);
    const auto steps = augment_draws::augment_steps(*ta, rng, 224, 224);
    ASSERT_EQ(steps.size(), 1u);
    ++ta_ops[steps[0].op];
    if ((steps[0].op == "Rotate" || steps[0].op == "ShearX") && steps[0].magnitude != 0) {
      ++signed_ops;
      negative += steps[0].magnitude < 0;
      EXPECT_LE(std::abs(steps[0].magnitude), steps[0].op == "Rotate" ? 135.0 : 0.99 + 1e-6);
    }
  }
  ASSERT_EQ(ta_ops.size(), 14u);
  const double expect = static_cast<double>(n) / 14, sd = std::sqrt(expect * 13 / 14);
  for (const auto& [op, count] : ta_ops) {
    EXPECT_NEAR(static_cast<double>(count), expect, 5 * sd) << op;
  }
  EXPECT_NEAR(static_cast<double>(negative) / static_cast<double>(signed_ops), 0.5, 0.02);
  // timm's rand-m9-mstd0.5-inc1: 2 slots, each applied with probability 0.5; Rotate's level is
  // N(9, 0.5) clipped to [0, 10], so its |angle| / 3 has mean about 8.99.
  const auto timm = rand_augment(parse_timm_rand_augment("rand-m9-mstd0.5-inc1"));
  size_t steps_total = 0;
  double rotate_sum = 0;
  size_t rotates = 0;
  for (size_t i = 0; i < n; ++i) {
    SampleRng rng = ctx.sample_rng(i);
    for (const auto& step : augment_draws::augment_steps(*timm, rng, 224, 224)) {
      ++steps_total;
      if (step.op == "Rotate") rotate_sum += std::abs(step.magnitude) / 3.0, ++rotates;
    }
  }
  EXPECT_NEAR(static_cast<double>(steps_total) / static_cast<double>(n), 1.0, 0.02);
  EXPECT_NEAR(rotate_sum / static_cast<double>(rotates), 8.99, 0.05);
}

// ---------------------------------------------------------------------------------------------
// per_field(): a pipeline per image field or view group.

// A batch of view group "views" uint8 [b, v, 3, s, s] (or [b, v, s, s, 3]), image field
// "image" [b, 3, s, s] and "label".
BatchFields views_batch(int64_t b, int64_t v, int64_t s, bool hwc = false) {
  at::Tensor group = photos(b * v, s, 9).view({b, v, 3, s, s});
  if (hwc) group = group.permute({0, 1, 3, 4, 2}).contiguous();
  BatchFields batch;
  batch.specs = {{"views", c10::ScalarType::Byte,
                  hwc ? std::vector<int64_t>{v, s, s, 3} : std::vector<int64_t>{v, 3, s, s}},
                 {"image", c10::ScalarType::Byte, {3, s, s}},
                 {"label", c10::ScalarType::Long, {}}};
  batch.tensors = {group, photos(b, s, 3), at::arange(b, at::kLong)};
  return batch;
}

std::shared_ptr<const BatchOp> dino_like(double blur_p, bool normalized) {
  ColorJitterOptions jitter;
  jitter.brightness_min = 0.6, jitter.brightness_max = 1.4;
  jitter.saturation_min = 0.8, jitter.saturation_max = 1.2;
  jitter.p = 0.8;
  GaussianBlurOptions blur;
  blur.kernel_size = {5, 5};
  blur.p = blur_p;
  std::vector<std::shared_ptr<const BatchOp>> ops{color_jitter(jitter), random_grayscale(0.2),
                                                  gaussian_blur(blur), random_solarize(128, 0.3)};
  if (normalized) ops.push_back(normalize(NormalizeOptions{}));
  return compose(ops);
}

TEST(PerField, OneOpForAGroupIsThatOpForEachViewBitForBit) {
  const int64_t b = 6, v = 3, s = 16;
  for (const bool normalized : {false, true}) {
    for (const bool hwc : {false, true}) {
      const auto op = dino_like(0.5, normalized);
      const auto one = per_field({{"views", {op}}});
      const auto each = per_field({{"views", {op, op, op}}});
      BatchFields a = views_batch(b, v, s, hwc), c = views_batch(b, v, s, hwc);
      const at::Tensor before = a.tensors[0].clone(), image = a.tensors[1].clone();
      const std::vector<FieldSpec> specs = one->out_fields(a.specs);
      apply_op(*one, a, context(b, 3, 1, 0, 40));
      apply_op(*each, c, context(b, 3, 1, 0, 40));
      EXPECT_TRUE(a.tensors[0].equal(c.tensors[0])) << normalized << hwc;
      EXPECT_EQ(a.specs[0].sample_shape, specs[0].sample_shape);
      EXPECT_EQ(a.specs[0].dtype, normalized ? c10::ScalarType::Float : c10::ScalarType::Byte);
      if (normalized) {
        EXPECT_EQ(a.tensors[0].sizes().vec(), (std::vector<int64_t>{b, v, 3, s, s}));
      } else {
        EXPECT_FALSE(a.tensors[0].equal(before));
      }
      EXPECT_TRUE(a.tensors[1].equal(image)) << "the other image field is left alone";
    }
  }
}

TEST(PerField, EachViewDrawsOnItsOwnAndTheSampleDecidesNotTheBatch) {
  const int64_t b = 8, v = 4, s = 12;
  const auto op =
      per_field({{"views", {compose({random_solarize(128, 0.5), random_grayscale(0.5)})}}});
  BatchFields batch = views_batch(b, v, s);
  for (int64_t k = 1; k < v; ++k)
    batch.tensors[0].select(1, k).copy_(batch.tensors[0].select(1, 0));
  apply_op(*op, batch, context(b, 5, 0, 0, 10));
  // The views start equal; with 4 outcomes each, some sample's views must differ.
  int64_t differing = 0;
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t k = 1; k < v; ++k) {
      differing += !batch.tensors[0][r][k].equal(batch.tensors[0][r][0]);
    }
  }
  EXPECT_GT(differing, 6);
  // The same samples in another batch, in reverse order, get the same views.
  BatchFields reversed = views_batch(b, v, s);
  for (int64_t k = 1; k < v; ++k) {
    reversed.tensors[0].select(1, k).copy_(reversed.tensors[0].select(1, 0));
  }
  reversed.tensors[0] = reversed.tensors[0].flip(0).contiguous();
  BatchContext ctx = context(b, 5, 0, 0, 10);
  std::reverse(ctx.indices.begin(), ctx.indices.end());
  apply_op(*op, reversed, ctx);
  EXPECT_TRUE(reversed.tensors[0].flip(0).equal(batch.tensors[0]));
  // A field of one image draws as view 0 of a group.
  BatchFields plain = views_batch(b, 1, s), group = views_batch(b, 1, s);
  plain.specs[0].sample_shape = {3, s, s};
  plain.tensors[0] = plain.tensors[0].select(1, 0).contiguous();
  apply_op(*op, plain, context(b, 5));
  apply_op(*op, group, context(b, 5));
  EXPECT_TRUE(plain.tensors[0].equal(group.tensors[0].select(1, 0)));
}

TEST(PerField, AnOpPerViewRunsOnItsViewOnly) {
  const int64_t b = 5, v = 2, s = 10;
  const auto op = per_field({{"views", {random_solarize(128, 1.0), random_grayscale(0.0)}},
                             {"image", {random_grayscale(1.0)}}});
  BatchFields batch = views_batch(b, v, s);
  const at::Tensor before = batch.tensors[0].clone(), image = batch.tensors[1].clone();
  const at::Tensor* slot = &batch.tensors[0];
  const void* storage = batch.tensors[0].data_ptr();
  apply_op(*op, batch, context(b));
  EXPECT_EQ(slot->data_ptr(), storage) << "uint8 ops write the slot in place";
  EXPECT_TRUE(batch.tensors[0].select(1, 0).equal(F::solarize(before.select(1, 0), 128)));
  EXPECT_TRUE(batch.tensors[0].select(1, 1).equal(before.select(1, 1)));
  EXPECT_TRUE(batch.tensors[1].equal(F::rgb_to_grayscale(image)));
}

TEST(PerField, RecordsWhatEachViewReceived) {
  const int64_t b = 4, v = 3, s = 10;
  const auto op = per_field({{"views", {random_solarize(128, 1.0)}}});
  BatchFields batch = views_batch(b, v, s);
  AugmentRecord record;
  record.rows.resize(b);
  BatchContext ctx = context(b);
  ctx.record = &record;
  apply_op(*op, batch, ctx);
  ASSERT_EQ(record.fields.size(), 1u);
  EXPECT_EQ(record.fields[0].field, "views");
  EXPECT_EQ(record.fields[0].views, 3u);
  ASSERT_EQ(record.fields[0].draws.rows.size(), static_cast<size_t>(b * v));
  for (const auto& row : record.fields[0].draws.rows) {
    ASSERT_EQ(row.size(), 1u);
    EXPECT_EQ(row[0].op, "RandomSolarize");
  }
}

TEST(PerField, RefusesWhatItCannotRunNamingTheField) {
  const std::vector<FieldSpec> specs = views_batch(2, 3, 8).specs;
  const auto refused = [&](const std::shared_ptr<const BatchOp>& op, const std::string& words) {
    try {
      op->out_fields(specs);
      ADD_FAILURE() << op->name() << " was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const auto jitter = random_grayscale(0.5);
  refused(per_field({{"views", {jitter, jitter}}}), "view group of 3 views");
  refused(per_field({{"image", {jitter, jitter}}}), "is one image a sample");
  refused(per_field({{"label", {jitter}}}), "\"label\"");
  refused(per_field({{"caption", {jitter}}}), "\"caption\"");
  refused(per_field({{"views", {jitter, normalize(NormalizeOptions{}), jitter}}}),
          "make different images");
  refused(per_field({{"views", {mixup(1.0, 10)}}}), "\"label\"");
  EXPECT_THROW(per_field({{"views", {jitter}}, {"views", {jitter}}}), std::invalid_argument);
  EXPECT_THROW(per_field({{"views", {}}}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// The fused CPU loops (cpu_kernels.h) against the ATen code they stand in for.

TEST(CpuKernels, HueIsTheAtenCodeByteForByte) {
  at::manual_seed(21);
  SampleRng rng(3, 0, 0);
  int64_t pixels = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t h = rng.randint(1, 40), w = rng.randint(1, 40), b = rng.randint(1, 3);
    at::Tensor image = at::randint(0, 256, {b, 3, h, w}, at::kByte);
    if (trial % 4 == 1) image.select(1, 1).copy_(image.select(1, 0));  // ties: max == r == g
    if (trial % 4 == 2) image = (image / 64 * 64).to(at::kByte);       // few levels, many ties
    if (trial % 4 == 3) image.select(1, 2).fill_(255);
    const double factor =
        trial < 3 ? std::vector<double>{-0.5, 0.0, 0.5}[trial] : rng.uniform(-0.5, 0.5);
    const at::Tensor fused = augment_detail::adjust_hue_cpu(image, factor);
    const at::Tensor aten = augment_detail::adjust_hue_aten(image, factor);
    ASSERT_TRUE(fused.equal(aten)) << "trial " << trial << " factor " << factor << ": "
                                   << (fused.to(at::kInt) - aten.to(at::kInt)).abs().max();
    pixels += b * h * w;
  }
  EXPECT_GT(pixels, 50000);
  // The public function takes the fused loop on the CPU, also for a strided (HWC) view.
  const at::Tensor hwc = at::randint(0, 256, {2, 17, 13, 3}, at::kByte);
  const at::Tensor chw = hwc.permute({0, 3, 1, 2});
  EXPECT_TRUE(F::adjust_hue(chw, 0.2).equal(augment_detail::adjust_hue_aten(chw, 0.2)));
}

TEST(CpuKernels, BlurIsWithinOneLevelOfTheAtenCode) {
  SampleRng rng(4, 0, 0);
  int64_t compared = 0, differing = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t kx = 2 * rng.randint(0, 12) + 1, ky = 2 * rng.randint(0, 12) + 1;
    const int64_t h = ky / 2 + rng.randint(1, 48), w = kx / 2 + rng.randint(1, 48);
    const at::Tensor image =
        photos(2, std::max(h, w), static_cast<uint64_t>(trial)).slice(2, 0, h).slice(3, 0, w);
    const std::vector<double> sigma{rng.uniform(0.1, 3.0), rng.uniform(0.1, 3.0)};
    const at::Tensor fused = F::gaussian_blur(image, {kx, ky}, sigma);
    const at::Tensor aten = augment_detail::gaussian_blur_aten(image, {kx, ky}, sigma);
    ASSERT_EQ(fused.sizes(), aten.sizes());
    const at::Tensor diff = (fused.to(at::kInt) - aten.to(at::kInt)).abs();
    ASSERT_LE(diff.max().item<int>(), 1) << "trial " << trial << " kernel " << kx << "x" << ky;
    compared += diff.numel();
    differing += diff.gt(0).sum().item<int64_t>();
  }
  EXPECT_LT(static_cast<double>(differing) / static_cast<double>(compared), 1e-3)
      << differing << " of " << compared;
  std::cout << "the fused blur: " << differing << " of " << compared
            << " bytes 1 level from the ATen code, none further\n";
  // A constant image stays itself; a kernel wider than the image is refused as torch refuses it.
  const at::Tensor constant = at::full({1, 3, 9, 9}, 77, at::kByte);
  EXPECT_TRUE(F::gaussian_blur(constant, {9, 9}, {2.0, 2.0}).equal(constant));
  EXPECT_ANY_THROW(F::gaussian_blur(at::zeros({3, 4, 4}, at::kByte), {9, 9}, {1.0, 1.0}));
}

}  // namespace
}  // namespace conveyor
