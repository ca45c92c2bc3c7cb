// JpegDecoder against libjpeg-turbo's own TurboJPEG decode, and every kind of bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <jpeglib.h>
#include <turbojpeg.h>

#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "many_scans_jpeg.h"
#include "test_support.h"

namespace conveyor {
namespace {

struct Reference {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // RGB, or CMYK when asked
};

Reference tj_decode(const std::vector<uint8_t>& jpeg, int pixel_format = TJPF_RGB,
                    int scaled_width = 0) {
  tjhandle h = tjInitDecompress();
  int w = 0, hh = 0, sub = 0, cs = 0;
  EXPECT_EQ(tjDecompressHeader3(h, jpeg.data(), jpeg.size(), &w, &hh, &sub, &cs), 0);
  Reference r;
  int out_w = scaled_width != 0 ? scaled_width : w;
  int out_h = scaled_width != 0 ? (hh * scaled_width + w - 1) / w : hh;
  // TurboJPEG picks the scaling factor from the requested size; ask for exact M/8 sizes.
  r.width = out_w;
  r.height = out_h;
  const int ps = tjPixelSize[pixel_format];
  r.pixels.resize(static_cast<size_t>(out_w) * out_h * ps);
  EXPECT_EQ(
      tjDecompress2(h, jpeg.data(), jpeg.size(), r.pixels.data(), out_w, 0, out_h, pixel_format, 0),
      0)
      << tjGetErrorStr2(h);
  tjDestroy(h);
  return r;
}

std::vector<uint8_t> tj_encode(const std::vector<uint8_t>& pixels, int w, int h, int pixel_format,
                               int subsampling, int flags) {
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(handle, pixels.data(), w, 0, h, pixel_format, &out, &size, subsampling, 90,
                        flags),
            0)
      << tjGetErrorStr2(handle);
  std::vector<uint8_t> v(out, out + size);
  tjFree(out);
  tjDestroy(handle);
  return v;
}

// Encodes with libjpeg's own compression API, for what TurboJPEG cannot write: arithmetic coding,
// restart markers, plain CMYK, APP1 markers. `setup` runs after the defaults are set; `markers`
// after jpeg_start_compress.
std::vector<uint8_t> lib_encode(const std::vector<uint8_t>& pixels, int w, int h,
                                J_COLOR_SPACE in_space, int components,
                                const std::function<void(jpeg_compress_struct&)>& setup,
                                const std::function<void(jpeg_compress_struct&)>& markers = {}) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = components;
  cinfo.in_color_space = in_space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  setup(cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  if (markers) markers(cinfo);
  const size_t row_bytes = static_cast<size_t>(w) * static_cast<size_t>(components);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) + cinfo.next_scanline * row_bytes;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> v(out, out + size);
  std::free(out);
  return v;
}

// An APP1 Exif payload whose IFD0 holds only the orientation tag, in either byte order.
std::vector<uint8_t> exif_payload(int orientation, bool big_endian) {
  std::vector<uint8_t> p = {'E', 'x', 'i', 'f', 0, 0};
  auto u16 = [&](unsigned v) {
    if (big_endian) {
      p.push_back(static_cast<uint8_t>(v >> 8));
      p.push_back(static_cast<uint8_t>(v));
    } else {
      p.push_back(static_cast<uint8_t>(v));
      p.push_back(static_cast<uint8_t>(v >> 8));
    }
  };
  auto u32 = [&](unsigned v) {
    if (big_endian) {
      u16(v >> 16);
      u16(v & 0xFFFF);
    } else {
      u16(v & 0xFFFF);
      u16(v >> 16);
    }
  };
  p.push_back(big_endian ? 'M' : 'I');
  p.push_back(big_endian ? 'M' : 'I');
  u16(42);
  u32(8);       // IFD0 right after the TIFF header
  u16(2);       // two entries: an unrelated one first
  u16(0x010F);  // Make, ASCII, 4 bytes inline
  u16(2);
  u32(4);
  p.insert(p.end(), {'A', 'B', 'C', 0});
  u16(0x0112);  // Orientation, SHORT, 1 value
  u16(3);
  u32(1);
  u16(static_cast<unsigned>(orientation));
  u16(0);
  u32(0);  // no next IFD
  return p;
}

std::vector<uint8_t> photo_rgb(int w, int h, uint64_t seed) {
  JpegDecoder d;
  auto jpeg = make_photo_jpeg(w, h, seed);
  DecodedImage img = d.decode(jpeg.data(), jpeg.size());
  std::vector<uint8_t> rgb;
  for (int y = 0; y < img.height; ++y) {
    rgb.insert(rgb.end(), img.pixels + y * img.stride, img.pixels + y * img.stride + 3 * img.width);
  }
  return rgb;
}

double mean_abs_diff(const DecodedImage& img, const Reference& ref, int ref_x, int ref_y) {
  double sum = 0;
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width * 3; ++x) {
      int a = img.pixels[y * img.stride + x];
      int b = ref.pixels[(static_cast<size_t>(ref_y + y) * ref.width + ref_x) * 3 + x];
      sum += std::abs(a - b);
    }
  }
  return sum / (img.width * img.height * 3.0);
}

TEST(JpegDecoder, FullDecodeEqualsTurboJpeg) {
  auto jpeg = make_photo_jpeg(500, 375, 7);
  JpegDecoder d;
  JpegHeader header = d.read_header(jpeg.data(), jpeg.size());
  EXPECT_EQ(header.width, 500);
  EXPECT_EQ(header.height, 375);
  EXPECT_EQ(header.color_space, "ycbcr");
  DecodedImage img = d.decode(jpeg.data(), jpeg.size());
  ASSERT_EQ(img.width, 500);
  ASSERT_EQ(img.height, 375);
  EXPECT_EQ(img.scale, 8);
  EXPECT_EQ(mean_abs_diff(img, tj_decode(jpeg), 0, 0), 0.0);
}

TEST(JpegDecoder, PhotoLikeImagesAreAsLargeAsPhotos) {
  // ImageNet averages about 110 kB at 500x375; the generator must not produce smooth images.
  size_t total = 0;
  for (uint64_t s = 0; s < 8; ++s) total += make_photo_jpeg(500, 375, s).size();
  EXPECT_GT(total / 8, 70'000u);
  EXPECT_LT(total / 8, 200'000u);
}

// DecodeOptions::dct_scales limits the scales: full scale only, or a chosen set (8/8 always).
TEST(JpegDecoder, TheDctScaleMaskLimitsTheScalesADecodeMayUse) {
  auto jpeg = make_photo_jpeg(480, 360, 13);
  DecodeOptions full_only;
  full_only.dct_scales = kFullDctScale;
  JpegDecoder full({}, full_only);
  DecodedImage img = full.decode_region(jpeg.data(), jpeg.size(), 0, 0, 480, 360, 60, 45);
  EXPECT_EQ(img.scale, 8) << "1/8 would cover 60x45, but only 8/8 is allowed";
  EXPECT_EQ(img.width, 480);
  DecodeOptions two_and_six;
  two_and_six.dct_scales = 1u << 2 | 1u << 6;
  JpegDecoder chosen({}, two_and_six);
  img = chosen.decode_region(jpeg.data(), jpeg.size(), 0, 0, 480, 360, 60, 45);
  EXPECT_EQ(img.scale, 2) << "the smallest allowed scale that covers 60x45";
  EXPECT_EQ(img.width, 120);
  img = chosen.decode_region(jpeg.data(), jpeg.size(), 0, 0, 480, 360, 224, 224);
  EXPECT_EQ(img.scale, 6) << "2/8 gives 90 rows; 6/8 gives 270";
  EXPECT_EQ(img.height, 270);
  // ImageWriter passes ImageTransform::dct_scales on: a 224 crop of a 2048x1536 photo at 8/8
  // only, and at 2/8 or 4/8 by default.
  auto big = make_photo_jpeg(2048, 1536, 3);
  ImageTransform t = ImageTransform::eval(224, 256);
  std::vector<std::byte> out(3 * 224 * 224);
  ImageWriter by_default(t);
  by_default.write(big.data(), big.size(), SampleContext{}, out.data());
  EXPECT_EQ(by_default.last_scale(), 2) << "the 1344 px center box at 2/8 is 336 >= 224";
  t.dct_scales = kFullDctScale;
  ImageWriter full_scale(t);
  full_scale.write(big.data(), big.size(), SampleContext{}, out.data());
  EXPECT_EQ(full_scale.last_scale(), 8);
}

TEST(JpegDecoder, RegionDecodeMatchesTheSameRegionOfAFullDecode) {
  auto jpeg = make_photo_jpeg(500, 375, 11);
  Reference full = tj_decode(jpeg);
  JpegDecoder d;
  DecodedImage img = d.decode_region(jpeg.data(), jpeg.size(), 123, 77, 211, 150, 211, 150);
  EXPECT_EQ(img.scale, 8);
  ASSERT_EQ(img.width, 211);
  ASSERT_EQ(img.height, 150);
  EXPECT_LT(mean_abs_diff(img, full, 123, 77), 0.5);
}

TEST(JpegDecoder, ScaledDecodePicksTheSmallestScaleThatCoversTheOutput) {
  auto jpeg = make_photo_jpeg(480, 360, 13);
  // Any M/8: a 224 output from the full 480x360 image: 360*5/8 = 225 >= 224, 4/8 gives 180.
  DecodeOptions any;
  any.any_scale = true;
  JpegDecoder any_scale({}, any);
  DecodedImage img = any_scale.decode_region(jpeg.data(), jpeg.size(), 0, 0, 480, 360, 224, 224);
  EXPECT_EQ(img.scale, 5);
  EXPECT_EQ(img.width, 300);
  EXPECT_EQ(img.height, 225);
  // By default only the SIMD scales 1, 2, 4 and 8: 4/8 is too small, so 8/8.
  JpegDecoder d;
  img = d.decode_region(jpeg.data(), jpeg.size(), 0, 0, 480, 360, 224, 224);
  EXPECT_EQ(img.scale, 8);
  EXPECT_EQ(img.width, 480);
  img = d.decode_region(jpeg.data(), jpeg.size(), 0, 0, 480, 360, 60, 45);
  EXPECT_EQ(img.scale, 1);
  EXPECT_EQ(img.width, 60);
  EXPECT_EQ(img.height, 45);
  // Half scale equals TurboJPEG's own half-scale decode.
  DecodedImage half = d.decode_region(jpeg.data(), jpeg.size(), 0, 0, 480, 360, 240, 180);
  EXPECT_EQ(half.scale, 4);
  Reference ref = tj_decode(jpeg, TJPF_RGB, 240);
  ASSERT_EQ(ref.width, 240);
  EXPECT_EQ(mean_abs_diff(half, ref, 0, 0), 0.0);
}

TEST(JpegDecoder, DecodesProgressiveGrayscaleAndSubsamplingVariants) {
  const int w = 96, h = 64;
  auto rgb = photo_rgb(w, h, 5);
  struct Variant {
    const char* name;
    int subsampling;
    int flags;
  };
  for (Variant v :
       {Variant{"progressive", TJSAMP_420, TJFLAG_PROGRESSIVE}, Variant{"444", TJSAMP_444, 0},
        Variant{"422", TJSAMP_422, 0}, Variant{"gray", TJSAMP_GRAY, 0}}) {
    SCOPED_TRACE(v.name);
    auto jpeg = tj_encode(rgb, w, h, TJPF_RGB, v.subsampling, v.flags);
    JpegDecoder d;
    DecodedImage img = d.decode(jpeg.data(), jpeg.size());
    ASSERT_EQ(img.width, w);
    ASSERT_EQ(img.height, h);
    EXPECT_EQ(mean_abs_diff(img, tj_decode(jpeg), 0, 0), 0.0);
    if (v.subsampling == TJSAMP_GRAY) {
      EXPECT_EQ(d.read_header(jpeg.data(), jpeg.size()).color_space, "gray");
      for (int i = 0; i < w * 3; i += 3) {  // expanded to three equal channels
        EXPECT_EQ(img.pixels[i], img.pixels[i + 1]);
        EXPECT_EQ(img.pixels[i], img.pixels[i + 2]);
      }
    }
  }
}

TEST(JpegDecoder, ConvertsCmykAndYcckToRgb) {
  const int w = 32, h = 16;
  // Adobe-style (inverted) CMYK: left half white (no ink), right half pure cyan.
  std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &cmyk[(static_cast<size_t>(y) * w + x) * 4];
      p[0] = x < w / 2 ? 255 : 0;  // inverted: 255 = no cyan
      p[1] = 255;
      p[2] = 255;
      p[3] = 255;  // no black
    }
  }
  auto ycck = tj_encode(cmyk, w, h, TJPF_CMYK, TJSAMP_444, 0);
  JpegDecoder d;
  EXPECT_EQ(d.read_header(ycck.data(), ycck.size()).color_space, "ycck");
  DecodedImage img = d.decode(ycck.data(), ycck.size());
  ASSERT_EQ(img.width, w);
  auto px = [&](int x, int y, int c) {
    return static_cast<int>(img.pixels[y * img.stride + 3 * x + c]);
  };
  EXPECT_NEAR(px(2, 8, 0), 255, 6);
  EXPECT_NEAR(px(2, 8, 1), 255, 6);
  EXPECT_NEAR(px(2, 8, 2), 255, 6);
  EXPECT_NEAR(px(w - 3, 8, 0), 0, 6);  // cyan: no red
  EXPECT_NEAR(px(w - 3, 8, 1), 255, 6);
  EXPECT_NEAR(px(w - 3, 8, 2), 255, 6);
}

TEST(JpegDecoder, DecodesArithmeticCodedAndRestartMarkedImagesWholeAndCropped) {
  const int w = 200, h = 120;
  auto rgb = photo_rgb(w, h, 8);
  struct Variant {
    const char* name;
    std::function<void(jpeg_compress_struct&)> setup;
  };
  const std::vector<Variant> variants = {
      {"arithmetic", [](jpeg_compress_struct& c) { c.arith_code = TRUE; }},
      {"arithmetic progressive",
       [](jpeg_compress_struct& c) {
         c.arith_code = TRUE;
         jpeg_simple_progression(&c);
       }},
      {"restart every MCU", [](jpeg_compress_struct& c) { c.restart_interval = 1; }},
      {"restart every row", [](jpeg_compress_struct& c) { c.restart_in_rows = 1; }},
      {"arithmetic with restarts",
       [](jpeg_compress_struct& c) {
         c.arith_code = TRUE;
         c.restart_interval = 3;
       }},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    auto jpeg = lib_encode(rgb, w, h, JCS_RGB, 3, v.setup);
    Reference ref = tj_decode(jpeg);
    JpegDecoder d;
    DecodedImage img = d.decode(jpeg.data(), jpeg.size());
    ASSERT_EQ(img.width, w);
    ASSERT_EQ(img.height, h);
    EXPECT_EQ(mean_abs_diff(img, ref, 0, 0), 0.0);
    // A crop below the first rows and right of the first columns: skipped rows and columns.
    img = d.decode_region(jpeg.data(), jpeg.size(), 67, 41, 90, 50, 90, 50);
    ASSERT_EQ(img.width, 90);
    ASSERT_EQ(img.height, 50);
    EXPECT_LT(mean_abs_diff(img, ref, 67, 41), 0.5);
    // Corrupting the entropy-coded data is still an error with these codings.
    auto truncated = jpeg;
    truncated.resize(truncated.size() / 2);
    EXPECT_THROW(d.decode(truncated.data(), truncated.size()), JpegError);
  }
}

TEST(JpegDecoder, ConvertsPlainCmykWithAndWithoutTheAdobeInversion) {
  const int w = 32, h = 16;
  // Left half white (no ink), right half pure magenta, as ink amounts 0..255.
  auto ink = [&](int x, int c) { return c == 1 && x >= w / 2 ? 255 : 0; };
  for (bool adobe : {true, false}) {
    SCOPED_TRACE(adobe ? "Adobe (inverted)" : "no Adobe marker (plain)");
    std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int c = 0; c < 4; ++c) {
          const int v = ink(x, c);
          cmyk[(static_cast<size_t>(y) * w + x) * 4 + c] =
              static_cast<uint8_t>(adobe ? 255 - v : v);
        }
      }
    }
    auto jpeg = lib_encode(cmyk, w, h, JCS_CMYK, 4, [&](jpeg_compress_struct& c) {
      jpeg_set_colorspace(&c, JCS_CMYK);  // stored as CMYK, not YCCK
      c.write_Adobe_marker = adobe ? TRUE : FALSE;
    });
    JpegDecoder d;
    EXPECT_EQ(d.read_header(jpeg.data(), jpeg.size()).color_space, "cmyk");
    DecodedImage img = d.decode(jpeg.data(), jpeg.size());
    ASSERT_EQ(img.width, w);
    auto px = [&](int x, int y, int c) {
      return static_cast<int>(img.pixels[y * img.stride + 3 * x + c]);
    };
    EXPECT_NEAR(px(2, 8, 0), 255, 6);
    EXPECT_NEAR(px(2, 8, 1), 255, 6);
    EXPECT_NEAR(px(2, 8, 2), 255, 6);
    EXPECT_NEAR(px(w - 3, 8, 0), 255, 6);  // magenta: red and blue, no green
    EXPECT_NEAR(px(w - 3, 8, 1), 0, 6);
    EXPECT_NEAR(px(w - 3, 8, 2), 255, 6);
  }
}

TEST(JpegDecoder, RgbxAndFastUpsamplingOptionsMatchTurboJpeg) {
  auto jpeg = make_photo_jpeg(160, 120, 17);
  Reference rgbx = tj_decode(jpeg, TJPF_RGBX);
  DecodeOptions o;
  o.channels = 4;
  JpegDecoder d({}, o);
  DecodedImage img = d.decode_region(jpeg.data(), jpeg.size(), 33, 20, 100, 80, 100, 80);
  ASSERT_EQ(img.channels, 4);
  ASSERT_EQ(img.width, 100);
  double diff = 0;
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        diff += std::abs(img.pixels[y * img.stride + 4 * x + c] -
                         rgbx.pixels[(static_cast<size_t>(20 + y) * 160 + 33 + x) * 4 + c]);
      }
    }
  }
  EXPECT_LT(diff / (100 * 80 * 3), 0.5);
  // Replicated chroma is TurboJPEG's TJFLAG_FASTUPSAMPLE decode, exactly.
  o.channels = 3;
  o.fast_upsampling = true;
  JpegDecoder fast({}, o);
  tjhandle h = tjInitDecompress();
  std::vector<uint8_t> ref(160 * 120 * 3);
  ASSERT_EQ(tjDecompress2(h, jpeg.data(), jpeg.size(), ref.data(), 160, 0, 120, TJPF_RGB,
                          TJFLAG_FASTUPSAMPLE),
            0);
  tjDestroy(h);
  img = fast.decode(jpeg.data(), jpeg.size());
  EXPECT_EQ(std::memcmp(img.pixels, ref.data(), ref.size()), 0);
}

TEST(JpegDecoder, ReadsTheExifOrientationOnlyWhenAsked) {
  auto rgb = photo_rgb(48, 32, 3);
  DecodeOptions o;
  o.read_orientation = true;
  JpegDecoder reading({}, o), plain;
  for (int orientation = 1; orientation <= 8; ++orientation) {
    for (bool big_endian : {true, false}) {
      auto exif = exif_payload(orientation, big_endian);
      auto jpeg = lib_encode(
          rgb, 48, 32, JCS_RGB, 3, [](jpeg_compress_struct&) {},
          [&](jpeg_compress_struct& c) {
            jpeg_write_marker(&c, JPEG_APP0 + 1, exif.data(), static_cast<unsigned>(exif.size()));
          });
      EXPECT_EQ(reading.read_header(jpeg.data(), jpeg.size()).orientation, orientation);
      EXPECT_EQ(plain.read_header(jpeg.data(), jpeg.size()).orientation, 1);
    }
  }
  // A malformed Exif block (an IFD offset past its end) reads as 1, not an error.
  auto exif = exif_payload(6, true);
  exif[6 + 7] = 0xF0;
  auto jpeg = lib_encode(
      rgb, 48, 32, JCS_RGB, 3, [](jpeg_compress_struct&) {},
      [&](jpeg_compress_struct& c) {
        jpeg_write_marker(&c, JPEG_APP0 + 1, exif.data(), static_cast<unsigned>(exif.size()));
      });
  EXPECT_EQ(reading.read_header(jpeg.data(), jpeg.size()).orientation, 1);
  EXPECT_EQ(reading.decode(jpeg.data(), jpeg.size()).width, 48);
}

TEST(JpegDecoder, TruncatedDataIsAnErrorNotAGreyImage) {
  auto jpeg = make_photo_jpeg(200, 150, 3);
  jpeg.resize(jpeg.size() * 6 / 10);
  JpegDecoder d;
  try {
    d.decode(jpeg.data(), jpeg.size());
    ADD_FAILURE() << "truncated JPEG decoded without error";
  } catch (const JpegError& e) {
    EXPECT_NE(std::string(e.what()).find("JPEG"), std::string::npos) << e.what();
  }
  // The decoder is still usable afterwards.
  auto good = make_photo_jpeg(40, 30, 4);
  EXPECT_EQ(d.decode(good.data(), good.size()).width, 40);
}

TEST(JpegDecoder, GarbageAndEmptyInputThrow) {
  JpegDecoder d;
  std::vector<uint8_t> garbage(1000, 0x42);
  EXPECT_THROW(d.decode(garbage.data(), garbage.size()), JpegError);
  EXPECT_THROW(d.decode(garbage.data(), 0), JpegError);
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13};
  EXPECT_THROW(d.read_header(png.data(), png.size()), JpegError);
}

TEST(JpegDecoder, HugeImagesAreRejectedBeforeAllocation) {
  auto jpeg = make_photo_jpeg(64, 48, 1);
  // Patch the SOF0 frame header to claim 40000 x 30000 pixels.
  for (size_t i = 0; i + 8 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = 30000 >> 8;
      jpeg[i + 6] = 30000 & 0xFF;
      jpeg[i + 7] = 40000 >> 8;
      jpeg[i + 8] = 40000 & 0xFF;
      break;
    }
  }
  JpegDecoder d;
  try {
    d.decode(jpeg.data(), jpeg.size());
    ADD_FAILURE() << "a 1.2 gigapixel image was accepted";
  } catch (const JpegError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit"), std::string::npos) << e.what();
  }
  JpegDecoder strict(DecodeLimits{1000});
  auto small = make_photo_jpeg(64, 48, 1);
  EXPECT_THROW(strict.decode(small.data(), small.size()), JpegError);
}

// A file of more than DecodeLimits::max_scans scans is refused (issue 29: each scan is a pass over
// every block, and 10,000 scans of a 10000x10000 image took 67.6 s), from every entry point and
// every time; one of exactly max_scans decodes, however often the decoder is reused (the count is
// the image's own), and a lower limit refuses it.
TEST(JpegDecoder, FilesWithMoreScansThanTheLimitAreRejected) {
  const int limit = DecodeLimits{}.max_scans;
  EXPECT_EQ(limit, 500);
  const auto at_limit = testing::progressive_jpeg_with_scans(48, 40, limit);
  const auto over = testing::progressive_jpeg_with_scans(48, 40, limit + 1);
  // Valid files: libjpeg-turbo without a limit reads both.
  EXPECT_EQ(tj_decode(at_limit).width, 48);
  EXPECT_EQ(tj_decode(over).width, 48);
  JpegDecoder d;
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(d.decode(at_limit.data(), at_limit.size()).width, 48) << "round " << round;
    for (int entry = 0; entry < 2; ++entry) {
      try {
        if (entry == 0) {
          d.decode(over.data(), over.size());
        } else {
          d.begin(over.data(), over.size());
          d.finish_region(8, 8, 16, 16, 16, 16);
        }
        ADD_FAILURE() << "a file of " << limit + 1 << " scans decoded (entry " << entry << ")";
      } catch (const JpegError& e) {
        EXPECT_NE(std::string(e.what()).find("JPEG rejected: more than 500 scans"),
                  std::string::npos)
            << e.what();
      }
    }
  }
  DecodeLimits strict_limits;
  strict_limits.max_scans = 64;
  JpegDecoder strict(strict_limits);
  EXPECT_THROW(strict.decode(at_limit.data(), at_limit.size()), JpegError);
  const auto fewest = testing::progressive_jpeg_with_scans(48, 40, 64);
  EXPECT_EQ(strict.decode(fewest.data(), fewest.size()).width, 48);
  strict_limits.max_scans = 0;
  EXPECT_THROW(JpegDecoder{strict_limits}, std::invalid_argument);
}

// The rows of a decoded region, without the stride's padding.
std::vector<uint8_t> region_bytes(const DecodedImage& img) {
  std::vector<uint8_t> bytes;
  const size_t row = static_cast<size_t>(img.width) * static_cast<size_t>(img.channels);
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* p = img.pixels + static_cast<size_t>(y) * img.stride;
    bytes.insert(bytes.end(), p, p + row);
  }
  return bytes;
}

// A file of every kind the decoder meets, and whether the discard hook may take it.
struct DiscardKind {
  std::string name;
  std::vector<uint8_t> jpeg;
  bool hookable;
};

std::vector<DiscardKind> discard_corpus(int w, int h, uint64_t seed) {
  const auto rgb = photo_rgb(w, h, seed);
  std::vector<DiscardKind> kinds;
  auto add = [&](const std::string& name, EncodeOptions o, bool hookable) {
    kinds.push_back({name, encode_jpeg(rgb.data(), w, h, o), hookable});
  };
  EncodeOptions o;
  add("4:2:0", o, true);
  o.h_samp = 2;
  o.v_samp = 1;
  add("4:2:2", o, true);
  o.h_samp = 1;
  add("4:4:4", o, true);
  o.v_samp = 2;
  add("4:4:0", o, true);
  o.h_samp = 4;
  o.v_samp = 1;
  add("4:1:1", o, true);
  o = EncodeOptions{};
  o.color = EncodeOptions::Color::kGray;
  add("gray", o, true);
  o.restart_interval = 5;
  add("gray, restart 5", o, true);
  o = EncodeOptions{};
  o.color = EncodeOptions::Color::kRgb;
  o.h_samp = o.v_samp = 1;
  add("rgb", o, true);
  o = EncodeOptions{};
  o.color = EncodeOptions::Color::kCmyk;
  add("cmyk", o, true);
  o.color = EncodeOptions::Color::kYcck;
  add("ycck", o, true);
  // Restart intervals that are, and are not, a multiple of the MCU row (a row of 1 and 2 MCUs
  // tiles it: those files go through the restart segments, jpeg_segments.h).
  for (const int interval : {1, 2, 3, 7, 13, 64}) {
    o = EncodeOptions{};
    o.restart_interval = interval;
    add("4:2:0, restart " + std::to_string(interval), o, true);
  }
  o = EncodeOptions{};
  o.h_samp = o.v_samp = 1;
  o.restart_interval = 11;
  add("4:4:4, restart 11", o, true);
  o = EncodeOptions{};
  o.progressive = true;
  add("progressive", o, false);
  o.color = EncodeOptions::Color::kGray;
  add("progressive gray", o, false);
  o = EncodeOptions{};
  o.arithmetic = true;
  add("arithmetic", o, false);
  o.restart_interval = 3;
  add("arithmetic, restart 3", o, false);
  // One component whose sampling factors say 2x2: its scan's MCU is still one block, so its
  // iMCU column is 8 pixels wide, not 16 (the first prototype of the hook got this wrong).
  std::vector<uint8_t> luma(static_cast<size_t>(w) * static_cast<size_t>(h));
  for (size_t i = 0; i < luma.size(); ++i) luma[i] = rgb[3 * i + 1];
  kinds.push_back({"gray sampled 2x2",
                   lib_encode(luma, w, h, JCS_GRAYSCALE, 1,
                              [](jpeg_compress_struct& c) {
                                c.comp_info[0].h_samp_factor = 2;
                                c.comp_info[0].v_samp_factor = 2;
                              }),
                   true});
  // A sequential file with one scan per component: read whole by jpeg_start_decompress.
  static const jpeg_scan_info kOneScanPerComponent[3] = {
      {1, {0}, 0, 63, 0, 0}, {1, {1}, 0, 63, 0, 0}, {1, {2}, 0, 63, 0, 0}};
  kinds.push_back({"sequential, one scan per component",
                   lib_encode(rgb, w, h, JCS_RGB, 3,
                              [](jpeg_compress_struct& c) {
                                c.scan_info = kOneScanPerComponent;
                                c.num_scans = 3;
                              }),
                   false});
  return kinds;
}

// The discard hook is libjpeg-turbo's entropy decoder's path: these tests turn the own decoder
// (DecodeOptions::own_entropy_decoder, on by default; jpeg_entropy_test) off.
DecodeOptions stock_entropy() {
  DecodeOptions o;
  o.own_entropy_decoder = false;
  return o;
}

// The hook changes no byte: every kind of file, odd sizes, random boxes and output sizes (so
// every DCT scale), each option set, decoded with the hook and without, by decoders reused
// across files. Where it applies, it is taken for the boxes that leave columns out.
TEST(JpegDiscardHook, DecodesTheSameBytesAsWithoutItOnEveryKindOfFile) {
  struct OptionSet {
    const char* name;
    DecodeOptions options;
  };
  std::vector<OptionSet> sets;
  for (const bool fast : {true, false}) {
    for (const bool any : {false, true}) {
      DecodeOptions o = stock_entropy();
      o.channels = fast ? 4 : 3;
      o.fast_upsampling = fast;
      o.any_scale = any;
      sets.push_back({fast ? (any ? "RGBX fast any_scale" : "RGBX fast")
                           : (any ? "RGB fancy any_scale" : "RGB fancy"),
                      o});
    }
  }
  DecodeOptions plain_segments =
      stock_entropy();  // restart segments off too: libjpeg's own path only
  plain_segments.restart_segments = false;
  sets.push_back({"RGB fancy, no restart segments", plain_segments});
  uint64_t compared = 0, hooked = 0;
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{333, 217}, {97, 61}, {500, 9}}) {
    for (const DiscardKind& kind : discard_corpus(w, h, static_cast<uint64_t>(w))) {
      for (size_t s = 0; s < sets.size(); ++s) {
        SCOPED_TRACE(kind.name + " " + std::to_string(w) + "x" + std::to_string(h) + ", " +
                     sets[s].name);
        DecodeOptions off = sets[s].options;
        off.discard_outside_crop = false;
        JpegDecoder with_hook({}, sets[s].options), without({}, off);
        SampleRng rng(35, static_cast<uint64_t>(w) * 100 + s, compared);
        uint64_t kind_hooked = 0;
        for (int trial = 0; trial < 16; ++trial) {
          const int bw = rng.randint(1, w + 1), bh = rng.randint(1, h + 1);
          const int bx = rng.randint(0, w - bw + 1), by = rng.randint(0, h - bh + 1);
          const int mw = rng.randint(1, bw + 1), mh = rng.randint(1, bh + 1);
          const DecodedImage a =
              with_hook.decode_region(kind.jpeg.data(), kind.jpeg.size(), bx, by, bw, bh, mw, mh);
          const std::vector<uint8_t> got = region_bytes(a);
          const JpegEntropyStats stats = with_hook.last_entropy_stats();
          const DecodedImage b =
              without.decode_region(kind.jpeg.data(), kind.jpeg.size(), bx, by, bw, bh, mw, mh);
          ASSERT_EQ(a.width, b.width);
          ASSERT_EQ(a.height, b.height);
          ASSERT_EQ(a.scale, b.scale);
          ASSERT_TRUE(got == region_bytes(b))
              << "box " << bx << "," << by << " " << bw << "x" << bh << " at " << a.scale << "/8";
          EXPECT_EQ(without.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
          if (stats.path == JpegEntropyPath::kDiscardOutsideCrop) {
            ++kind_hooked;
          } else {
            EXPECT_EQ(stats.path, JpegEntropyPath::kLibjpeg);
            EXPECT_EQ(stats.mcus_discarded, 0u);
          }
          ++compared;
        }
        if (!kind.hookable) {
          EXPECT_EQ(kind_hooked, 0u);
        }
        hooked += kind_hooked;
      }
      // Every hookable kind takes the hook for a narrow box in the middle of the larger images
      // (restart segments off: a file with an interval of 1 MCU is cut to the box's columns
      // before libjpeg sees it, leaving the hook nothing to discard).
      if (kind.hookable && w >= 333) {
        SCOPED_TRACE(kind.name);
        DecodeOptions no_segments = stock_entropy();
        no_segments.restart_segments = false;
        JpegDecoder d({}, no_segments);
        d.decode_region(kind.jpeg.data(), kind.jpeg.size(), w / 3, h / 3, w / 4, h / 4, w / 4,
                        h / 4);
        EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kDiscardOutsideCrop);
        EXPECT_GT(d.last_entropy_stats().mcus_discarded, 0u);
        if (kind.name == "4:2:0, restart 1") {
          JpegDecoder segmented({}, stock_entropy());
          segmented.decode_region(kind.jpeg.data(), kind.jpeg.size(), w / 3, h / 3, w / 4, h / 4,
                                  w / 4, h / 4);
          EXPECT_EQ(segmented.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
        }
      }
    }
  }
  EXPECT_GT(hooked, compared / 4);
}

// The query: the hook is installed for a baseline file's narrow box, and not for a progressive
// file, a box that needs every column, or a decoder with the option off.
TEST(JpegDiscardHook, IsInstalledForABaselineFileAndNotForAProgressiveOne) {
  const auto rgb = photo_rgb(500, 375, 3);
  const auto baseline = encode_jpeg(rgb.data(), 500, 375, EncodeOptions{});
  EncodeOptions p;
  p.progressive = true;
  const auto progressive = encode_jpeg(rgb.data(), 500, 375, p);
  JpegDecoder d({}, stock_entropy());
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kNone);
  d.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  JpegEntropyStats stats = d.last_entropy_stats();
  EXPECT_EQ(stats.path, JpegEntropyPath::kDiscardOutsideCrop);
  // 4:2:0 at 8/8: 32 MCUs a row, the box and its one-MCU margin need 10 of them; the rows from the
  // box's top margin down to its bottom margin are decoded (at least 8 MCU rows), the rows above
  // are skipped by libjpeg's own discard.
  EXPECT_GE(stats.mcus_discarded, 8u * 22u);
  EXPECT_LE(stats.mcus_discarded, 24u * 22u);
  d.decode_region(progressive.data(), progressive.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
  EXPECT_EQ(d.last_entropy_stats().mcus_discarded, 0u);
  d.decode_region(baseline.data(), baseline.size(), 0, 100, 500, 60, 500, 60);
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
  d.decode(baseline.data(), baseline.size());
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
  DecodeOptions off = stock_entropy();
  off.discard_outside_crop = false;
  JpegDecoder plain({}, off);
  plain.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(plain.last_entropy_stats().path, JpegEntropyPath::kLibjpeg);
  // A corrupt file fails the same way with the hook.
  auto truncated = baseline;
  truncated.resize(truncated.size() / 2);
  EXPECT_THROW(d.decode_region(truncated.data(), truncated.size(), 200, 300, 120, 60, 120, 60),
               JpegError);
  d.decode_region(baseline.data(), baseline.size(), 200, 100, 120, 120, 120, 120);
  EXPECT_EQ(d.last_entropy_stats().path, JpegEntropyPath::kDiscardOutsideCrop);
}

}  // namespace
}  // namespace conveyor
