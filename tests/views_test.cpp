// Several views of one image from one decode (issue 33): the plan numbers the views in group
// order, each from its own stream; one group of one view is the plain transform bit for bit; a
// view decoded among others is the bytes it has alone when its own DCT scale is the shared
// decode's (JPEG with and without restart markers, EXIF-rotated; PNG, decoded at full scale,
// always), and close otherwise; a view group is a batch field named after it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codec/image_codec.h"
#include "conveyor/fields.h"
#include "conveyor/image_plan.h"
#include "png_writer.h"
#include "test_support.h"

namespace conveyor {
namespace {

ImageTransform random_resized_crop(int size, double scale_min, double scale_max) {
  ImageTransform t = ImageTransform::train(size);
  t.scale_min = scale_min;
  t.scale_max = scale_max;
  return t;
}

// DINOv2's geometry at a test's sizes: 2 global views and 8 local ones.
ImageTransform dino(int global = 56, int local = 24) {
  ImageTransform t;
  t.views = {{"global", 2, random_resized_crop(global, 0.32, 1.0)},
             {"local", 8, random_resized_crop(local, 0.05, 0.32)}};
  return t;
}

TEST(Views, PlanNumbersTheViewsInGroupOrderEachFromItsOwnStream) {
  const ImageTransform t = dino();
  for (size_t index = 0; index < 200; ++index) {
    const ImagePlan plan = plan_image(t, 500, 375, 7, 2, index);
    ASSERT_EQ(plan.views.size(), 10u);
    for (int v = 0; v < 10; ++v) {
      const ViewPlan& view = plan.views[static_cast<size_t>(v)];
      const int group = v < 2 ? 0 : 1;
      EXPECT_EQ(view.view, v);
      EXPECT_EQ(view.group, group);
      // View v alone: its group's transform drawn from stream v. Only view 0's stream is a plain
      // transform's, so that is compared through the whole plan; the others through a one-group
      // plan of the same count, whose streams are the same numbers.
      ImageTransform alone;
      alone.views = {{"g", v + 1, t.views[static_cast<size_t>(group)].transform}};
      ViewPlan expected = plan_image(alone, 500, 375, 7, 2, index).views.back();
      expected.group = group;
      EXPECT_EQ(view, expected);
      EXPECT_EQ(view.out_width, group == 0 ? 56 : 24);
      EXPECT_LE(view.x + view.width, 500);
      EXPECT_LE(view.y + view.height, 375);
    }
    // View 0 is the plain transform's one view.
    ViewPlan plain = plan_image(t.views[0].transform, 500, 375, 7, 2, index).views.at(0);
    EXPECT_EQ(plan.views[0], plain);
  }
}

TEST(Views, TheGroupsAreChecked) {
  const auto refused = [](ImageTransform t) {
    EXPECT_THROW(ImageWriter{t}, std::invalid_argument);
    EXPECT_THROW((void)Field::image("jpg", t).specs("image"), std::invalid_argument);
  };
  ImageTransform t = dino();
  t.views[1].name = "global";
  refused(t);
  t = dino();
  t.views[0].count = 0;
  refused(t);
  t = dino();
  t.views[0].name = "";
  refused(t);
  t = dino();
  t.views[1].transform.views = dino().views;
  refused(t);
}

// The rows ImageWriter writes for `t`: one buffer per group.
std::vector<std::vector<std::byte>> rows_of(ImageWriter& writer, const std::vector<uint8_t>& file,
                                            const SampleContext& ctx) {
  const ImageTransform& t = writer.transform();
  const std::vector<ViewGroup> groups = view_groups(t);
  std::vector<std::vector<std::byte>> rows;
  std::vector<std::byte*> pointers;
  for (size_t g = 0; g < groups.size(); ++g) {
    rows.emplace_back(static_cast<size_t>(groups[g].count) * view_bytes(t, g));
  }
  for (auto& r : rows) pointers.push_back(r.data());
  writer.write_groups(file.data(), file.size(), ctx, pointers.data());
  return rows;
}

TEST(Views, OneGroupOfOneViewIsThePlainTransformBitForBit) {
  for (ImageTransform plain : {ImageTransform::train(64), ImageTransform::eval(48, 60)}) {
    for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
      plain.layout = layout;
      ImageTransform one;
      one.layout = layout;
      one.views = {{"only", 1, plain}};
      ImageWriter a(plain), b(one);
      for (size_t i = 0; i < 40; ++i) {
        const auto file =
            make_photo_jpeg(120 + static_cast<int>(i) * 13, 90 + static_cast<int>(i) * 7, i);
        const SampleContext ctx{0, i, 3, 1};
        std::vector<std::byte> expected(view_bytes(plain, 0));
        a.write(file.data(), file.size(), ctx, expected.data());
        EXPECT_EQ(rows_of(b, file, ctx).at(0), expected) << "sample " << i;
        EXPECT_EQ(a.last_plan(), b.last_plan());
        EXPECT_EQ(a.last_scale(), b.last_scale());
      }
    }
  }
}

// Views from one decode against each view decoded alone (decode_views_once = false), over many
// samples of `files`: a view whose own scale is the shared decode's is the same bytes; the others
// differ by the measured `max_diff` at most, with a PSNR of at least `min_psnr`. Returns how many
// views were compared byte for byte.
int check_against_alone(const std::vector<std::vector<uint8_t>>& files, ImageTransform t,
                        int max_diff, double min_psnr) {
  ImageTransform each = t;
  each.decode_views_once = false;
  ImageWriter once(t), alone(each);
  const std::vector<ViewGroup> groups = view_groups(t);
  const DecodeOptions options{4, true, t.dct_scales};
  int identical = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const SampleContext ctx{0, i, 9, 4};
    const auto got = rows_of(once, files[i], ctx);
    const auto want = rows_of(alone, files[i], ctx);
    EXPECT_EQ(once.last_plan(), alone.last_plan());
    const ImagePlan& plan = once.last_plan();
    for (const ViewPlan& v : plan.views) {
      size_t first = 0;
      while (plan.views[first].group != v.group) ++first;
      const size_t bytes = view_bytes(t, static_cast<size_t>(v.group));
      const size_t at = (static_cast<size_t>(v.view) - first) * bytes;
      const auto* a =
          reinterpret_cast<const uint8_t*>(got[static_cast<size_t>(v.group)].data()) + at;
      const auto* b =
          reinterpret_cast<const uint8_t*>(want[static_cast<size_t>(v.group)].data()) + at;
      // The box in stored pixels has the upright box's size, exchanged for orientations 5..8;
      // the scale rule is symmetric for square outputs.
      const int own = detail::dct_scale_for(v.width, v.height, v.out_width, v.out_height, options);
      const bool jpeg =
          detail::detect_format(files[i].data(), files[i].size()) == detail::ImageFormat::kJpeg;
      if (!jpeg || own == once.last_scale()) {
        EXPECT_EQ(std::memcmp(a, b, bytes), 0) << "sample " << i << " view " << v.view;
        ++identical;
        continue;
      }
      EXPECT_GT(own, 0);
      int worst = 0;
      double squared = 0;
      for (size_t k = 0; k < bytes; ++k) {
        const int d = std::abs(static_cast<int>(a[k]) - static_cast<int>(b[k]));
        worst = std::max(worst, d);
        squared += static_cast<double>(d) * d;
      }
      const double mse = squared / static_cast<double>(bytes);
      const double psnr = mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
      EXPECT_LE(worst, max_diff) << "sample " << i << " view " << v.view;
      EXPECT_GE(psnr, min_psnr) << "sample " << i << " view " << v.view;
    }
  }
  return identical;
}

std::vector<std::vector<uint8_t>> photos(int count, int restart_interval, int orientation) {
  std::vector<std::vector<uint8_t>> files;
  for (int i = 0; i < count; ++i) {
    const int w = 160 + 37 * (i % 7), h = 120 + 29 * (i % 5);
    std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
    const auto photo = make_photo_jpeg(w, h, 100 + static_cast<uint64_t>(i));
    if (restart_interval == 0 && orientation == 0) {
      files.push_back(photo);
      continue;
    }
    JpegDecoder decoder;
    const DecodedImage full = decoder.decode(photo.data(), photo.size());
    for (int y = 0; y < h; ++y) {
      std::memcpy(rgb.data() + static_cast<size_t>(y) * w * 3, full.pixels + y * full.stride,
                  static_cast<size_t>(w) * 3);
    }
    EncodeOptions o;
    o.restart_interval = restart_interval;
    o.orientation = orientation;
    files.push_back(encode_jpeg(rgb.data(), w, h, o));
  }
  return files;
}

TEST(Views, JpegViewsMatchTheirOwnDecodesAsStated) {
  // Stated in docs/design.md ("Views"): a view resized from a finer decode than its own differs
  // from its own decode by a PSNR of at least 18 dB on these small, detailed views (19.8 dB
  // measured; single pixels up to 149 levels apart, bilinear aliasing the finer pixels); the
  // views that share the decode's scale, placed by the same arithmetic, are exact.
  const int same = check_against_alone(photos(30, 0, 0), dino(), 255, 18.0);
  EXPECT_GT(same, 30);  // many views are compared byte for byte
}

TEST(Views, PreparedFilesDecodeOnlyTheIntervalsTheUnionNeeds) {
  // Restart markers every MCU row and every 2 MCUs: the union's intervals, then each view.
  for (int interval : {1, 2, 7}) {
    const int same = check_against_alone(photos(20, interval, 0), dino(), 255, 18.0);
    EXPECT_GT(same, 20) << "restart interval " << interval;
  }
}

TEST(Views, ExifRotatedViewsMatchTheirOwnDecodes) {
  for (int orientation : {3, 6, 8}) {
    ImageTransform t = dino();
    t.exif_orientation = true;
    const int same = check_against_alone(photos(12, 0, orientation), t, 255, 18.0);
    EXPECT_GT(same, 10) << "orientation " << orientation;
  }
}

TEST(Views, PngViewsAreTheirOwnDecodesByteForByte) {
  std::vector<std::vector<uint8_t>> files;
  for (int i = 0; i < 20; ++i) {
    testing::PngSpec s;
    s.width = 90 + 11 * i;
    s.height = 70 + 5 * i;
    s.color_type = i % 3 == 0 ? 0 : 2;
    s.interlaced = i % 4 == 1;
    files.push_back(testing::make_png(s, static_cast<uint64_t>(i)).bytes);
  }
  EXPECT_EQ(check_against_alone(files, dino(), 0, 99.0), 200);
}

// A member reader of JPEG files ("jpg") with labels ("cls").
class PhotoReader final : public MemberReader {
 public:
  explicit PhotoReader(std::vector<std::vector<uint8_t>> files) : files_(std::move(files)) {}
  size_t size() const override { return files_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    const auto& f = files_.at(ctx.index);
    out.add_bytes("jpg", f.data(), f.size());
    out.add_integer("cls", static_cast<int64_t>(ctx.index));
  }

 private:
  std::vector<std::vector<uint8_t>> files_;
};

TEST(Views, EachGroupIsABatchFieldNamedAfterIt) {
  const std::vector<std::vector<uint8_t>> files = photos(6, 0, 0);
  ImageTransform t = dino();
  t.layout = ImageLayout::kHWC;
  auto source = FieldSource::from_reader(
      std::make_shared<PhotoReader>(files),
      {{"image", Field::image("jpg", t)}, {"label", Field::integer("cls")}});
  const std::vector<FieldSpec> specs = source->fields();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "global");
  EXPECT_EQ(specs[0].sample_shape, (std::vector<int64_t>{2, 56, 56, 3}));
  EXPECT_EQ(specs[1].name, "local");
  EXPECT_EQ(specs[1].sample_shape, (std::vector<int64_t>{8, 24, 24, 3}));
  EXPECT_EQ(specs[2].name, "label");
  // GPU decode is offered the field with its views, which it leaves to the CPU (its status says).
  ASSERT_TRUE(source->encoded_image_field().has_value());
  EXPECT_FALSE(source->encoded_image_field()->transform.views.empty());
  source->prepare(1);
  ImageWriter writer(t);
  for (size_t i = 0; i < files.size(); ++i) {
    std::vector<std::byte> global(specs[0].sample_bytes()), local(specs[1].sample_bytes()),
        label(8);
    std::byte* rows[] = {global.data(), local.data(), label.data()};
    const SampleContext ctx{0, i, 1, 0};
    source->write_sample(ctx, rows);
    const auto expected = rows_of(writer, files[i], ctx);
    EXPECT_EQ(global, expected[0]);
    EXPECT_EQ(local, expected[1]);
    int64_t cls = -1;
    std::memcpy(&cls, label.data(), 8);
    EXPECT_EQ(cls, static_cast<int64_t>(i));
  }
}

TEST(Views, FieldNamesAndFollowersAreChecked) {
  const auto fails_with = [](Fields fields, const std::string& words) {
    try {
      FieldSource::from_reader(std::make_shared<PhotoReader>(photos(1, 0, 0)), std::move(fields));
      ADD_FAILURE() << "no error, expected " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  // A group named as another field.
  fails_with({{"image", Field::image("jpg", dino())}, {"local", Field::integer("cls")}},
             "field \"local\" is named twice");
  // A mask follows a group of an image with views (geometry_test's FollowViews): the image's
  // own name is refused.
  fails_with({{"image", Field::image("jpg", dino())}, {"seg", Field::mask("png", "image")}},
             "an image with views: it follows one group of them");
}

}  // namespace
}  // namespace conveyor
