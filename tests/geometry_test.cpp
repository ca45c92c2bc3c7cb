// The plan as data and the fields that follow it (issues 32 and 33): plan_image's one view is
// today's choose_crop box bit for bit (against a verbatim copy of the code before the plan,
// with its own random stream), and masks follow the image's box, flip and output size.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "conveyor/image_plan.h"
#include "conveyor/random.h"

namespace conveyor {
namespace {

// choose_crop and SampleRng as they were before the plan (commit 7c25129), kept verbatim as the
// reference that the plan must reproduce.
struct OldRng {
  uint64_t state;
  OldRng(uint64_t seed, uint64_t epoch, size_t index)
      : state(splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ static_cast<uint64_t>(index))) {}
  uint64_t next() {
    state += 0x9E3779B97F4A7C15ull;
    return splitmix64(state);
  }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }
  int randint(int lo, int hi_exclusive) {
    uint64_t span = static_cast<uint64_t>(hi_exclusive - lo);
    return lo + static_cast<int>(next() % span);
  }
};

CropBox old_choose_crop(const ImageTransform& transform, int width, int height, uint64_t seed,
                        uint64_t epoch, size_t index) {
  OldRng rng(seed, epoch, index);
  CropBox box{0, 0, width, height, false};
  switch (transform.mode) {
    case ImageTransform::Mode::kRandomResizedCrop: {
      const double area = static_cast<double>(width) * height;
      const double log_r0 = std::log(transform.ratio_min);
      const double log_r1 = std::log(transform.ratio_max);
      bool found = false;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        double target = area * rng.uniform(transform.scale_min, transform.scale_max);
        double aspect = std::exp(rng.uniform(log_r0, log_r1));
        int w = static_cast<int>(std::nearbyint(std::sqrt(target * aspect)));
        int h = static_cast<int>(std::nearbyint(std::sqrt(target / aspect)));
        if (w > 0 && h > 0 && w <= width && h <= height) {
          box = {rng.randint(0, width - w + 1), rng.randint(0, height - h + 1), w, h, false};
          found = true;
        }
      }
      if (!found) {
        double in_ratio = static_cast<double>(width) / height;
        int w = width, h = height;
        if (in_ratio < transform.ratio_min) {
          h = static_cast<int>(std::nearbyint(w / transform.ratio_min));
        } else if (in_ratio > transform.ratio_max) {
          w = static_cast<int>(std::nearbyint(h * transform.ratio_max));
        }
        box = {(width - w) / 2, (height - h) / 2, w, h, false};
      }
      break;
    }
    case ImageTransform::Mode::kResizeCenterCrop: {
      double factor = static_cast<double>(transform.resize) / std::min(width, height);
      int side_w = std::min(width, static_cast<int>(std::nearbyint(transform.size / factor)));
      int side_h = std::min(height, static_cast<int>(std::nearbyint(transform.size / factor)));
      side_w = std::max(side_w, 1);
      side_h = std::max(side_h, 1);
      box = {(width - side_w) / 2, (height - side_h) / 2, side_w, side_h, false};
      break;
    }
    case ImageTransform::Mode::kResize:
      break;
  }
  box.flip = transform.flip_probability > 0.0 && rng.uniform(0.0, 1.0) < transform.flip_probability;
  return box;
}

// 10,000 random transforms, image sizes and contexts: the plan's one view is the old box.
TEST(ImagePlan, OneViewIsTheOldChooseCropBitForBit) {
  std::mt19937_64 gen(33);
  const ImageTransform::Mode modes[] = {ImageTransform::Mode::kRandomResizedCrop,
                                        ImageTransform::Mode::kResizeCenterCrop,
                                        ImageTransform::Mode::kResize};
  int flips = 0, fallbacks = 0;
  for (int i = 0; i < 10000; ++i) {
    ImageTransform t;
    t.mode = modes[gen() % 3];
    t.size = 1 + static_cast<int>(gen() % 512);
    t.resize = t.size + static_cast<int>(gen() % 64);
    t.scale_min = std::uniform_real_distribution<double>(0.01, 0.9)(gen);
    t.scale_max = std::uniform_real_distribution<double>(t.scale_min, 1.0)(gen);
    t.ratio_min = std::uniform_real_distribution<double>(0.2, 1.0)(gen);
    t.ratio_max = std::uniform_real_distribution<double>(1.0, 5.0)(gen);
    t.flip_probability = (gen() % 4 == 0) ? 0.0 : std::uniform_real_distribution<double>(0, 1)(gen);
    const int width = 1 + static_cast<int>(gen() % 3000);
    const int height = 1 + static_cast<int>(gen() % 3000);
    const uint64_t seed = gen(), epoch = gen() % 1000;
    const size_t index = gen() % (size_t{1} << 40);
    const CropBox want = old_choose_crop(t, width, height, seed, epoch, index);
    const ImagePlan plan = plan_image(t, width, height, seed, epoch, index);
    ASSERT_EQ(plan.width, width);
    ASSERT_EQ(plan.height, height);
    ASSERT_EQ(plan.views.size(), 1u);
    const ViewPlan& v = plan.views[0];
    ASSERT_EQ(v.x, want.x) << i;
    ASSERT_EQ(v.y, want.y) << i;
    ASSERT_EQ(v.width, want.width) << i;
    ASSERT_EQ(v.height, want.height) << i;
    ASSERT_EQ(v.flip, want.flip) << i;
    ASSERT_EQ(v.out_width, t.size);
    ASSERT_EQ(v.out_height, t.size);
    ASSERT_EQ(v.view, 0);
    ASSERT_GE(v.x, 0);
    ASSERT_GE(v.y, 0);
    ASSERT_GE(v.width, 1);
    ASSERT_GE(v.height, 1);
    ASSERT_LE(v.x + v.width, width) << i;
    ASSERT_LE(v.y + v.height, height) << i;
    const CropBox wrapped = choose_crop(t, width, height, seed, epoch, index);
    ASSERT_EQ(wrapped.x, want.x);
    ASSERT_EQ(wrapped.flip, want.flip);
    flips += v.flip;
    fallbacks += (t.mode == ImageTransform::Mode::kRandomResizedCrop && v.width == width);
  }
  EXPECT_GT(flips, 1000);  // the inputs reach the flip and the fallback
  EXPECT_GT(fallbacks, 10);
}

// View 0's stream is the sample's stream; other views' streams differ from it and each other.
TEST(ImagePlan, ViewStreams) {
  for (size_t index = 0; index < 100; ++index) {
    SampleRng plain(5, 2, index), view0(5, 2, index, 0), view1(5, 2, index, 1),
        view2(5, 2, index, 2);
    const uint64_t a = plain.next();
    EXPECT_EQ(view0.next(), a);
    const uint64_t b = view1.next(), c = view2.next();
    EXPECT_NE(b, a);
    EXPECT_NE(c, a);
    EXPECT_NE(b, c);
  }
}

}  // namespace
}  // namespace conveyor
