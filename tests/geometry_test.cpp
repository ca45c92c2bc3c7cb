// The plan as data and the fields that follow it (issues 32 and 33): plan_image's one view is
// today's choose_crop box bit for bit (against a verbatim copy of the code before the plan,
// with its own random stream), and masks follow the image's box, flip and output size; boxes,
// points and plans likewise; and every follower of an image with views follows each view of the
// group it names (FollowViews).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "conveyor/fields.h"
#include "conveyor/geometry.h"
#include "conveyor/image_plan.h"
#include "conveyor/random.h"
#include "png_writer.h"
#include "test_support.h"

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

// ---------------------------------------------------------------------------------------------
// Masks

using testing::make_png;
using testing::PngFile;
using testing::PngSpec;

// An image and its mask, as a reader's members ("png" the image, "seg" the mask).
struct Pair {
  std::vector<uint8_t> image;
  std::vector<uint8_t> mask;
};

class PairReader final : public MemberReader {
 public:
  explicit PairReader(std::vector<Pair> pairs) : pairs_(std::move(pairs)) {}
  size_t size() const override { return pairs_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    const Pair& p = pairs_.at(ctx.index);
    out.add_bytes("png", p.image.data(), p.image.size());
    out.add_bytes("seg", p.mask.data(), p.mask.size());
  }

 private:
  std::vector<Pair> pairs_;
};

PngFile image_of(int width, int height, uint64_t seed) {
  PngSpec s;
  s.width = width;
  s.height = height;
  s.color_type = 2;
  return make_png(s, seed);
}

PngFile mask_of(int width, int height, int color_type, int depth, bool interlaced, uint64_t seed) {
  PngSpec s;
  s.width = width;
  s.height = height;
  s.color_type = color_type;
  s.bit_depth = depth;
  s.interlaced = interlaced;
  s.transparency = color_type == 3;  // ignored: an index is a class
  return make_png(s, seed);
}

// The mask's sample nearest to output pixel (i, j) of `view`, by pixel centres, computed apart
// from the writer (in floating point): floor((i + 0.5) * w / S) in the box, mirrored if flipped.
int expected_at(const PngFile& mask, const ViewPlan& view, int i, int j) {
  const int col = view.flip ? view.out_width - 1 - i : i;
  const int sx = view.x + static_cast<int>(std::floor((col + 0.5) * view.width / view.out_width));
  const int sy = view.y + static_cast<int>(std::floor((j + 0.5) * view.height / view.out_height));
  return mask.samples.at(static_cast<size_t>(sy) * mask.spec.width + sx);
}

// Every kind of one-channel PNG (gray and palette, 1 to 16 bits, interlaced or not: written by
// tests/png_writer.h with zlib alone), with the mask declared before its image (followers are
// written after their leader whatever the order), over many samples of a train and an eval
// transform: every output pixel is the mask's sample at the image's plan's box and flip, nearest
// by centres, in each dtype that holds the kind's ids.
TEST(Mask, FollowsTheImagesBoxAndFlipPixelForPixel) {
  struct Kind {
    int color_type, depth;
    c10::ScalarType dtype;
  };
  const Kind kinds[] = {{3, 1, c10::kByte}, {3, 2, c10::kByte},  {3, 4, c10::kShort},
                        {3, 8, c10::kByte}, {0, 1, c10::kInt},   {0, 2, c10::kByte},
                        {0, 4, c10::kByte}, {0, 8, c10::kShort}, {0, 16, c10::kInt}};
  for (const Kind& kind : kinds) {
    for (int interlaced = 0; interlaced < 2; ++interlaced) {
      for (const ImageTransform& t : {ImageTransform::train(24), ImageTransform::eval(20, 23)}) {
        std::vector<Pair> pairs;
        std::vector<PngFile> masks;
        const int sizes[][2] = {{61, 47}, {33, 90}, {7, 5}, {200, 150}};
        for (int k = 0; k < 40; ++k) {
          const int w = sizes[k % 4][0], h = sizes[k % 4][1];
          masks.push_back(mask_of(w, h, kind.color_type, kind.depth, interlaced != 0, 100 + k));
          pairs.push_back({image_of(w, h, 7 + k).bytes, masks.back().bytes});
        }
        const c10::ScalarType dtype = kind.dtype;
        auto source = FieldSource::from_reader(
            std::make_shared<PairReader>(pairs),
            {{"mask", Field::mask("seg", "image", dtype)}, {"image", Field::image("png", t)}});
        const std::vector<FieldSpec> specs = source->fields();
        ASSERT_EQ(specs[0].sample_shape, (std::vector<int64_t>{t.size, t.size}));
        ASSERT_EQ(specs[0].dtype, dtype);
        EXPECT_FALSE(source->encoded_image_field().has_value());  // the CPU decodes both
        source->prepare(1);
        std::vector<std::byte> mask_row(specs[0].sample_bytes()),
            image_row(specs[1].sample_bytes());
        std::byte* rows[] = {mask_row.data(), image_row.data()};
        int flipped = 0;
        for (size_t i = 0; i < pairs.size(); ++i) {
          const SampleContext ctx{0, i, 11, 3};
          source->write_sample(ctx, rows);
          const PngFile& mask = masks[i];
          const ImagePlan plan =
              plan_image(t, mask.spec.width, mask.spec.height, ctx.seed, ctx.epoch, ctx.index);
          const ViewPlan& view = plan.views.at(0);
          flipped += view.flip;
          for (int y = 0; y < t.size; ++y) {
            for (int x = 0; x < t.size; ++x) {
              const size_t at = static_cast<size_t>(y) * t.size + x;
              const int got =
                  dtype == c10::kByte
                      ? static_cast<int>(reinterpret_cast<uint8_t*>(mask_row.data())[at])
                  : dtype == c10::kShort
                      ? static_cast<int>(reinterpret_cast<int16_t*>(mask_row.data())[at])
                      : reinterpret_cast<int32_t*>(mask_row.data())[at];
              ASSERT_EQ(got, expected_at(mask, view, x, y))
                  << "kind " << kind.color_type << "/" << kind.depth << " interlaced " << interlaced
                  << " sample " << i << " at (" << x << ", " << y << ")";
            }
          }
        }
        if (t.flip_probability > 0) {
          EXPECT_GT(flipped, 5);
        }
      }
    }
  }
}

// A mask never holds a value its source lacks: a checkerboard of 200 16-bit ids, shrunk and grown,
// in int32 and in int16 (which holds them: all are under 32768).
TEST(Mask, HoldsOnlyTheSourcesIds) {
  PngSpec s;
  s.width = 97;
  s.height = 89;
  s.color_type = 0;
  s.bit_depth = 16;
  PngFile mask = make_png(s, 1);
  std::set<int> ids;
  for (int y = 0; y < s.height; ++y) {
    for (int x = 0; x < s.width; ++x) {
      const int id = ((x / 3 + y / 2) % 2) ? 1000 + (x * 7 + y * 3) % 200 : 0;
      mask.samples[static_cast<size_t>(y) * s.width + x] = static_cast<uint16_t>(id);
      ids.insert(id);
    }
  }
  // Re-encode the samples: make_png writes its own; build the file from a gray 16-bit spec.
  mask.bytes = testing::png_of_samples(s, mask.samples);
  for (int size : {16, 64, 301}) {
    for (const c10::ScalarType dtype : {c10::kInt, c10::kShort}) {
      auto source =
          FieldSource::from_reader(std::make_shared<PairReader>(std::vector<Pair>(
                                       50, {image_of(97, 89, 3).bytes, mask.bytes})),
                                   {{"image", Field::image("png", ImageTransform::train(size))},
                                    {"mask", Field::mask("seg", "image", dtype)}});
      source->prepare(1);
      std::vector<std::byte> image_row(source->fields()[0].sample_bytes()),
          mask_row(source->fields()[1].sample_bytes());
      std::byte* rows[] = {image_row.data(), mask_row.data()};
      for (size_t i = 0; i < 50; ++i) {
        source->write_sample({0, i, 5, 0}, rows);
        for (size_t p = 0; p < static_cast<size_t>(size) * size; ++p) {
          const int v = dtype == c10::kInt ? reinterpret_cast<const int32_t*>(mask_row.data())[p]
                                           : reinterpret_cast<const int16_t*>(mask_row.data())[p];
          ASSERT_TRUE(ids.count(v)) << v;
        }
      }
    }
  }
}

std::string error_of(FieldSource& source, size_t index) {
  source.prepare(1);
  std::vector<std::vector<std::byte>> rows;
  std::vector<std::byte*> pointers;
  for (const FieldSpec& spec : source.fields()) rows.emplace_back(spec.sample_bytes());
  for (auto& r : rows) pointers.push_back(r.data());
  try {
    source.write_sample({0, index, 0, 0}, pointers.data());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Mask, ClearErrors) {
  const Fields fields = {{"image", Field::image("png", ImageTransform::train(16))},
                         {"mask", Field::mask("seg")}};
  const PngFile gray8 = mask_of(40, 30, 0, 8, false, 1);
  const PngFile gray16 = mask_of(40, 30, 0, 16, false, 1);
  std::vector<Pair> pairs = {
      {image_of(41, 30, 1).bytes, gray8.bytes},                // sizes differ
      {image_of(40, 30, 1).bytes, gray16.bytes},               // 16 bits into uint8
      {image_of(40, 30, 1).bytes, image_of(40, 30, 2).bytes},  // an RGB PNG
      {image_of(40, 30, 1).bytes, {1, 2, 3, 4}},               // no image at all
  };
  auto source = FieldSource::from_reader(std::make_shared<PairReader>(pairs), fields);
  EXPECT_EQ(error_of(*source, 0),
            "field \"mask\": the mask is 40x30 and its image (field \"image\") is 41x30 "
            "(upright): they must be the same size");
  EXPECT_EQ(error_of(*source, 1),
            "field \"mask\": a 16-bit mask needs dtype int16 or int32 (it is declared uint8)");
  EXPECT_EQ(error_of(*source, 2),
            "field \"mask\": PNG of one channel wanted (gray or palette), not RGB");
  // An id over 32767 in an int16 mask is refused, never wrapped to a negative id.
  PngSpec wide_spec;
  wide_spec.width = 40;
  wide_spec.height = 30;
  wide_spec.color_type = 0;
  wide_spec.bit_depth = 16;
  std::vector<uint16_t> wide_ids(40 * 30, 7);
  wide_ids[15 * 40 + 20] = 40000;  // the centre: in every crop of a resize to the whole image
  const std::vector<Pair> wide = {
      {image_of(40, 30, 1).bytes, testing::png_of_samples(wide_spec, wide_ids)}};
  ImageTransform whole = ImageTransform::train(40);
  whole.mode = ImageTransform::Mode::kResize;
  EXPECT_EQ(
      error_of(*FieldSource::from_reader(std::make_shared<PairReader>(wide),
                                         {{"image", Field::image("png", whole)},
                                          {"mask", Field::mask("seg", "image", c10::kShort)}}),
               0),
      "field \"mask\": the mask holds the id 40000, over 32767, which dtype int16 cannot "
      "hold: declare int32");
  EXPECT_EQ(error_of(*source, 3),
            "field \"mask\": a mask is a gray or palette PNG, not bytes of no known image format");
  // A mask must follow an image field of the same source.
  const auto reader = std::make_shared<PairReader>(pairs);
  EXPECT_THROW(FieldSource::from_reader(reader, {{"image", Field::image("png", {})},
                                                 {"mask", Field::mask("seg", "picture")}}),
               std::invalid_argument);
  EXPECT_THROW(FieldSource::from_reader(reader, {{"image", Field::integer("png")},
                                                 {"mask", Field::mask("seg", "image")}}),
               std::invalid_argument);
  EXPECT_THROW(
      FieldSource::from_reader(reader, {{"image", Field::image("png", {})},
                                        {"mask", Field::mask("seg", "image", c10::kFloat)}}),
      std::invalid_argument);
}

// A folder: a manifest with image and mask columns (the files beside it), a JPEG image and a
// palette mask, read through the manifest kind.
TEST(Mask, FromAManifestsColumns) {
  testing::TempDir dir;
  std::ofstream csv(dir.path() / "pairs.csv");
  csv << "image,mask\n";
  std::vector<PngFile> masks;
  for (int i = 0; i < 12; ++i) {
    const int w = 50 + i, h = 40 + 2 * i;
    masks.push_back(mask_of(w, h, 3, 8, i % 2 == 1, 40 + i));
    testing::write_bytes(dir.path() / ("img" + std::to_string(i) + ".png"),
                         image_of(w, h, i).bytes);
    testing::write_bytes(dir.path() / ("seg" + std::to_string(i) + ".png"), masks.back().bytes);
    csv << "img" << i << ".png,seg" << i << ".png\n";
  }
  csv.close();
  const ImageTransform t = ImageTransform::train(20);
  auto source = FieldSource::manifest(
      dir.path() / "pairs.csv",
      {{"image", Field::image("image", t)}, {"mask", Field::mask("mask", "image")}});
  source->prepare(1);
  std::vector<std::byte> image_row(source->fields()[0].sample_bytes()),
      mask_row(source->fields()[1].sample_bytes());
  std::byte* rows[] = {image_row.data(), mask_row.data()};
  for (size_t i = 0; i < masks.size(); ++i) {
    source->write_sample({0, i, 9, 1}, rows);
    const ViewPlan view =
        plan_image(t, masks[i].spec.width, masks[i].spec.height, 9, 1, i).views.at(0);
    for (int y = 0; y < t.size; ++y) {
      for (int x = 0; x < t.size; ++x) {
        ASSERT_EQ(static_cast<int>(reinterpret_cast<uint8_t*>(mask_row.data())[y * t.size + x]),
                  expected_at(masks[i], view, x, y));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Boxes, points and the plan as fields (conveyor/geometry.h)

// torchvision v2's arithmetic on a BoundingBoxes, written out apart from map_box: crop (subtract
// the box's corner, clamp to the crop), resize (times out / box size), flip (W - x, swapped),
// then SanitizeBoundingBoxes' test (min_size on width and height) and the visibility share.
struct ReferenceBox {
  double x1, y1, x2, y2;
  bool kept;
};
ReferenceBox reference_box(const ViewPlan& v, const double* b, double min_size,
                           double min_visibility) {
  const double c[4] = {
      std::clamp(b[0] - v.x, 0.0, double(v.width)), std::clamp(b[1] - v.y, 0.0, double(v.height)),
      std::clamp(b[2] - v.x, 0.0, double(v.width)), std::clamp(b[3] - v.y, 0.0, double(v.height))};
  const double sx = double(v.out_width) / v.width, sy = double(v.out_height) / v.height;
  ReferenceBox r{c[0] * sx, c[1] * sy, c[2] * sx, c[3] * sy, false};
  if (v.flip) r = {v.out_width - r.x2, r.y1, v.out_width - r.x1, r.y2, false};
  const double w = r.x2 - r.x1, h = r.y2 - r.y1;
  const double share = (c[2] - c[0]) * (c[3] - c[1]) / ((b[2] - b[0]) * (b[3] - b[1]));
  r.kept = w >= min_size && h >= min_size && !(share < min_visibility);
  return r;
}

// A box row `got` (x1, y1, x2, y2) is the reference's, within 1e-4.
void expect_near_reference(const float* got, const ReferenceBox& r) {
  ASSERT_NEAR(got[0], r.x1, 1e-4);
  ASSERT_NEAR(got[1], r.y1, 1e-4);
  ASSERT_NEAR(got[2], r.x2, 1e-4);
  ASSERT_NEAR(got[3], r.y2, 1e-4);
}

ViewPlan random_view(std::mt19937_64& gen, int width, int height) {
  ViewPlan v;
  v.width = 1 + static_cast<int>(gen() % width);
  v.height = 1 + static_cast<int>(gen() % height);
  v.x = static_cast<int>(gen() % (width - v.width + 1));
  v.y = static_cast<int>(gen() % (height - v.height + 1));
  v.flip = gen() % 2 == 1;
  v.out_width = 1 + static_cast<int>(gen() % 300);
  v.out_height = gen() % 2 ? v.out_width : 1 + static_cast<int>(gen() % 300);
  return v;
}

// Random boxes inside a random image, each drawn near its view half the time.
std::array<double, 4> random_box(std::mt19937_64& gen, int width, int height) {
  std::uniform_real_distribution<double> ux(0, width), uy(0, height);
  double x1 = ux(gen), x2 = ux(gen), y1 = uy(gen), y2 = uy(gen);
  if (x2 < x1) std::swap(x1, x2);
  if (y2 < y1) std::swap(y1, y2);
  return {x1, y1, x2, y2};
}

// 200,000 random boxes, views and rules: map_box is the reference's box and decision.
TEST(Boxes, MapBoxIsTorchvisionsCropResizeFlipAndSanitize) {
  std::mt19937_64 gen(330);
  size_t kept = 0, dropped = 0, flipped = 0;
  for (int i = 0; i < 200000; ++i) {
    const int width = 1 + static_cast<int>(gen() % 2000),
              height = 1 + static_cast<int>(gen() % 2000);
    const ViewPlan v = random_view(gen, width, height);
    const std::array<double, 4> b = random_box(gen, width, height);
    BoxRule rule;
    if (gen() % 2) {
      rule.min_size = std::uniform_real_distribution<double>(0, 4)(gen);
      rule.min_visibility = std::uniform_real_distribution<double>(0, 1)(gen);
    }
    const MappedBox m = map_box(v, b, rule);
    const ReferenceBox r = reference_box(v, b.data(), rule.min_size, rule.min_visibility);
    const double tol = 1e-9 * (1 + v.out_width + v.out_height);
    ASSERT_NEAR(m.x1, r.x1, tol) << i;
    ASSERT_NEAR(m.y1, r.y1, tol) << i;
    ASSERT_NEAR(m.x2, r.x2, tol) << i;
    ASSERT_NEAR(m.y2, r.y2, tol) << i;
    // The decision, away from its edge (where the two roundings may differ by an ulp).
    const double w = r.x2 - r.x1, h = r.y2 - r.y1;
    if (std::fabs(w - rule.min_size) > 1e-6 && std::fabs(h - rule.min_size) > 1e-6) {
      const double share =
          (w * h) / ((b[2] - b[0]) * (b[3] - b[1]) * (double(v.out_width) / v.width) *
                     (double(v.out_height) / v.height));
      if (std::fabs(share - rule.min_visibility) > 1e-6) {
        ASSERT_EQ(m.kept, r.kept) << i;
      }
    }
    ASSERT_GE(m.x1, 0);
    ASSERT_LE(m.x2, v.out_width);
    ASSERT_LE(m.x1, m.x2);
    ASSERT_LE(m.y1, m.y2);
    (m.kept ? kept : dropped) += 1;
    flipped += v.flip;
  }
  EXPECT_GT(kept, 20000u);  // both decisions, flips and not, are reached
  EXPECT_GT(dropped, 20000u);
  EXPECT_GT(flipped, 50000u);
}

// Points map as box corners do and are inside the view's closed rectangle; a flip maps the view
// onto itself.
TEST(Points, MapPointIsTheBoxArithmetic) {
  std::mt19937_64 gen(331);
  for (int i = 0; i < 100000; ++i) {
    const int width = 1 + static_cast<int>(gen() % 1000),
              height = 1 + static_cast<int>(gen() % 1000);
    const ViewPlan v = random_view(gen, width, height);
    const double x = std::uniform_real_distribution<double>(-10, width + 10)(gen);
    const double y = std::uniform_real_distribution<double>(-10, height + 10)(gen);
    const MappedPoint p = map_point(v, x, y);
    const MappedBox corner = map_box(v, {x, y, x, y}, BoxRule{0, 0});
    const bool inside = x >= v.x && x <= v.x + v.width && y >= v.y && y <= v.y + v.height;
    ASSERT_EQ(p.inside, inside) << i;
    if (inside) {
      ASSERT_NEAR(p.x, corner.x1, 1e-9 * v.out_width) << i;
      ASSERT_NEAR(p.y, corner.y1, 1e-9 * v.out_height) << i;
    }
  }
  const ViewPlan whole{0, 0, 10, 10, true, 5, 5, 0};
  EXPECT_TRUE(map_point(whole, 0, 0).inside);
  EXPECT_EQ(map_point(whole, 0, 0).x, 5);
  EXPECT_TRUE(map_point(whole, 10, 10).inside);
  EXPECT_FALSE(map_point(whole, std::nan(""), 1).inside);
}

// A detection sample as a reader gives it: a PNG, boxes, labels, points.
struct Detection {
  std::vector<uint8_t> image;
  int width = 0, height = 0;
  std::vector<float> boxes;     // [N, 4]
  std::vector<int64_t> labels;  // [N]
  std::vector<float> points;    // [P, 3]
};

class DetectionReader final : public MemberReader {
 public:
  explicit DetectionReader(std::vector<Detection> samples) : samples_(std::move(samples)) {}
  size_t size() const override { return samples_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    const Detection& d = samples_.at(ctx.index);
    out.add_bytes("png", d.image.data(), d.image.size());
    const int64_t n = static_cast<int64_t>(d.labels.size());
    std::byte* b =
        out.add_array("boxes", c10::kFloat, {static_cast<int64_t>(d.boxes.size() / 4), 4});
    std::memcpy(b, d.boxes.data(), d.boxes.size() * sizeof(float));
    std::byte* l = out.add_array("labels", c10::kLong, {n});
    std::memcpy(l, d.labels.data(), d.labels.size() * sizeof(int64_t));
    const int64_t p = static_cast<int64_t>(d.points.size() / 3);
    std::byte* q = out.add_array("kp", c10::kFloat, {p, 3});
    std::memcpy(q, d.points.data(), d.points.size() * sizeof(float));
  }

 private:
  std::vector<Detection> samples_;
};

std::vector<Detection> detections(size_t count, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<Detection> out;
  for (size_t i = 0; i < count; ++i) {
    Detection d;
    d.width = 20 + static_cast<int>(gen() % 100);
    d.height = 20 + static_cast<int>(gen() % 100);
    d.image = image_of(d.width, d.height, seed + i).bytes;
    const size_t n = gen() % 12;
    for (size_t k = 0; k < n; ++k) {
      const std::array<double, 4> b = random_box(gen, d.width, d.height);
      for (double v : b) d.boxes.push_back(static_cast<float>(v));
      d.labels.push_back(static_cast<int64_t>(1000 * i + k));  // names its sample and row
    }
    for (size_t k = 0; k < 5; ++k) {
      d.points.push_back(std::uniform_real_distribution<float>(0, d.width)(gen));
      d.points.push_back(std::uniform_real_distribution<float>(0, d.height)(gen));
      d.points.push_back(static_cast<float>(gen() % 3));
    }
    out.push_back(std::move(d));
  }
  return out;
}

// Through a FieldSource (the boxes declared before their image): each sample's boxes are
// map_box of its image's plan, the labels are the kept boxes' labels in order, the points carry
// their visibility inside the view and 0 outside, and the plan field is the image's plan.
TEST(Boxes, FollowTheImageWithTheirLabelsPointsAndPlan) {
  const std::vector<Detection> samples = detections(300, 7);
  for (const ImageTransform& t : {ImageTransform::train(32), ImageTransform::eval(24, 28)}) {
    BoxRule rule;
    rule.min_visibility = 0.3;
    auto source =
        FieldSource::from_reader(std::make_shared<DetectionReader>(samples),
                                 {{"boxes", Field::boxes("boxes", "image", {"labels"}, rule)},
                                  {"image", Field::image("png", t)},
                                  {"labels", Field::array("labels", c10::kLong, {-1})},
                                  {"kp", Field::points("kp")},
                                  {"plan", Field::plan()}});
    const std::vector<FieldSpec> specs = source->fields();
    EXPECT_EQ(specs[0].sample_shape, (std::vector<int64_t>{4}));
    EXPECT_EQ(specs[0].dtype, c10::kFloat);
    EXPECT_EQ(specs[0].max_items, Field::kDefaultMaxBytes / 16);
    EXPECT_EQ(specs[3].sample_shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(specs[4].sample_shape, (std::vector<int64_t>{1, 7}));
    EXPECT_EQ(specs[4].dtype, c10::kInt);
    EXPECT_FALSE(source->encoded_image_field().has_value());
    source->prepare(1);
    std::vector<std::vector<std::byte>> rows;
    std::vector<std::byte*> pointers;
    for (const FieldSpec& spec : specs) rows.emplace_back(spec.sample_bytes());
    for (auto& r : rows) pointers.push_back(r.data());
    size_t kept = 0, dropped = 0, invisible = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      const SampleContext ctx{0, i, 3, 1};
      source->write_sample(ctx, pointers.data());
      const Detection& d = samples[i];
      const ViewPlan view = plan_image(t, d.width, d.height, 3, 1, i).views.at(0);
      const auto* plan_values = reinterpret_cast<const int32_t*>(rows[4].data());
      const std::array<int32_t, 7> want_plan = {
          view.x, view.y, view.width, view.height, view.flip, view.out_width, view.out_height};
      for (size_t k = 0; k < 7; ++k) ASSERT_EQ(plan_values[k], want_plan[k]);
      const RaggedRow boxes(rows[0].data()), labels(rows[2].data()), points(rows[3].data());
      const auto* box_values = reinterpret_cast<const float*>(boxes.items());
      const auto* label_values = reinterpret_cast<const int64_t*>(labels.items());
      ASSERT_EQ(boxes.count(), labels.count());
      int64_t out = 0;
      for (size_t k = 0; k < d.labels.size(); ++k) {
        double b[4];
        for (int c = 0; c < 4; ++c) b[c] = d.boxes[4 * k + c];
        const ReferenceBox r = reference_box(view, b, rule.min_size, rule.min_visibility);
        if (!r.kept) {
          ++dropped;
          continue;
        }
        ASSERT_LT(out, boxes.count()) << "sample " << i;
        ASSERT_EQ(label_values[out], d.labels[k]) << "sample " << i << " box " << k;
        ASSERT_NO_FATAL_FAILURE(expect_near_reference(box_values + 4 * out, r));
        ++out;
        ++kept;
      }
      ASSERT_EQ(out, boxes.count()) << "sample " << i;
      ASSERT_EQ(points.count(), 5);
      const auto* point_values = reinterpret_cast<const float*>(points.items());
      for (size_t k = 0; k < 5; ++k) {
        const MappedPoint p = map_point(view, d.points[3 * k], d.points[3 * k + 1]);
        ASSERT_EQ(point_values[3 * k], static_cast<float>(p.x));
        ASSERT_EQ(point_values[3 * k + 1], static_cast<float>(p.y));
        ASSERT_EQ(point_values[3 * k + 2], p.inside ? d.points[3 * k + 2] : 0.0f);
        invisible += !p.inside;
      }
    }
    EXPECT_GT(kept, 100u);
    EXPECT_GT(dropped, 20u);
    if (t.mode == ImageTransform::Mode::kRandomResizedCrop) {
      EXPECT_GT(invisible, 100u);
    }
  }
}

// A reader's bytes: nested and flat JSON lists, an .npy of float64, empty members; points of
// two columns come out with visibility 1 inside.
class BytesReader final : public MemberReader {
 public:
  BytesReader(std::vector<uint8_t> image, std::vector<std::pair<std::string, std::string>> members)
      : image_(std::move(image)), members_(std::move(members)) {}
  size_t size() const override { return members_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    out.add_bytes("png", image_.data(), image_.size());
    const auto& [boxes, points] = members_.at(ctx.index);
    out.add_bytes("boxes", boxes.data(), boxes.size());
    out.add_bytes("kp", points.data(), points.size());
  }

 private:
  std::vector<uint8_t> image_;
  std::vector<std::pair<std::string, std::string>> members_;
};

// Writes sample `index` of `source` into fresh rows; the rows.
std::vector<std::vector<std::byte>> rows_of(FieldSource& source, size_t index) {
  source.prepare(1);
  std::vector<std::vector<std::byte>> rows;
  std::vector<std::byte*> pointers;
  for (const FieldSpec& spec : source.fields()) rows.emplace_back(spec.sample_bytes());
  for (auto& r : rows) pointers.push_back(r.data());
  source.write_sample({0, index, 0, 0}, pointers.data());
  return rows;
}

std::vector<float> items_of(const std::vector<std::byte>& row, size_t per_item) {
  const RaggedRow r(const_cast<std::byte*>(row.data()));
  const auto* v = reinterpret_cast<const float*>(r.items());
  return std::vector<float>(v, v + static_cast<size_t>(r.count()) * per_item);
}

TEST(Boxes, ReadJsonListsAndNpy) {
  // The whole 40 x 20 image resized to 20 x 20, no flip: x halves, y stays.
  ImageTransform t = ImageTransform::eval(20, 20);
  t.mode = ImageTransform::Mode::kResize;
  std::string npy = std::string("\x93NUMPY\x01\x00", 8);
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 4), }";
  header.resize(118 - 1, ' ');
  header += '\n';
  npy += std::string(1, static_cast<char>(header.size() & 0xff)) + std::string(1, '\0') + header;
  const double b[4] = {4, 2, 8, 6};
  npy.append(reinterpret_cast<const char*>(b), sizeof b);
  const std::vector<std::pair<std::string, std::string>> members = {
      {"[[4, 2, 8, 6], [0, 0, 40, 20]]", "[[2, 2], [40, 20], [-1, 3]]"},
      {"[4, 2, 8, 6, 0, 0, 40, 20]", "[[2, 2, 2]]"},
      {npy, "[]"},
      {"[]", "[2, 2, 2, 4, 4, 0]"},
  };
  auto source =
      FieldSource::from_reader(std::make_shared<BytesReader>(image_of(40, 20, 1).bytes, members),
                               {{"image", Field::image("png", t)},
                                {"boxes", Field::boxes("boxes", "image", {})},
                                {"kp", Field::points("kp", "image", 3)}});
  EXPECT_EQ(items_of(rows_of(*source, 0)[1], 4), (std::vector<float>{2, 2, 4, 6, 0, 0, 20, 20}));
  EXPECT_EQ(items_of(rows_of(*source, 0)[2], 3),
            (std::vector<float>{1, 2, 1, 20, 20, 1, -0.5f, 3, 0}));
  EXPECT_EQ(items_of(rows_of(*source, 1)[1], 4), (std::vector<float>{2, 2, 4, 6, 0, 0, 20, 20}));
  EXPECT_EQ(items_of(rows_of(*source, 1)[2], 3), (std::vector<float>{1, 2, 2}));
  EXPECT_EQ(items_of(rows_of(*source, 2)[1], 4), (std::vector<float>{2, 2, 4, 6}));
  EXPECT_EQ(items_of(rows_of(*source, 2)[2], 3), std::vector<float>{});
  EXPECT_EQ(items_of(rows_of(*source, 3)[1], 4), std::vector<float>{});
  EXPECT_EQ(items_of(rows_of(*source, 3)[2], 3), (std::vector<float>{1, 2, 2, 2, 4, 0}));
}

std::string error_at(FieldSource& source, size_t index) {
  try {
    rows_of(source, index);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Why a source of `fields` over `reader` is refused (std::invalid_argument); "" where it is made.
std::string refused(std::shared_ptr<MemberReader> reader, Fields fields) {
  try {
    FieldSource::from_reader(std::move(reader), std::move(fields));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Boxes, ClearErrors) {
  const ImageTransform t = ImageTransform::train(16);
  const std::vector<std::pair<std::string, std::string>> members = {
      {"[[0, 0, 41, 10]]", "[]"},            // outside the 40 x 20 image
      {"[[5, 0, 4, 10]]", "[]"},             // x2 < x1
      {"[[0, 0, 1, 2, 3]]", "[]"},           // 5 numbers
      {"[0, 0, 1, 2, 3]", "[]"},             // a flat list of 5
      {"{\"boxes\": []}", "[]"},             // not a list
      {"[[1, 1, 2, 2]]", "[1, 2, 3, 4]"},    // points as a flat list without point_columns
      {"[[1, 1, 2, 2]]", "[[1e999, 2]]"},    // not a number
      {"[[1, 1, 2, 2]]", "[[1, 2, 3, 4]]"},  // points of 4
  };
  auto source =
      FieldSource::from_reader(std::make_shared<BytesReader>(image_of(40, 20, 1).bytes, members),
                               {{"image", Field::image("png", t)},
                                {"boxes", Field::boxes("boxes", "image", {})},
                                {"kp", Field::points("kp")}});
  // What each member gives, in the order of `members`.
  const std::vector<std::string> errors = {
      "field \"boxes\": box 0 [0.000000, 0.000000, 41.000000, 10.000000] lies outside its "
      "image (field \"image\": 40x20, upright)",
      "field \"boxes\": box 0 [5.000000, 0.000000, 4.000000, 10.000000] is not [x1, y1, "
      "x2, y2] with x1 <= x2, y1 <= y2",
      "field \"boxes\": member \"boxes\" is a list of lists of 5 numbers, not boxes of 4 "
      "numbers",
      "field \"boxes\": member \"boxes\" lists 5 numbers, not boxes of 4",
      "field \"boxes\": member \"boxes\" is not an .npy or a JSON list of boxes of 4 numbers",
      "field \"kp\": member \"kp\" is not an .npy or a JSON list of points of 2 or 3 "
      "numbers",
      "field \"kp\": member \"kp\" is not an .npy or a JSON list of points of 2 or 3 "
      "numbers",
      "field \"kp\": member \"kp\" is a list of lists of 4 numbers, not points of 2 or 3 "
      "numbers",
  };
  ASSERT_EQ(errors.size(), members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(error_at(*source, i), errors[i]) << "member " << i;
  }
}

// NaN in a typed array, a paired field of another length, and the declarations refused.
TEST(Boxes, PairedRowsAndDeclarations) {
  std::vector<Detection> samples = detections(2, 9);
  samples[0].boxes = {1, 1, NAN, 5};
  samples[0].labels = {1};
  samples[1].boxes = {1, 1, 5, 5};
  samples[1].labels = {1, 2};
  const auto reader = std::make_shared<DetectionReader>(samples);
  const Field image = Field::image("png", ImageTransform::train(16));
  auto source =
      FieldSource::from_reader(reader, {{"image", image},
                                        {"boxes", Field::boxes("boxes")},
                                        {"labels", Field::array("labels", c10::kLong, {-1})}});
  EXPECT_EQ(error_at(*source, 0),
            "field \"boxes\": box 0 [1.000000, 1.000000, nan, 5.000000] is not finite");
  EXPECT_EQ(error_at(*source, 1),
            "field \"labels\" has 2 rows and its boxes (field \"boxes\") 1: a field paired with "
            "boxes has one row per box");
  EXPECT_EQ(refused(reader, {{"image", image}, {"boxes", Field::boxes("boxes")}}),
            "field \"boxes\" pairs with \"labels\", which is not a field of the source (boxes "
            "without labels: paired=())");
  EXPECT_EQ(refused(reader, {{"image", image},
                             {"boxes", Field::boxes("boxes")},
                             {"labels", Field::integer("labels")}}),
            "field \"boxes\" pairs with \"labels\", which is not a ragged array (shape (-1, ...): "
            "one row per box)");
  EXPECT_EQ(refused(reader, {{"image", image},
                             {"boxes", Field::boxes("boxes")},
                             {"more", Field::boxes("boxes")},
                             {"labels", Field::array("labels", c10::kLong, {-1})}}),
            "field \"more\" pairs with \"labels\", which another boxes field pairs with already");
  EXPECT_EQ(refused(reader, {{"image", image}, {"plan", Field::plan("picture")}}),
            "field \"plan\": follows \"picture\", which is not an image field of the same source");
  BoxRule bad_rule;
  bad_rule.min_visibility = 1.5;
  EXPECT_EQ(
      refused(reader, {{"image", image}, {"boxes", Field::boxes("boxes", "image", {}, bad_rule)}}),
      "field \"boxes\": min_size must be >= 0 and min_visibility in [0, 1]");
  EXPECT_EQ(refused(reader, {{"image", image}, {"kp", Field::points("kp", "image", 4)}}),
            "field \"kp\": point_columns is 2 (x, y), 3 (x, y, visibility) or 0 (no flat lists), "
            "not 4");
}

// ---------------------------------------------------------------------------------------------
// Followers of an image with views (issue 33): each follows every view of the group it names.

// DINOv2's geometry at a test's sizes: 2 global views (area 0.32-1) and 8 local ones
// (0.05-0.32), each flipped half the time.
ImageTransform dino_views(int global = 24, int local = 12) {
  ImageTransform g = ImageTransform::train(global), l = ImageTransform::train(local);
  g.scale_min = 0.32;
  l.scale_min = 0.05;
  l.scale_max = 0.32;
  ImageTransform t;
  t.views = {{"global", 2, g}, {"local", 8, l}};
  return t;
}

// A detection sample with its mask ("seg", a palette PNG of the image's size).
class AnnotatedReader final : public MemberReader {
 public:
  AnnotatedReader(std::vector<Detection> samples, std::vector<PngFile> masks)
      : samples_(std::move(samples)), masks_(std::move(masks)) {}
  size_t size() const override { return samples_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    const Detection& d = samples_.at(ctx.index);
    out.add_bytes("png", d.image.data(), d.image.size());
    out.add_bytes("seg", masks_.at(ctx.index).bytes.data(), masks_.at(ctx.index).bytes.size());
    std::byte* b =
        out.add_array("boxes", c10::kFloat, {static_cast<int64_t>(d.boxes.size() / 4), 4});
    std::memcpy(b, d.boxes.data(), d.boxes.size() * sizeof(float));
    std::byte* l = out.add_array("labels", c10::kLong, {static_cast<int64_t>(d.labels.size())});
    std::memcpy(l, d.labels.data(), d.labels.size() * sizeof(int64_t));
    std::byte* q = out.add_array("kp", c10::kFloat, {static_cast<int64_t>(d.points.size() / 3), 3});
    std::memcpy(q, d.points.data(), d.points.size() * sizeof(float));
  }
  const std::vector<Detection>& samples() const { return samples_; }
  const std::vector<PngFile>& masks() const { return masks_; }

 private:
  std::vector<Detection> samples_;
  std::vector<PngFile> masks_;
};

std::shared_ptr<AnnotatedReader> annotated(size_t count, uint64_t seed) {
  std::vector<Detection> samples = detections(count, seed);
  std::vector<PngFile> masks;
  for (size_t i = 0; i < samples.size(); ++i) {
    masks.push_back(mask_of(samples[i].width, samples[i].height, 3, 8, i % 3 == 0, seed + i));
  }
  return std::make_shared<AnnotatedReader>(std::move(samples), std::move(masks));
}

// Each field's batch rows for one sample, written by `source` (prepared).
struct SampleRows {
  std::vector<FieldSpec> specs;
  std::vector<std::vector<std::byte>> rows;
  std::vector<std::byte*> pointers;
  explicit SampleRows(const FieldSource& source) : specs(source.fields()) {
    for (const FieldSpec& spec : specs) rows.emplace_back(spec.sample_bytes());
    for (auto& r : rows) pointers.push_back(r.data());
  }
  const std::vector<std::byte>& operator[](const std::string& name) const {
    for (size_t f = 0; f < specs.size(); ++f) {
      if (specs[f].name == name) return rows[f];
    }
    throw std::out_of_range(name);
  }
  // A ragged row's used bytes: its count and its items.
  std::vector<std::byte> used(const std::string& name) const {
    const std::vector<std::byte>& row = (*this)[name];
    size_t f = 0;
    while (specs[f].name != name) ++f;
    const auto count = static_cast<size_t>(RaggedRow(const_cast<std::byte*>(row.data())).count());
    return {row.begin(), row.begin() + static_cast<std::ptrdiff_t>(sizeof(int64_t) +
                                                                   count * specs[f].item_bytes())};
  }
};

// The views of `group` in sample `index`'s plan, from plan_image, apart from the writers.
std::vector<ViewPlan> views_of(const ImageTransform& t, const Detection& d, const SampleContext& c,
                               int group) {
  std::vector<ViewPlan> out;
  for (const ViewPlan& v : plan_image(t, d.width, d.height, c.seed, c.epoch, c.index).views) {
    if (v.group == group) out.push_back(v);
  }
  return out;
}

// Over 200 samples of DINOv2's geometry, with every follower declared before the image: each
// view's mask pixel is the mask's sample at that view's box and flip (nearest by centres,
// computed apart); each view's boxes are torchvision's crop, resize, flip and sanitize of that
// view (and map_box's exactly), each view's labels those of its kept boxes; each view's points
// are map_point's; the plans are plan_image's views of the group.
TEST(FollowViews, EachViewOfTheGroupItNames) {
  const auto reader = annotated(200, 41);
  const ImageTransform t = dino_views();
  BoxRule rule;
  rule.min_visibility = 0.3;
  auto source = FieldSource::from_reader(
      reader, {{"gboxes", Field::boxes("boxes", "global", {"glabels"}, rule)},
               {"lboxes", Field::boxes("boxes", "local", {"llabels"}, rule)},
               {"gseg", Field::mask("seg", "global")},
               {"lseg", Field::mask("seg", "local")},
               {"lkp", Field::points("kp", "local")},
               {"lplan", Field::plan("local")},
               {"gplan", Field::plan("global")},
               {"image", Field::image("png", t)},
               {"glabels", Field::array("labels", c10::kLong, {-1})},
               {"llabels", Field::array("labels", c10::kLong, {-1})}});
  SampleRows rows(*source);
  std::vector<std::string> names;
  for (const FieldSpec& spec : rows.specs) names.push_back(spec.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"gboxes", "gboxes_per_view", "lboxes", "lboxes_per_view",
                                      "gseg", "lseg", "lkp", "lkp_per_view", "lplan", "gplan",
                                      "global", "local", "glabels", "llabels"}));
  EXPECT_EQ(rows.specs[0].max_items, 2 * (Field::kDefaultMaxBytes / 16));
  EXPECT_EQ(rows.specs[1].sample_shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(rows.specs[1].dtype, c10::kLong);
  EXPECT_EQ(rows.specs[3].sample_shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(rows.specs[4].sample_shape, (std::vector<int64_t>{2, 24, 24}));
  EXPECT_EQ(rows.specs[5].sample_shape, (std::vector<int64_t>{8, 12, 12}));
  EXPECT_EQ(rows.specs[8].sample_shape, (std::vector<int64_t>{8, 7}));
  EXPECT_EQ(rows.specs[9].sample_shape, (std::vector<int64_t>{2, 7}));
  // The labels' rows hold each view's: 8 times the member's rows at most.
  EXPECT_EQ(rows.specs[13].max_items, 8 * (Field::kDefaultMaxBytes / 8));
  source->prepare(1);
  size_t kept = 0, dropped = 0, flipped = 0, invisible = 0, differ = 0;
  for (size_t i = 0; i < reader->size(); ++i) {
    const SampleContext ctx{0, i, 5, 2};
    source->write_sample(ctx, rows.pointers.data());
    const Detection& d = reader->samples()[i];
    const PngFile& mask = reader->masks()[i];
    struct Group {
      const char *boxes, *labels, *seg, *plan;
      int index, size;
    };
    for (const Group& g : {Group{"gboxes", "glabels", "gseg", "gplan", 0, 24},
                           Group{"lboxes", "llabels", "lseg", "lplan", 1, 12}}) {
      const std::vector<ViewPlan> views = views_of(t, d, ctx, g.index);
      const RaggedRow boxes(const_cast<std::byte*>(rows[g.boxes].data()));
      const RaggedRow labels(const_cast<std::byte*>(rows[g.labels].data()));
      const auto* per_view =
          reinterpret_cast<const int64_t*>(rows[std::string(g.boxes) + "_per_view"].data());
      const auto* box_values = reinterpret_cast<const float*>(boxes.items());
      const auto* label_values = reinterpret_cast<const int64_t*>(labels.items());
      const auto* seg = reinterpret_cast<const uint8_t*>(rows[g.seg].data());
      const auto* plan = reinterpret_cast<const int32_t*>(rows[g.plan].data());
      ASSERT_EQ(boxes.count(), labels.count());
      int64_t out = 0;
      for (size_t v = 0; v < views.size(); ++v) {
        const ViewPlan& view = views[v];
        flipped += view.flip;
        const std::array<int32_t, 7> want_plan = {
            view.x, view.y, view.width, view.height, view.flip, view.out_width, view.out_height};
        for (size_t k = 0; k < 7; ++k) ASSERT_EQ(plan[7 * v + k], want_plan[k]) << i;
        for (int y = 0; y < g.size; ++y) {
          for (int x = 0; x < g.size; ++x) {
            ASSERT_EQ(seg[(v * g.size + y) * g.size + x], expected_at(mask, view, x, y))
                << "sample " << i << " view " << v << " at (" << x << ", " << y << ")";
          }
        }
        const int64_t first = out;
        for (size_t k = 0; k < d.labels.size(); ++k) {
          double b[4];
          for (int c = 0; c < 4; ++c) b[c] = d.boxes[4 * k + c];
          const ReferenceBox r = reference_box(view, b, rule.min_size, rule.min_visibility);
          const MappedBox m = map_box(view, {b[0], b[1], b[2], b[3]}, rule);
          if (!r.kept) {
            ++dropped;
            continue;
          }
          ASSERT_LT(out, boxes.count());
          ASSERT_EQ(label_values[out], d.labels[k]) << "sample " << i << " view " << v;
          const float* got = box_values + 4 * out;
          ASSERT_NO_FATAL_FAILURE(expect_near_reference(got, r));
          ASSERT_EQ(got[0], static_cast<float>(m.x1));
          ASSERT_EQ(got[1], static_cast<float>(m.y1));
          ASSERT_EQ(got[2], static_cast<float>(m.x2));
          ASSERT_EQ(got[3], static_cast<float>(m.y2));
          ++out;
          ++kept;
        }
        ASSERT_EQ(per_view[v], out - first) << "sample " << i << " view " << v;
      }
      ASSERT_EQ(out, boxes.count()) << "sample " << i;
      // Views of one sample differ: the group's boxes are not one view's repeated.
      differ += views.size() > 1 && !(views[0] == views[1]);
    }
    // Points: each local view's, the member's 5 rows each.
    const std::vector<ViewPlan> local = views_of(t, d, ctx, 1);
    const RaggedRow points(const_cast<std::byte*>(rows["lkp"].data()));
    const auto* per_view = reinterpret_cast<const int64_t*>(rows["lkp_per_view"].data());
    ASSERT_EQ(points.count(), 8 * 5);
    const auto* point_values = reinterpret_cast<const float*>(points.items());
    for (size_t v = 0; v < local.size(); ++v) {
      ASSERT_EQ(per_view[v], 5);
      for (size_t k = 0; k < 5; ++k) {
        const MappedPoint p = map_point(local[v], d.points[3 * k], d.points[3 * k + 1]);
        const float* got = point_values + 3 * (5 * v + k);
        ASSERT_EQ(got[0], static_cast<float>(p.x));
        ASSERT_EQ(got[1], static_cast<float>(p.y));
        ASSERT_EQ(got[2], p.inside ? d.points[3 * k + 2] : 0.0f);
        invisible += !p.inside;
      }
    }
  }
  EXPECT_GT(kept, 1000u);  // both decisions, flips, points outside local views are reached
  EXPECT_GT(dropped, 1000u);
  EXPECT_GT(flipped, 500u);
  EXPECT_GT(invisible, 1000u);
  EXPECT_GT(differ, 390u);
}

// A group of one view is the one-view image's result, bit for bit, for every follower (the
// group's fields add the per-view counts only).
TEST(FollowViews, AGroupOfOneViewIsTheOneViewResultBitForBit) {
  const auto reader = annotated(200, 43);
  const ImageTransform plain = ImageTransform::train(20);
  ImageTransform one;
  one.views = {{"image", 1, plain}};
  const auto fields = [](const ImageTransform& t) {
    return Fields{{"image", Field::image("png", t)},
                  {"boxes", Field::boxes("boxes")},
                  {"labels", Field::array("labels", c10::kLong, {-1})},
                  {"kp", Field::points("kp")},
                  {"seg", Field::mask("seg")},
                  {"plan", Field::plan()}};
  };
  auto a = FieldSource::from_reader(reader, fields(plain));
  auto b = FieldSource::from_reader(reader, fields(one));
  SampleRows ra(*a), rb(*b);
  ASSERT_EQ(ra.specs.size(), 6u);
  ASSERT_EQ(rb.specs.size(), 8u);  // and boxes_per_view, kp_per_view
  a->prepare(1);
  b->prepare(1);
  size_t boxes = 0;
  for (size_t i = 0; i < reader->size(); ++i) {
    const SampleContext ctx{0, i, 9, 4};
    a->write_sample(ctx, ra.pointers.data());
    b->write_sample(ctx, rb.pointers.data());
    for (const char* name : {"image", "seg", "plan"}) {
      ASSERT_EQ(ra[name], rb[name]) << name << " of sample " << i;
    }
    for (const char* name : {"boxes", "labels", "kp"}) {
      ASSERT_EQ(ra.used(name), rb.used(name)) << name << " of sample " << i;
    }
    const RaggedRow kept(ra.pointers[1]);
    int64_t per_view = -1;
    std::memcpy(&per_view, rb["boxes_per_view"].data(), sizeof per_view);
    ASSERT_EQ(per_view, kept.count());
    boxes += static_cast<size_t>(kept.count());
  }
  EXPECT_GT(boxes, 300u);
}

// Through the loader: the same batches (every field, every offset) for 1 and 4 workers, and a
// resumed loader (another worker count) continues them bit for bit.
TEST(FollowViews, SameBatchesForOneAndFourWorkersAndAfterAResume) {
  const auto reader = annotated(30, 47);
  const auto source = [&] {
    return FieldSource::from_reader(reader, {{"image", Field::image("png", dino_views())},
                                             {"boxes", Field::boxes("boxes", "local", {"labels"})},
                                             {"labels", Field::array("labels", c10::kLong, {-1})},
                                             {"kp", Field::points("kp", "global")},
                                             {"seg", Field::mask("seg", "local")},
                                             {"plan", Field::plan("global")}});
  };
  const auto options = [](size_t workers) {
    LoaderOptions o;
    o.batch_size = 4;
    o.workers = workers;
    o.seed = 7;
    return o;
  };
  using Tensors = std::vector<at::Tensor>;
  const auto copy = [](const Batch& b) {
    Tensors out;
    for (const at::Tensor& f : b.fields) out.push_back(f.clone());
    for (const at::Tensor& o : b.offsets) out.push_back(o.defined() ? o.clone() : at::Tensor());
    return out;
  };
  const auto same = [](const Tensors& got, const Tensors& want) {
    if (got.size() != want.size()) return false;
    for (size_t t = 0; t < got.size(); ++t) {
      if (got[t].defined() != want[t].defined()) return false;
      if (got[t].defined() && !got[t].equal(want[t])) return false;
    }
    return true;
  };
  std::vector<Tensors> reference;
  {
    DataLoader one(source(), options(1), RandomSampler::make(3));
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : one) reference.push_back(copy(b));
    }
  }
  ASSERT_EQ(reference.size(), 16u);  // 8 batches an epoch (the last of 2)
  {
    DataLoader four(source(), options(4), RandomSampler::make(3));
    size_t n = 0;
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : four) {
        ASSERT_LT(n, reference.size());
        EXPECT_TRUE(same(copy(b), reference[n])) << "batch " << n;
        ++n;
      }
    }
    EXPECT_EQ(n, reference.size());
  }
  for (const size_t k : {3u, 10u}) {
    std::string checkpoint;
    {
      DataLoader first(source(), options(2), RandomSampler::make(3));
      size_t taken = 0;
      while (taken < k) {
        for (Batch& b : first) {
          (void)b;
          if (++taken == k) break;
        }
      }
      checkpoint = testing::save_to_string(first);
    }
    DataLoader resumed(source(), options(4), RandomSampler::make(3));
    testing::load_from_string(resumed, checkpoint);
    size_t n = k;
    while (n < reference.size()) {
      for (Batch& b : resumed) {
        ASSERT_LT(n, reference.size());
        EXPECT_TRUE(same(copy(b), reference[n])) << "batch " << n << " after " << k;
        ++n;
      }
    }
    EXPECT_EQ(n, reference.size());
  }
}

// A follower of an image with views names one of its groups; the image's own name is refused,
// listing them.
TEST(FollowViews, AFollowerNamesAGroup) {
  const auto reader = annotated(1, 1);
  const Field image = Field::image("png", dino_views());
  const std::string groups =
      "it follows one group of them, named in `follows`: \"global\", "
      "\"local\"";
  EXPECT_EQ(refused(reader, {{"image", image}, {"seg", Field::mask("seg")}}),
            "field \"seg\" follows \"image\", an image with views: " + groups);
  EXPECT_EQ(refused(reader, {{"image", image}, {"boxes", Field::boxes("boxes", "image", {})}}),
            "field \"boxes\" follows \"image\", an image with views: " + groups);
  EXPECT_EQ(refused(reader, {{"image", image}, {"plan", Field::plan("image")}}),
            "field \"plan\" follows \"image\", an image with views: " + groups);
  EXPECT_EQ(refused(reader, {{"image", image}, {"plan", Field::plan("globals")}}),
            "field \"plan\": follows \"globals\", which is not an image field of the same source");
  // The per-view counts are a batch field of their name.
  EXPECT_EQ(refused(reader, {{"image", image},
                             {"kp", Field::points("kp", "local")},
                             {"kp_per_view", Field::integer("cls")}}),
            "field \"kp_per_view\" is named twice (a view group is a field of its name)");
  // max_bytes bounds the member (2 boxes of 16 bytes); the row holds each view's.
  std::vector<Detection> three = detections(1, 5);
  three[0].boxes = {1, 1, 10, 10, 2, 2, 12, 12, 3, 3, 14, 14};
  three[0].labels = {1, 2, 3};
  auto source = FieldSource::from_reader(
      std::make_shared<AnnotatedReader>(three, reader->masks()),
      {{"image", image}, {"boxes", Field::boxes("boxes", "local", {}, BoxRule{}, 32)}});
  EXPECT_EQ(source->fields()[2].max_items, 8u * 2u);
  EXPECT_EQ(error_at(*source, 0),
            "field \"boxes\": member \"boxes\" holds 3 boxes, over the field's bound of 2 "
            "(max_bytes 32)");
}

}  // namespace
}  // namespace conveyor
