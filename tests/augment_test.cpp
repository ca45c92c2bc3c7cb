// augment_test: the batch ops of conveyor/augment.h on the CPU, alone (no loader): Normalize
// against normalize_images, RandomErasing's rate and boxes, MixUp's and CutMix's soft targets and
// CutMix's pasted area, the draws' laws, apply_op()'s checks and errors. The loader's batch stage
// is batch_stage_test.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "conveyor/augment.h"

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

}  // namespace
}  // namespace conveyor
