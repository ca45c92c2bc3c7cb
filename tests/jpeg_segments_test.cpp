// Crop-proportional decoding through restart markers (issue 12; datasets/codec/jpeg_segments.h):
// which files qualify, that a region decoded from its covering segments has exactly the pixels of
// the usual decode for every kind of file, and that the small JPEG holds only the covering
// intervals. conveyor-decode-check compares the same path with full decodes on 20,000 random
// pairs in ctest (decode_check).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "codec/jpeg_segments.h"
#include "conveyor/jpeg.h"
#include "conveyor/random.h"

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

// The image's rows, packed (no stride padding).
std::vector<uint8_t> packed_rows(const DecodedImage& image) {
  std::vector<uint8_t> v;
  for (int r = 0; r < image.height; ++r) {
    const uint8_t* row = image.pixels + image.stride * static_cast<size_t>(r);
    v.insert(v.end(), row, row + static_cast<size_t>(image.width * image.channels));
  }
  return v;
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
        const std::vector<uint8_t> expected = packed_rows(a);
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

// The segment index conveyor-prepare stores: the layout read from it is the scan's, shifted by
// the marker segment, the small JPEGs are byte for byte those of the file without it, and an index
// that does not match the file (stale, damaged, another version) is ignored for a scan.
TEST(JpegSegments, TheStoredIndexGivesTheScansLayoutAndADamagedOneIsIgnored) {
  const auto file = jpeg(512, 383, with_restarts(4));
  detail::SegmentLayout scanned, indexed;
  ASSERT_TRUE(detail::read_segment_layout(file.data(), file.size(), scanned));
  EXPECT_FALSE(scanned.indexed);
  std::vector<uint8_t> with_index;
  ASSERT_TRUE(detail::add_segment_index(file.data(), file.size(), with_index));
  const size_t added = with_index.size() - file.size();
  EXPECT_EQ(added, 4 + 18 + 1 + 4 + 2 * scanned.ends.size());
  ASSERT_TRUE(detail::read_segment_layout(with_index.data(), with_index.size(), indexed));
  EXPECT_TRUE(indexed.indexed);
  ASSERT_EQ(indexed.ends.size(), scanned.ends.size());
  for (size_t k = 0; k < scanned.ends.size(); ++k) {
    ASSERT_EQ(indexed.starts[k], scanned.starts[k] + added) << k;
    ASSERT_EQ(indexed.ends[k], scanned.ends[k] + added) << k;
  }
  EXPECT_FALSE(detail::add_segment_index(with_index.data(), with_index.size(), with_index))
      << "a file has one index";
  std::vector<uint8_t> a, b;
  detail::write_segment_jpeg(file.data(), scanned, 8, 20, 3, 17, a);
  detail::write_segment_jpeg(with_index.data(), indexed, 8, 20, 3, 17, b);
  EXPECT_EQ(a, b) << "the small JPEG leaves the index out";

  // Decoding through the index gives the pixels of the plain decode of the original file.
  DecodeOptions plain_options;
  plain_options.restart_segments = false;
  JpegDecoder plain({}, plain_options), cut;
  const DecodedImage expected =
      plain.decode_region(file.data(), file.size(), 100, 90, 200, 150, 224, 224);
  const std::vector<uint8_t> want = packed_rows(expected);
  const DecodedImage got =
      cut.decode_region(with_index.data(), with_index.size(), 100, 90, 200, 150, 224, 224);
  ASSERT_EQ(got.width, expected.width);
  ASSERT_EQ(got.height, expected.height);
  EXPECT_EQ(packed_rows(got), want);

  // Damage: every kind falls back to the scan, which finds the same intervals.
  const size_t body = scanned.sof_offset + 4;  // the index sits where the frame header was
  auto damaged = [&](size_t offset, uint8_t flip) {
    std::vector<uint8_t> f = with_index;
    f[offset] ^= flip;
    detail::SegmentLayout l;
    EXPECT_TRUE(detail::read_segment_layout(f.data(), f.size(), l)) << "offset " << offset;
    EXPECT_FALSE(l.indexed) << "offset " << offset;
    EXPECT_EQ(l.ends, indexed.ends) << "offset " << offset;
  };
  damaged(body + 18, 0x03);               // version 2: not recognised as an index
  damaged(body + 22, 0x07);               // the count
  damaged(body + 23 + 4 * 5 + 3, 0x01);   // one interval's end, off by a byte
  damaged(body + 23 + 4 * 95 + 2, 0x10);  // another, far off
}

// An index written by hand into `file`, before its frame header: the format of jpeg_segments.h,
// listing `lengths`.
std::vector<uint8_t> with_forged_index(const std::vector<uint8_t>& file, size_t sof_offset,
                                       const std::vector<uint32_t>& lengths) {
  static constexpr char kId[] = "CONVEYOR-SEGMENTS";
  std::vector<uint8_t> body(kId, kId + sizeof kId);
  body.push_back(1);  // version
  for (int shift = 24; shift >= 0; shift -= 8) {
    body.push_back(static_cast<uint8_t>(lengths.size() >> shift));
  }
  for (uint32_t length : lengths) {
    body.push_back(static_cast<uint8_t>(length >> 8));
    body.push_back(static_cast<uint8_t>(length));
  }
  std::vector<uint8_t> out(file.begin(), file.begin() + static_cast<long>(sof_offset));
  out.push_back(0xFF);
  out.push_back(0xEF);  // APP15
  out.push_back(static_cast<uint8_t>((body.size() + 2) >> 8));
  out.push_back(static_cast<uint8_t>(body.size() + 2));
  out.insert(out.end(), body.begin(), body.end());
  out.insert(out.end(), file.begin() + static_cast<long>(sof_offset), file.end());
  return out;
}

// A forged index (issue 29): the image's own data ends at its EOI, and bytes appended after it
// (which every other decoder ignores) carry another image's intervals with markers where an index
// says. The index's first interval runs from the scan's start over the real image and its EOI into
// the appended bytes, so its every marker is where it says, in order. Regions decoded from such a
// file have the pixels of the usual decode of it, the real image: the index is ignored for a scan.
TEST(JpegSegments, AnIndexIntoBytesAfterTheImageIsIgnored) {
  // Small enough that the first forged interval's length fits the index's 16 bits.
  const auto real = jpeg(256, 128, with_restarts(4), 1);
  const auto other = jpeg(256, 128, with_restarts(4), 2);  // the same tables
  detail::SegmentLayout r, o;
  ASSERT_TRUE(detail::read_segment_layout(real.data(), real.size(), r));
  ASSERT_TRUE(detail::read_segment_layout(other.data(), other.size(), o));
  ASSERT_EQ(r.ends.size(), o.ends.size());
  ASSERT_EQ(r.scan_data, o.scan_data);
  ASSERT_TRUE(
      std::equal(real.begin(), real.begin() + static_cast<long>(r.scan_data), other.begin()))
      << "the same headers and tables";
  ASSERT_LT(real.size() - r.scan_data, 0xFFFFu);

  // The real image, then RST0 and the other image's intervals 1.. with their markers and EOI.
  std::vector<uint8_t> appended = real;
  appended.push_back(0xFF);
  appended.push_back(0xD0);
  std::vector<uint32_t> lengths = {static_cast<uint32_t>(real.size() - r.scan_data)};
  for (size_t k = 1; k < o.ends.size(); ++k) {
    appended.insert(appended.end(), other.begin() + o.starts[k], other.begin() + o.ends[k] + 2);
    lengths.push_back(o.ends[k] - o.starts[k]);
  }
  const auto forged = with_forged_index(appended, r.sof_offset, lengths);

  detail::SegmentLayout l;
  ASSERT_TRUE(detail::read_segment_layout(forged.data(), forged.size(), l));
  EXPECT_FALSE(l.indexed) << "the index's first interval holds the image's markers and EOI";
  const auto shift = static_cast<uint32_t>(forged.size() - appended.size());
  std::vector<uint32_t> real_ends = r.ends;
  for (uint32_t& end : real_ends) end += shift;
  EXPECT_EQ(l.ends, real_ends) << "the scan's intervals: the real image's";

  // The same index over the other image's own intervals is a true one, and is used: the check
  // refuses the forgery, not the format.
  std::vector<uint32_t> true_lengths;
  for (size_t k = 0; k < o.ends.size(); ++k) true_lengths.push_back(o.ends[k] - o.starts[k]);
  const auto honest = with_forged_index(other, o.sof_offset, true_lengths);
  ASSERT_TRUE(detail::read_segment_layout(honest.data(), honest.size(), l));
  EXPECT_TRUE(l.indexed);

  // Every box below the first interval's row: through the forged index these would be cut from
  // the other image.
  DecodeOptions plain_options;
  plain_options.restart_segments = false;
  JpegDecoder plain({}, plain_options), cut;
  const int boxes[][4] = {{0, 16, 256, 112}, {64, 40, 100, 60}, {200, 100, 56, 28}};
  for (const auto& b : boxes) {
    const DecodedImage expected =
        plain.decode_region(forged.data(), forged.size(), b[0], b[1], b[2], b[3], b[2], b[3]);
    const std::vector<uint8_t> want = packed_rows(expected);
    const DecodedImage got =
        cut.decode_region(forged.data(), forged.size(), b[0], b[1], b[2], b[3], b[2], b[3]);
    ASSERT_EQ(got.width, expected.width);
    ASSERT_EQ(got.height, expected.height);
    EXPECT_EQ(packed_rows(got), want) << "box " << b[0] << "," << b[1];
  }

  // Markers that are not where the index says: the appended intervals numbered from RST1, one
  // off from what the index's order asks.
  std::vector<uint8_t> misnumbered = appended;
  for (size_t i = real.size(); i + 1 < misnumbered.size(); ++i) {
    if (misnumbered[i] == 0xFF && misnumbered[i + 1] >= 0xD0 && misnumbered[i + 1] <= 0xD7) {
      misnumbered[i + 1] = static_cast<uint8_t>(0xD0 + (misnumbered[i + 1] - 0xD0 + 1) % 8);
    }
  }
  const auto misplaced = with_forged_index(misnumbered, r.sof_offset, lengths);
  ASSERT_TRUE(detail::read_segment_layout(misplaced.data(), misplaced.size(), l));
  EXPECT_FALSE(l.indexed);
  ASSERT_EQ(l.ends.size(), r.ends.size());
}

}  // namespace
}  // namespace conveyor
