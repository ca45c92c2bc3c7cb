// Crop-proportional decoding through restart markers (issue 12; datasets/src/jpeg_segments.h):
// which files qualify, that a region decoded from its covering segments has exactly the pixels of
// the usual decode for every kind of file, and that the small JPEG holds only the covering
// intervals. conveyor-decode-check compares the same path with full decodes on 20,000 random
// pairs in ctest (decode_check).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "jpeg_segments.h"

namespace conveyor {
namespace {

using Color = EncodeOptions::Color;

std::vector<uint8_t> noise_rgb(int w, int h, uint64_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  SampleRng rng(seed, 0, 0);
  for (size_t i = 0; i < rgb.size(); ++i) {
    // Smooth gradients plus noise: real Huffman data, with 0xFF bytes to stuff.
    rgb[i] = static_cast<uint8_t>(
        (i / 3 % static_cast<size_t>(w)) * 255 / static_cast<size_t>(w) / 2 + rng.next() % 128);
  }
  return rgb;
}

std::vector<uint8_t> jpeg(int w, int h, EncodeOptions o, uint64_t seed = 1) {
  const auto rgb = noise_rgb(w, h, seed);
  return encode_jpeg(rgb.data(), w, h, o);
}

EncodeOptions with_restarts(int interval, Color color = Color::kYCbCr, int hs = 2, int vs = 2) {
  EncodeOptions o;
  o.color = color;
  o.h_samp = hs;
  o.v_samp = vs;
  o.restart_interval = interval;
  return o;
}

TEST(JpegSegments, TheLayoutOfAFileWhoseIntervalsTileItsRows) {
  const auto file = jpeg(512, 383, with_restarts(4));
  detail::SegmentLayout l;
  ASSERT_TRUE(detail::read_segment_layout(file.data(), file.size(), l));
  EXPECT_EQ(l.interval, 4);
  EXPECT_EQ(l.mcu_width, 16);
  EXPECT_EQ(l.mcu_height, 16);
  EXPECT_EQ(l.mcus_per_row, 32);
  EXPECT_EQ(l.mcu_rows, 24);  // ceil(383 / 16)
  ASSERT_EQ(l.starts.size(), 32u / 4 * 24);
  for (size_t k = 0; k + 1 < l.starts.size(); ++k) {
    EXPECT_LT(l.starts[k], l.ends[k]);
    EXPECT_EQ(l.ends[k] + 2, l.starts[k + 1]) << "an RST marker between segments " << k;
    EXPECT_EQ(file[l.ends[k]], 0xFF);
    EXPECT_EQ(file[l.ends[k] + 1], 0xD0 + k % 8);
  }
  EXPECT_EQ(file[l.ends.back()], 0xFF);
  EXPECT_EQ(file[l.ends.back() + 1], 0xD9);

  // Gray: a single-component scan's MCU is one 8x8 block.
  const auto gray = jpeg(480, 100, with_restarts(6, Color::kGray, 1, 1));
  ASSERT_TRUE(detail::read_segment_layout(gray.data(), gray.size(), l));
  EXPECT_EQ(l.mcu_width, 8);
  EXPECT_EQ(l.mcus_per_row, 60);
}

TEST(JpegSegments, OtherFilesAreLeftToTheUsualDecode) {
  detail::SegmentLayout l;
  auto refused = [&](const std::vector<uint8_t>& f) {
    return !detail::read_segment_layout(f.data(), f.size(), l);
  };
  EXPECT_TRUE(refused(jpeg(512, 64, with_restarts(0)))) << "no restart markers";
  EXPECT_TRUE(refused(jpeg(512, 64, with_restarts(7)))) << "7 does not divide 32 MCUs per row";
  EncodeOptions progressive = with_restarts(4);
  progressive.progressive = true;
  EXPECT_TRUE(refused(jpeg(512, 64, progressive)));
  EncodeOptions arithmetic = with_restarts(4);
  arithmetic.arithmetic = true;
  EXPECT_TRUE(refused(jpeg(512, 64, arithmetic)));
  auto file = jpeg(512, 64, with_restarts(4));
  ASSERT_FALSE(refused(file));
  auto truncated = file;
  truncated.resize(file.size() * 2 / 3);
  EXPECT_TRUE(refused(truncated));
  // A restart marker out of sequence: damaged, so the usual decode reports it.
  ASSERT_TRUE(detail::read_segment_layout(file.data(), file.size(), l));
  auto damaged = file;
  damaged[l.ends[3] + 1] = 0xD5;
  EXPECT_TRUE(refused(damaged));
  EXPECT_TRUE(refused({}));
  EXPECT_TRUE(refused({0xFF, 0xD8, 0xFF}));
}

// decode_region with segments against decode_region without, on random boxes and output sizes:
// every byte equal, for every sampling, colour space and both upsamplings.
TEST(JpegSegments, RegionsFromSegmentsHaveTheUsualPixels) {
  struct Kind {
    Color color;
    int hs, vs;
    int interval;
  };
  // 480 px wide: 30 MCUs per row at 16 px, 60 at 8 px, 15 at 32 px; each interval divides them.
  const Kind kinds[] = {{Color::kYCbCr, 2, 2, 5}, {Color::kYCbCr, 2, 1, 2},
                        {Color::kYCbCr, 1, 1, 6}, {Color::kYCbCr, 1, 2, 4},
                        {Color::kYCbCr, 4, 1, 3}, {Color::kGray, 1, 1, 5},
                        {Color::kCmyk, 1, 1, 4},  {Color::kYcck, 2, 2, 2}};
  size_t compared = 0;
  for (const Kind& k : kinds) {
    const auto file = jpeg(480, 271, with_restarts(k.interval, k.color, k.hs, k.vs), compared);
    detail::SegmentLayout l;
    ASSERT_TRUE(detail::read_segment_layout(file.data(), file.size(), l)) << compared;
    for (bool fast : {false, true}) {
      DecodeOptions plain_options, cut_options;
      plain_options.fast_upsampling = cut_options.fast_upsampling = fast;
      plain_options.any_scale = cut_options.any_scale = true;
      plain_options.restart_segments = false;
      JpegDecoder plain({}, plain_options), cut({}, cut_options);
      SampleRng rng(7, compared, fast);
      for (int box = 0; box < 40; ++box) {
        const int w = 1 + static_cast<int>(rng.next() % 300);
        const int h = 1 + static_cast<int>(rng.next() % 200);
        const int x = static_cast<int>(rng.next() % static_cast<uint64_t>(480 - w + 1));
        const int y = static_cast<int>(rng.next() % static_cast<uint64_t>(271 - h + 1));
        const int out = 1 + static_cast<int>(rng.next() % 256);
        const DecodedImage a = plain.decode_region(file.data(), file.size(), x, y, w, h, out, out);
        const std::vector<uint8_t> expected = [&] {
          std::vector<uint8_t> v;
          for (int r = 0; r < a.height; ++r) {
            const uint8_t* row = a.pixels + a.stride * static_cast<size_t>(r);
            v.insert(v.end(), row, row + static_cast<size_t>(a.width * a.channels));
          }
          return v;
        }();
        const DecodedImage b = cut.decode_region(file.data(), file.size(), x, y, w, h, out, out);
        ASSERT_EQ(a.width, b.width);
        ASSERT_EQ(a.height, b.height);
        ASSERT_EQ(a.scale, b.scale);
        for (int r = 0; r < b.height; ++r) {
          ASSERT_EQ(std::memcmp(expected.data() + static_cast<size_t>(r * b.width * b.channels),
                                b.pixels + b.stride * static_cast<size_t>(r),
                                static_cast<size_t>(b.width * b.channels)),
                    0)
              << "kind " << compared << " fast " << fast << " box " << x << "," << y << " " << w
              << "x" << h << " out " << out << " row " << r;
        }
      }
    }
    ++compared;
  }
}

// The small JPEG of a box holds only the intervals that cover it.
TEST(JpegSegments, TheSmallJpegHoldsOnlyTheCoveringIntervals) {
  const auto file = jpeg(512, 383, with_restarts(4));
  detail::SegmentLayout l;
  ASSERT_TRUE(detail::read_segment_layout(file.data(), file.size(), l));
  std::vector<uint8_t> small;
  detail::write_segment_jpeg(file.data(), l, 8, 16, 10, 14, small);  // a quarter of the width
  size_t covered = 0;
  for (int r = 10; r < 14; ++r) {
    for (int s = 2; s < 4; ++s) covered += l.ends[r * 8 + s] - l.starts[r * 8 + s];
  }
  EXPECT_LT(small.size(), l.scan_data + covered + 64);
  EXPECT_LT(small.size(), file.size() / 8);
  JpegDecoder decoder;
  const DecodedImage image = decoder.decode(small.data(), small.size());
  EXPECT_EQ(image.width, 8 * 16);
  EXPECT_EQ(image.height, 4 * 16);
  // At the right and bottom edges the image keeps its own extent.
  detail::write_segment_jpeg(file.data(), l, 24, 32, 20, 24, small);
  const DecodedImage corner = decoder.decode(small.data(), small.size());
  EXPECT_EQ(corner.width, 512 - 24 * 16);
  EXPECT_EQ(corner.height, 383 - 20 * 16);
}

}  // namespace
}  // namespace conveyor
