// The plan as data and the fields that follow it (issues 32 and 33): plan_image's one view is
// today's choose_crop box bit for bit (against a verbatim copy of the code before the plan,
// with its own random stream), and masks follow the image's box, flip and output size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "conveyor/fields.h"
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

// Every kind of one-channel PNG, with the mask declared before its image (followers are written
// after their leader whatever the order), over many samples of a train and an eval transform:
// every output pixel is the mask's sample at the image's plan's box and flip, nearest by centres.
TEST(Mask, FollowsTheImagesBoxAndFlipPixelForPixel) {
  struct Kind {
    int color_type, depth;
  };
  const Kind kinds[] = {{3, 8}, {0, 8}, {0, 16}};
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
        const c10::ScalarType dtype = kind.depth == 16 ? c10::kInt : c10::kByte;
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
                      : reinterpret_cast<int32_t*>(mask_row.data())[at];
              ASSERT_EQ(got, expected_at(mask, view, x, y))
                  << "kind " << kind.color_type << "/" << kind.depth << " sample " << i << " at ("
                  << x << ", " << y << ")";
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

// A mask never holds a value its source lacks: a checkerboard of 200 ids, shrunk and grown.
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
    auto source =
        FieldSource::from_reader(std::make_shared<PairReader>(std::vector<Pair>(
                                     50, {image_of(97, 89, 3).bytes, mask.bytes})),
                                 {{"image", Field::image("png", ImageTransform::train(size))},
                                  {"mask", Field::mask("seg", "image", c10::kInt)}});
    source->prepare(1);
    std::vector<std::byte> image_row(source->fields()[0].sample_bytes()),
        mask_row(source->fields()[1].sample_bytes());
    std::byte* rows[] = {image_row.data(), mask_row.data()};
    for (size_t i = 0; i < 50; ++i) {
      source->write_sample({0, i, 5, 0}, rows);
      const auto* v = reinterpret_cast<const int32_t*>(mask_row.data());
      for (size_t p = 0; p < static_cast<size_t>(size) * size; ++p) {
        ASSERT_TRUE(ids.count(v[p])) << v[p];
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
            "field \"mask\": a 16-bit mask needs dtype int32 (it is declared uint8)");
  EXPECT_EQ(error_of(*source, 2),
            "field \"mask\": PNG of one channel wanted (gray or palette), not RGB");
  const std::vector<Pair> low = {
      {image_of(40, 30, 1).bytes, mask_of(40, 30, 3, 4, false, 1).bytes}};
  EXPECT_EQ(error_of(*FieldSource::from_reader(std::make_shared<PairReader>(low), fields), 0),
            "field \"mask\": a mask of 4 bits per sample is not supported yet (8 or 16 bits)");
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

}  // namespace
}  // namespace conveyor
