// Image outputs other than RGB uint8 (ImageOutput, conveyor/fields.h; issue 32): RGBA, L and
// uint16 rows of the PNG corpus of tests/png_writer.h (every colour type, 8 and 16 bits,
// interlaced, tRNS) and of libwebp's files equal a plain reference exactly, for many random
// (seed, index) crops: libpng's (libwebp's) full decode with alpha and 16 bits kept, converted to
// the mode (Pillow's L), then the same crop box (choose_crop), the same libyuv bilinear filter
// and the mirror. JPEG (no alpha, 8 bits, DCT scaling): RGBA's R, G, B are the RGB rows and A is
// 255; uint16 is the uint8 row times 257; L is the RGB row's L within a stated tolerance. The
// fields' layout, the parse of a mode's name, and views refused with a mode.
#include <gtest/gtest.h>

#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <libyuv.h>

#include "codec/image_codec.h"
#include "conveyor/datasets.h"
#include "conveyor/image_plan.h"
#include "png_reference.h"
#include "png_writer.h"
#include "webp_reference.h"

namespace conveyor {
namespace {

using testing::make_png;
using testing::PngFile;
using testing::PngSpec;

// A full decode as RGBA samples at the file's depth (8 or 16; a palette's, or gray below 8 bits,
// expanded to 8), tRNS as alpha, 255 (65535) where the file has no alpha.
struct Rgba {
  int width = 0, height = 0, depth = 8;
  bool alpha = false;             // the file has alpha (an alpha channel, tRNS)
  std::vector<uint16_t> samples;  // height x width x 4
};

Rgba libpng_rgba(const std::vector<uint8_t>& file) {
  testing::LibpngRead r;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  r.info = png_create_info_struct(r.png);
  testing::Source source{&file, 0};
  Rgba out;
  std::vector<uint8_t> decoded;
  std::vector<png_bytep> rows;
  if (setjmp(png_jmpbuf(r.png))) throw std::runtime_error("libpng refuses the file");
  png_set_read_fn(r.png, &source, testing::read_from);
  png_read_info(r.png, r.info);
  out.width = static_cast<int>(png_get_image_width(r.png, r.info));
  out.height = static_cast<int>(png_get_image_height(r.png, r.info));
  out.depth = png_get_bit_depth(r.png, r.info) == 16 ? 16 : 8;
  out.alpha = (png_get_color_type(r.png, r.info) & PNG_COLOR_MASK_ALPHA) != 0 ||
              png_get_valid(r.png, r.info, PNG_INFO_tRNS) != 0;
  png_set_expand(r.png);  // palette to RGB, gray below 8 bits to 8, tRNS to alpha
  png_set_gray_to_rgb(r.png);
  png_set_add_alpha(r.png, 0xffff, PNG_FILLER_AFTER);  // only where no alpha came
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  const size_t row_bytes = png_get_rowbytes(r.png, r.info);
  decoded.resize(row_bytes * static_cast<size_t>(out.height));
  rows.resize(static_cast<size_t>(out.height));
  for (int y = 0; y < out.height; ++y) rows[static_cast<size_t>(y)] = &decoded[row_bytes * y];
  png_read_image(r.png, rows.data());
  const size_t n = static_cast<size_t>(out.width) * out.height * 4;
  out.samples.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out.samples[i] = out.depth == 16
                         ? static_cast<uint16_t>(decoded[2 * i] << 8 | decoded[2 * i + 1])
                         : decoded[i];
  }
  return out;
}

Rgba webp_rgba(const testing::WebpFile& f) {
  const testing::Reference ref = testing::webp_reference(f);
  Rgba out;
  out.width = ref.width;
  out.height = ref.height;
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(f.bytes.data(), f.bytes.size(), &features) != VP8_STATUS_OK) {
    throw std::runtime_error("libwebp refuses " + f.name);
  }
  out.alpha = features.has_alpha != 0;
  out.samples.assign(ref.rgbx.begin(), ref.rgbx.end());
  return out;
}

uint16_t gray_of(uint64_t r, uint64_t g, uint64_t b) {  // Pillow's L, at 8 or 16 bits
  return static_cast<uint16_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

// What ImageWriter(t, output) must write for `ref`: the mode's planes of the full decode (8-bit
// samples rounded from 16 as the RGB path rounds them unless 16 bits are kept), choose_crop's
// box cut, libyuv's bilinear filter (ARGBScale for 8 bits, L included, as the RGB path's;
// ScalePlane_16 for 16-bit samples), mirrored, laid out, an 8-bit value v as v * 257 in uint16;
// the alpha of a file without one is 255 (65535), not the filter's output of 255s (ARGBScale
// makes 253 of some).
std::vector<uint16_t> expected_samples(const Rgba& ref, const ImageTransform& t,
                                       const ImageOutput& output, const SampleContext& ctx) {
  const CropBox box = choose_crop(t, ref.width, ref.height, ctx.seed, ctx.epoch, ctx.index);
  const int side = t.size;
  const size_t area = static_cast<size_t>(side) * side;
  const size_t full = static_cast<size_t>(ref.width) * ref.height;
  const int channels = output.channels();
  const bool keep16 = ref.depth == 16 && output.dtype == c10::ScalarType::UInt16;
  const bool is_l = output.mode == ImageOutput::Mode::kL;
  const auto sample = [&](size_t p, int c) -> uint16_t {
    const uint16_t v = ref.samples[p * 4 + static_cast<size_t>(c)];
    return ref.depth == 16 && !keep16 ? static_cast<uint16_t>((v * 255u + 32767u) / 65535u) : v;
  };
  std::vector<std::vector<uint16_t>> planes(static_cast<size_t>(channels),
                                            std::vector<uint16_t>(area));
  if (!keep16) {
    std::vector<uint8_t> rgbx(full * 4), scaled(area * 4);
    for (size_t p = 0; p < full; ++p) {
      for (int c = 0; c < 4; ++c) {
        rgbx[p * 4 + c] = static_cast<uint8_t>(
            is_l ? gray_of(sample(p, 0), sample(p, 1), sample(p, 2)) : sample(p, c));
      }
    }
    const uint8_t* from = rgbx.data() + (static_cast<size_t>(box.y) * ref.width + box.x) * 4;
    libyuv::ARGBScale(from, ref.width * 4, box.width, box.height, scaled.data(), side * 4, side,
                      side, libyuv::kFilterBilinear);
    for (size_t p = 0; p < area; ++p) {
      for (int c = 0; c < channels; ++c) {
        planes[c][p] = c == 3 && !ref.alpha ? 255 : scaled[p * 4 + static_cast<size_t>(c)];
      }
    }
  } else {
    for (int c = 0; c < channels; ++c) {
      std::vector<uint16_t> plane(full);
      for (size_t p = 0; p < full; ++p) {
        plane[p] = is_l ? gray_of(sample(p, 0), sample(p, 1), sample(p, 2)) : sample(p, c);
      }
      const size_t at = static_cast<size_t>(box.y) * ref.width + box.x;
      libyuv::ScalePlane_16(plane.data() + at, ref.width, box.width, box.height, planes[c].data(),
                            side, side, side, libyuv::kFilterBilinear);
      if (c == 3 && !ref.alpha) std::fill(planes[c].begin(), planes[c].end(), 65535);
    }
  }
  std::vector<uint16_t> row(area * static_cast<size_t>(channels));
  for (int y = 0; y < side; ++y) {
    for (int x = 0; x < side; ++x) {
      const size_t p = static_cast<size_t>(y) * side + (box.flip ? side - 1 - x : x);
      const size_t q = static_cast<size_t>(y) * side + x;
      for (int c = 0; c < channels; ++c) {
        uint16_t v = planes[c][p];
        if (output.dtype == c10::ScalarType::UInt16 && !keep16) v = static_cast<uint16_t>(v * 257);
        row[t.layout == ImageLayout::kHWC ? q * channels + c : c * area + q] = v;
      }
    }
  }
  return row;
}

// Where two rows first differ, for a failure's message.
std::string first_difference(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  if (got.size() != want.size()) {
    return "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return "sample " + std::to_string(i) + " of " + std::to_string(got.size()) + ": " +
             std::to_string(got[i]) + " vs " + std::to_string(want[i]);
    }
  }
  return "none";
}

// ImageWriter's row as samples (uint8 or uint16).
std::vector<uint16_t> written(ImageWriter& writer, const ImageOutput& output,
                              const std::vector<uint8_t>& file, const SampleContext& ctx) {
  const size_t side = static_cast<size_t>(writer.transform().size);
  const size_t n = side * side * static_cast<size_t>(output.channels());
  const bool wide = output.dtype == c10::ScalarType::UInt16;
  std::vector<uint8_t> bytes(n * (wide ? 2 : 1));
  writer.write(file.data(), file.size(), ctx, reinterpret_cast<std::byte*>(bytes.data()));
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (wide) {
      std::memcpy(&out[i], bytes.data() + 2 * i, 2);
    } else {
      out[i] = bytes[i];
    }
  }
  return out;
}

ImageOutput output_of(ImageOutput::Mode mode, c10::ScalarType dtype) {
  ImageOutput o;
  o.mode = mode;
  o.dtype = dtype;
  return o;
}

// Every output but the default, each with the transforms below (CHW and HWC, flips).
std::vector<ImageOutput> outputs() {
  std::vector<ImageOutput> out;
  for (ImageOutput::Mode m :
       {ImageOutput::Mode::kRGB, ImageOutput::Mode::kRGBA, ImageOutput::Mode::kL}) {
    for (c10::ScalarType d : {c10::ScalarType::Byte, c10::ScalarType::UInt16}) {
      if (m != ImageOutput::Mode::kRGB || d != c10::ScalarType::Byte)
        out.push_back(output_of(m, d));
    }
  }
  return out;
}

std::vector<ImageTransform> transforms() {
  ImageTransform train = ImageTransform::train(7);
  ImageTransform eval = ImageTransform::eval(12, 14);
  eval.layout = ImageLayout::kHWC;
  ImageTransform whole = ImageTransform::train(16);
  whole.mode = ImageTransform::Mode::kResize;
  return {train, eval, whole};
}

std::vector<PngFile> png_corpus() {
  const int sizes[][2] = {{1, 1}, {9, 1}, {5, 3}, {17, 13}, {33, 31}, {64, 41}};
  return testing::png_corpus(sizes, 2);
}

TEST(ImageModes, EveryPngKindMatchesLibpngThenTheSameCropResizeAndFlip) {
  const std::vector<PngFile> files = png_corpus();
  size_t compared = 0, flipped = 0, with_trns = 0, alpha_below_255 = 0;
  for (const ImageOutput& output : outputs()) {
    std::vector<ImageWriter> writers;
    for (const ImageTransform& t : transforms()) writers.emplace_back(t, output);
    for (const PngFile& f : files) {
      const Rgba ref = libpng_rgba(f.bytes);
      ASSERT_EQ(ref.width, f.spec.width);
      with_trns += f.spec.transparency;
      for (ImageWriter& writer : writers) {
        for (size_t index = 0; index < 5; ++index) {
          const SampleContext ctx{0, index, 101 + index * 7 + f.bytes.size(), index % 2};
          const std::vector<uint16_t> got = written(writer, output, f.bytes, ctx);
          const std::vector<uint16_t> want = expected_samples(ref, writer.transform(), output, ctx);
          ASSERT_TRUE(got == want)
              << first_difference(got, want) << ": " << testing::describe(f.spec) << ", mode "
              << ImageOutput::mode_name(output.mode) << " " << c10::toString(output.dtype)
              << ", size " << writer.transform().size << ", index " << index;
          ++compared;
          flipped +=
              choose_crop(writer.transform(), ref.width, ref.height, ctx.seed, ctx.epoch, ctx.index)
                  .flip;
          if (output.mode == ImageOutput::Mode::kRGBA && output.dtype == c10::ScalarType::Byte) {
            const size_t area = static_cast<size_t>(writer.transform().size) *
                                static_cast<size_t>(writer.transform().size);
            const bool hwc = writer.transform().layout == ImageLayout::kHWC;
            for (size_t p = 0; p < area; ++p) {
              alpha_below_255 += got[hwc ? p * 4 + 3 : 3 * area + p] < 255;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, outputs().size() * files.size() * 3 * 5);
  EXPECT_GT(flipped, compared / 8);
  EXPECT_GT(with_trns, 0u);
  EXPECT_GT(alpha_below_255, 1000u);  // the alpha is the files', not 255
}

TEST(ImageModes, WebpMatchesLibwebpThenTheSameCropResizeAndFlip) {
  const int sizes[][2] = {{1, 1}, {7, 5}, {31, 17}, {64, 48}};
  const std::vector<testing::WebpFile> files = testing::encoded_webps(sizes, 5);
  size_t compared = 0;
  for (const ImageOutput& output : outputs()) {
    std::vector<ImageWriter> writers;
    for (const ImageTransform& t : transforms()) writers.emplace_back(t, output);
    for (const testing::WebpFile& f : files) {
      const Rgba ref = webp_rgba(f);
      for (ImageWriter& writer : writers) {
        for (size_t index = 0; index < 8; ++index) {
          const SampleContext ctx{0, index, 7 + index, index % 3};
          const std::vector<uint16_t> got = written(writer, output, f.bytes, ctx);
          const std::vector<uint16_t> want = expected_samples(ref, writer.transform(), output, ctx);
          ASSERT_TRUE(got == want) << first_difference(got, want) << ": " << f.name << ", mode "
                                   << ImageOutput::mode_name(output.mode) << " "
                                   << c10::toString(output.dtype) << ", index " << index;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, outputs().size() * files.size() * 3 * 8);
}

// The channels the RGB row shares with another output's row, sample by sample: `rgb` (uint8,
// 3 channels) against `other` (its mode's channels), by the layout.
uint16_t rgb_sample(const std::vector<uint16_t>& rgb, size_t area, bool hwc, size_t p, int c) {
  return rgb[hwc ? p * 3 + static_cast<size_t>(c) : static_cast<size_t>(c) * area + p];
}

TEST(ImageModes, JpegRgbaIsTheRgbRowWithOpaqueAlphaAndLIsItsGrayWithinTwo) {
  std::mt19937 rng(3);
  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  for (int i = 0; i < 12; ++i) {
    const int w = 8 + static_cast<int>(rng() % 200), h = 8 + static_cast<int>(rng() % 150);
    const std::vector<uint8_t> rgb = [&] {
      std::vector<uint8_t> p = testing::photo_pixels(w, h, 3, rng());
      return p;
    }();
    EncodeOptions o;
    o.color = i % 4 == 0   ? EncodeOptions::Color::kGray
              : i % 4 == 1 ? EncodeOptions::Color::kCmyk
                           : EncodeOptions::Color::kYCbCr;
    o.orientation = i % 3 == 0 ? 1 + i % 8 : 0;
    o.progressive = i % 5 == 0;
    files.emplace_back("jpeg " + std::to_string(i) + (i % 4 == 0 ? " gray" : ""),
                       encode_jpeg(rgb.data(), w, h, o));
  }
  std::vector<ImageTransform> ts = transforms();
  ts.push_back(ImageTransform::train(64));  // DCT scaling below 8/8
  for (ImageTransform& t : ts) t.exif_orientation = true;
  int worst_gray = 0;
  size_t compared = 0, gray_compared = 0;
  for (const ImageTransform& t : ts) {
    ImageWriter rgb_writer(t);
    const ImageOutput rgba = output_of(ImageOutput::Mode::kRGBA, c10::ScalarType::Byte);
    const ImageOutput gray = output_of(ImageOutput::Mode::kL, c10::ScalarType::Byte);
    ImageWriter rgba_writer(t, rgba), gray_writer(t, gray);
    const size_t area = static_cast<size_t>(t.size) * static_cast<size_t>(t.size);
    const bool hwc = t.layout == ImageLayout::kHWC;
    for (const auto& [name, file] : files) {
      for (size_t index = 0; index < 10; ++index) {
        const SampleContext ctx{0, index, 29 + index, index % 2};
        const std::vector<uint16_t> rgb = written(rgb_writer, ImageOutput{}, file, ctx);
        const std::vector<uint16_t> with_alpha = written(rgba_writer, rgba, file, ctx);
        const std::vector<uint16_t> l = written(gray_writer, gray, file, ctx);
        for (size_t p = 0; p < area; ++p) {
          for (int c = 0; c < 3; ++c) {
            ASSERT_EQ(with_alpha[hwc ? p * 4 + c : c * area + p], rgb_sample(rgb, area, hwc, p, c))
                << name << " index " << index;
          }
          ASSERT_EQ(with_alpha[hwc ? p * 4 + 3 : 3 * area + p], 255) << name;
          // L is converted before the resize, the RGB row's L after it: two roundings (the
          // conversion's and the filter's) apart at most. A gray file's L is its RGB row's.
          const int after =
              gray_of(rgb_sample(rgb, area, hwc, p, 0), rgb_sample(rgb, area, hwc, p, 1),
                      rgb_sample(rgb, area, hwc, p, 2));
          worst_gray = std::max(worst_gray, std::abs(static_cast<int>(l[p]) - after));
          if (name.back() == 'y') {
            ASSERT_EQ(l[p], rgb_sample(rgb, area, hwc, p, 0)) << name << " index " << index;
            ++gray_compared;
          }
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, ts.size() * files.size() * 10);
  EXPECT_LE(worst_gray, 2);
  EXPECT_GT(gray_compared, 1000u);
  std::cout << "JPEG: L before the resize vs the RGB row's L, largest difference " << worst_gray
            << "\n";
}

TEST(ImageModes, Uint16IsTheUint8RowTimes257ForEightBitFiles) {
  const std::vector<PngFile> files = png_corpus();
  std::mt19937 rng(9);
  std::vector<std::vector<uint8_t>> eight_bit;
  for (const PngFile& f : files) {
    if (f.spec.bit_depth <= 8) eight_bit.push_back(f.bytes);
  }
  const std::vector<uint8_t> rgb = testing::photo_pixels(40, 30, 3, 4);
  eight_bit.push_back(encode_jpeg(rgb.data(), 40, 30, 90));
  for (ImageOutput::Mode m :
       {ImageOutput::Mode::kRGB, ImageOutput::Mode::kRGBA, ImageOutput::Mode::kL}) {
    for (const ImageTransform& t : transforms()) {
      ImageWriter narrow(t, output_of(m, c10::ScalarType::Byte));
      ImageWriter wide(t, output_of(m, c10::ScalarType::UInt16));
      for (const std::vector<uint8_t>& file : eight_bit) {
        const SampleContext ctx{0, rng() % 1000, rng(), 0};
        std::vector<uint16_t> expected =
            written(narrow, output_of(m, c10::ScalarType::Byte), file, ctx);
        for (uint16_t& v : expected) v = static_cast<uint16_t>(v * 257);
        ASSERT_EQ(written(wide, output_of(m, c10::ScalarType::UInt16), file, ctx), expected);
      }
    }
  }
}

// A 16-bit file's uint16 rows (resized in 16 bits by ScalePlane_16) rounded to 8 bits are its
// uint8 rows (rounded to 8 bits, then resized by ARGBScale) within a stated tolerance of 3: the
// same box and sampling positions, two filters' roundings apart (ARGBScale's bilinear filter
// alone makes 253 of a constant 255 in places).
TEST(ImageModes, SixteenBitRowsRoundedAreTheEightBitRowsWithinThree) {
  int worst = 0;
  size_t compared = 0;
  for (const PngFile& f : png_corpus()) {
    if (f.spec.bit_depth != 16) continue;
    for (ImageOutput::Mode m :
         {ImageOutput::Mode::kRGB, ImageOutput::Mode::kRGBA, ImageOutput::Mode::kL}) {
      for (const ImageTransform& t : transforms()) {
        const ImageOutput narrow = output_of(m, c10::ScalarType::Byte);
        const ImageOutput wide = output_of(m, c10::ScalarType::UInt16);
        ImageWriter narrow_writer(t, narrow), wide_writer(t, wide);
        for (size_t index = 0; index < 4; ++index) {
          const SampleContext ctx{0, index, 5 + index, 0};
          const std::vector<uint16_t> a = written(narrow_writer, narrow, f.bytes, ctx);
          const std::vector<uint16_t> b = written(wide_writer, wide, f.bytes, ctx);
          ASSERT_EQ(a.size(), b.size());
          for (size_t i = 0; i < a.size(); ++i) {
            const int rounded = static_cast<int>((b[i] * 255u + 32767u) / 65535u);
            worst = std::max(worst, std::abs(rounded - static_cast<int>(a[i])));
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 100u);
  EXPECT_LE(worst, 3);
  std::cout << "16-bit rows rounded vs 8-bit rows: largest difference " << worst << "\n";
}

// A 16-bit gray file's own samples in L uint16, and a palette's tRNS as alpha, where no resize
// and no flip intervene: the file's values themselves.
TEST(ImageModes, SixteenBitGrayAndPaletteAlphaComeOutAsTheFileHoldsThem) {
  PngSpec gray;
  gray.width = gray.height = 12;
  gray.color_type = 0;
  gray.bit_depth = 16;
  const PngFile g = make_png(gray, 77);
  ImageTransform same = ImageTransform::train(12);
  same.mode = ImageTransform::Mode::kResize;
  same.flip_probability = 0;
  const ImageOutput l16 = output_of(ImageOutput::Mode::kL, c10::ScalarType::UInt16);
  ImageWriter writer(same, l16);
  const std::vector<uint16_t> got = written(writer, l16, g.bytes, SampleContext{});
  ASSERT_EQ(got.size(), g.samples.size());
  EXPECT_EQ(got, g.samples);
  EXPECT_GT(*std::max_element(got.begin(), got.end()), 255);

  PngSpec palette = gray;
  palette.color_type = 3;
  palette.bit_depth = 8;
  palette.transparency = true;
  const PngFile p = make_png(palette, 78);
  const ImageOutput rgba = output_of(ImageOutput::Mode::kRGBA, c10::ScalarType::Byte);
  ImageWriter rgba_writer(same, rgba);
  const std::vector<uint16_t> alpha = written(rgba_writer, rgba, p.bytes, SampleContext{});
  const Rgba ref = libpng_rgba(p.bytes);
  size_t transparent = 0;
  for (size_t i = 0; i < 144; ++i) {
    EXPECT_EQ(alpha[3 * 144 + i], ref.samples[i * 4 + 3]);
    transparent += ref.samples[i * 4 + 3] < 255;
  }
  EXPECT_GT(transparent, 0u);
}

TEST(ImageModes, FieldsLayOutTheChannelsAndDtypeAndRefuseViewsWithAMode) {
  ImageTransform t = ImageTransform::train(32);
  const Field rgba =
      Field::image("png", t, output_of(ImageOutput::Mode::kRGBA, c10::ScalarType::UInt16));
  const FieldSpec s = rgba.spec("image");
  EXPECT_EQ(s.dtype, c10::ScalarType::UInt16);
  EXPECT_EQ(s.sample_shape, (std::vector<int64_t>{4, 32, 32}));
  t.layout = ImageLayout::kHWC;
  const Field l = Field::image("png", t, output_of(ImageOutput::Mode::kL, c10::ScalarType::Byte));
  EXPECT_EQ(l.spec("gray").sample_shape, (std::vector<int64_t>{32, 32, 1}));
  EXPECT_EQ(Field::image("png", t).spec("rgb").sample_shape, (std::vector<int64_t>{32, 32, 3}));

  Field bad = rgba;
  bad.output.dtype = c10::ScalarType::Int;
  try {
    bad.spec("picture");
    FAIL() << "an int32 image was laid out";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"picture\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uint8 or uint16"), std::string::npos) << e.what();
  }

  Field views = rgba;
  ViewGroup group;
  group.name = "global";
  group.count = 2;
  group.transform = ImageTransform::train(16);
  views.transform.views = {group};
  try {
    views.specs("picture");
    FAIL() << "views with mode RGBA were laid out";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"picture\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("views"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("RGBA"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ImageWriter(views.transform, views.output), std::invalid_argument);
  Field plain_views = views;
  plain_views.output = ImageOutput{};
  EXPECT_EQ(plain_views.specs("picture").size(), 1u);
}

// Samples of one PNG member each, "png", and a gray mask of the same size, "mask".
class PngReader final : public MemberReader {
 public:
  explicit PngReader(std::vector<PngFile> files) : files_(std::move(files)) {
    for (const PngFile& f : files_) {
      PngSpec mask = f.spec;
      mask.color_type = 0;
      mask.bit_depth = 8;
      mask.transparency = false;
      masks_.push_back(make_png(mask, 5).bytes);
    }
  }
  size_t size() const override { return files_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    const PngFile& f = files_.at(ctx.index);
    out.add_bytes("png", f.bytes.data(), f.bytes.size());
    out.add_bytes("mask", masks_[ctx.index].data(), masks_[ctx.index].size());
  }

 private:
  std::vector<PngFile> files_;
  std::vector<std::vector<uint8_t>> masks_;
};

// Through a FieldSource: the rows are ImageWriter's, the image is left to the CPU (no GPU
// decode of another output), and a mask follows an RGBA uint16 image as it follows the RGB one.
TEST(ImageModes, AFieldSourceWritesTheModeOnTheCpuAndAMaskFollowsItAlike) {
  std::vector<PngFile> files;
  for (const PngFile& f : png_corpus()) {
    if (f.spec.width >= 17) files.push_back(f);
  }
  const ImageTransform t = ImageTransform::train(9);
  const ImageOutput rgba16 = output_of(ImageOutput::Mode::kRGBA, c10::ScalarType::UInt16);
  const auto reader = std::make_shared<PngReader>(files);
  auto plain = FieldSource::from_reader(reader, {{"image", Field::image("png", t)}});
  EXPECT_TRUE(plain->encoded_image_field().has_value());
  auto moded = FieldSource::from_reader(
      reader, {{"mask", Field::mask("mask")}, {"image", Field::image("png", t, rgba16)}});
  auto rgb = FieldSource::from_reader(
      reader, {{"mask", Field::mask("mask")}, {"image", Field::image("png", t)}});
  EXPECT_FALSE(moded->encoded_image_field().has_value());
  auto alone = FieldSource::from_reader(reader, {{"image", Field::image("png", t, rgba16)}});
  EXPECT_FALSE(alone->encoded_image_field().has_value());
  const std::vector<FieldSpec> specs = moded->fields();
  ASSERT_EQ(specs[1].dtype, c10::ScalarType::UInt16);
  ASSERT_EQ(specs[1].sample_shape, (std::vector<int64_t>{4, 9, 9}));
  moded->prepare(1);
  rgb->prepare(1);
  ImageWriter writer(t, rgba16);
  std::vector<std::byte> mask(specs[0].sample_bytes()), image(specs[1].sample_bytes());
  std::vector<std::byte> rgb_mask(mask.size()), rgb_image(9 * 9 * 3);
  for (size_t i = 0; i < files.size(); ++i) {
    const SampleContext ctx{0, i, 41, i % 3};
    std::byte* rows[] = {mask.data(), image.data()};
    moded->write_sample(ctx, rows);
    std::byte* rgb_rows[] = {rgb_mask.data(), rgb_image.data()};
    rgb->write_sample(ctx, rgb_rows);
    const std::vector<uint16_t> want = written(writer, rgba16, files[i].bytes, ctx);
    ASSERT_EQ(std::memcmp(image.data(), want.data(), image.size()), 0) << i;
    ASSERT_EQ(mask, rgb_mask) << i;
  }
}

TEST(ImageModes, ModeNamesAreReadInOnePlace) {
  EXPECT_EQ(ImageOutput::parse_mode("RGB"), ImageOutput::Mode::kRGB);
  EXPECT_EQ(ImageOutput::parse_mode("RGBA"), ImageOutput::Mode::kRGBA);
  EXPECT_EQ(ImageOutput::parse_mode("L"), ImageOutput::Mode::kL);
  for (ImageOutput::Mode m :
       {ImageOutput::Mode::kRGB, ImageOutput::Mode::kRGBA, ImageOutput::Mode::kL}) {
    EXPECT_EQ(ImageOutput::parse_mode(ImageOutput::mode_name(m)), m);
  }
  try {
    ImageOutput::parse_mode("rgba");
    FAIL() << "\"rgba\" was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"RGB\", \"RGBA\", \"L\""), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("\"rgba\""), std::string::npos) << e.what();
  }
  EXPECT_EQ(ImageOutput{}.channels(), 3);
  EXPECT_TRUE(ImageOutput{}.is_default());
}

}  // namespace
}  // namespace conveyor
