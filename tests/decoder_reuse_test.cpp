// One JpegDecoder reused across images of every kind, in every order of two, with the skips and
// crops the loader makes. ctest runs this binary twice: as it is (the pixels must match a full
// TurboJPEG decode) and under valgrind's memcheck, which fails the run on any read or write of
// freed memory inside libjpeg-turbo. The second run is the regression test for the decode
// failures of issue 10: libjpeg-turbo before 3.1.2 (Debian 12 ships 2.1.5) wrote through a
// dangling color-converter pointer in jpeg_skip_scanlines when a decoder that had just decoded
// without merged upsampling (4:4:4, gray, CMYK, a DCT scale below 8/8) next decoded a 4:2:0 or
// 4:2:2 image with merged upsampling, corrupting whatever had since been allocated there.
// The first run is also the regression test for regions decoded with fancy upsampling (the
// default DecodeOptions), whose edge pixels used to differ from a full decode.
// The test links no LibTorch, so that valgrind runs it in seconds.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstring>
#include <string>
#include <vector>

#include "conveyor/jpeg.h"

namespace conveyor {
namespace {

struct Kind {
  std::string name;
  EncodeOptions options;
};

constexpr int kWidth = 96;
constexpr int kHeight = 80;

std::vector<uint8_t> noise_rgb(int w, int h, unsigned seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  unsigned state = seed * 2654435761u + 1;
  for (size_t i = 0; i < rgb.size(); ++i) {
    state = state * 1103515245u + 12345u;
    // Ramps plus noise, so that chroma upsampling errors show up as pixel differences.
    const size_t px = i / 3;
    const int x = static_cast<int>(px % static_cast<size_t>(w));
    const int y = static_cast<int>(px / static_cast<size_t>(w));
    rgb[i] = static_cast<uint8_t>(
        (x * 7 + y * 3 + static_cast<int>(i % 3) * 50 + static_cast<int>((state >> 16) % 64)) &
        0xFF);
  }
  return rgb;
}

std::vector<Kind> kinds() {
  auto opt = [](EncodeOptions::Color c, int h, int v, bool progressive = false) {
    EncodeOptions o;
    o.color = c;
    o.h_samp = h;
    o.v_samp = v;
    o.progressive = progressive;
    return o;
  };
  using C = EncodeOptions::Color;
  return {{"420", opt(C::kYCbCr, 2, 2)},
          {"422", opt(C::kYCbCr, 2, 1)},
          {"444", opt(C::kYCbCr, 1, 1)},
          {"440", opt(C::kYCbCr, 1, 2)},
          {"411", opt(C::kYCbCr, 4, 1)},
          {"gray", opt(C::kGray, 1, 1)},
          {"cmyk", opt(C::kCmyk, 1, 1)},
          {"ycck", opt(C::kYcck, 2, 2)},
          {"420 progressive", opt(C::kYCbCr, 2, 2, true)},
          {"444 progressive", opt(C::kYCbCr, 1, 1, true)}};
}

// The region at (x, y) of `decoded` must equal the same region of TurboJPEG's full decode at the
// same scale and upsampling.
void expect_matches_full_decode(const std::vector<uint8_t>& jpeg, const DecodedImage& decoded,
                                int x, int y, bool fast, int channels, const std::string& what) {
  tjhandle handle = tjInitDecompress();
  int w = 0, h = 0, sub = 0, cs = 0;
  ASSERT_EQ(tjDecompressHeader3(handle, jpeg.data(), jpeg.size(), &w, &h, &sub, &cs), 0);
  const int sw = (w * decoded.scale + 7) / 8, sh = (h * decoded.scale + 7) / 8;
  const bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
  std::vector<uint8_t> full(static_cast<size_t>(sw) * sh * 4);
  const int flags = fast ? TJFLAG_FASTUPSAMPLE : 0;
  ASSERT_EQ(tjDecompress2(handle, jpeg.data(), jpeg.size(), full.data(), sw, 0, sh,
                          cmyk ? TJPF_CMYK : TJPF_RGBX, flags),
            0)
      << tjGetErrorStr2(handle);
  tjDestroy(handle);
  const int sx0 = x * decoded.scale / 8, sy0 = y * decoded.scale / 8;
  for (int r = 0; r < decoded.height; ++r) {
    for (int c = 0; c < decoded.width; ++c) {
      const uint8_t* want = &full[(static_cast<size_t>(sy0 + r) * sw + sx0 + c) * 4];
      uint8_t rgb[3];
      if (cmyk) {  // Adobe-inverted CMYK as stored; converted as the decoder does
        for (int i = 0; i < 3; ++i) rgb[i] = static_cast<uint8_t>(want[i] * want[3] / 255);
      } else {
        std::memcpy(rgb, want, 3);
      }
      const uint8_t* got = decoded.pixels + static_cast<size_t>(r) * decoded.stride +
                           static_cast<size_t>(c) * static_cast<size_t>(channels);
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(got[i], rgb[i]) << what << " at (" << c << ", " << r << ") channel " << i;
      }
    }
  }
}

struct Box {
  int x, y, w, h;
};

TEST(JpegDecoderReuse, EveryOrderOfTwoKindsDecodesRegionsExactly) {
  const auto all = kinds();
  std::vector<std::vector<uint8_t>> files;
  for (size_t i = 0; i < all.size(); ++i) {
    auto rgb = noise_rgb(kWidth, kHeight, static_cast<unsigned>(i));
    files.push_back(encode_jpeg(rgb.data(), kWidth, kHeight, all[i].options));
  }
  // Edges on and off chroma and iMCU boundaries, 1x1 boxes in the corners, skips that are not
  // multiples of the 16-row iMCU.
  const Box boxes[] = {{17, 21, 50, 40}, {16, 16, 32, 32}, {1, 1, 1, 1},
                       {95, 79, 1, 1},   {33, 3, 62, 77},  {8, 9, 31, 33}};
  for (const bool fast : {true, false}) {
    DecodeOptions options;
    options.channels = fast ? 4 : 3;
    options.fast_upsampling = fast;
    JpegDecoder decoder({}, options);
    for (size_t a = 0; a < all.size(); ++a) {
      for (size_t b = 0; b < all.size(); ++b) {
        const std::string order =
            std::string(fast ? "fast " : "fancy ") + all[a].name + " then " + all[b].name;
        // A decode at 4/8 first: no merged upsampling, for every kind.
        const DecodedImage first =
            decoder.decode_region(files[a].data(), files[a].size(), 0, 0, kWidth, kHeight, 40, 30);
        ASSERT_EQ(first.scale, 4) << order;
        for (const Box& box : boxes) {
          const std::string what = order + ", box (" + std::to_string(box.x) + ", " +
                                   std::to_string(box.y) + ") " + std::to_string(box.w) + "x" +
                                   std::to_string(box.h);
          // At 8/8 (no scale gives twice the box), then at the scale the chooser picks for
          // half the box.
          const DecodedImage region = decoder.decode_region(
              files[b].data(), files[b].size(), box.x, box.y, box.w, box.h, 2 * box.w, 2 * box.h);
          ASSERT_EQ(region.scale, 8) << what;
          ASSERT_EQ(region.width, box.w) << what;
          ASSERT_EQ(region.height, box.h) << what;
          expect_matches_full_decode(files[b], region, box.x, box.y, fast, options.channels, what);
          const DecodedImage scaled =
              decoder.decode_region(files[b].data(), files[b].size(), box.x, box.y, box.w, box.h,
                                    (box.w + 1) / 2, (box.h + 1) / 2);
          expect_matches_full_decode(files[b], scaled, box.x, box.y, fast, options.channels,
                                     what + " at " + std::to_string(scaled.scale) + "/8");
        }
        const DecodedImage whole = decoder.decode(files[a].data(), files[a].size());
        expect_matches_full_decode(files[a], whole, 0, 0, fast, options.channels,
                                   order + " then " + all[a].name + " whole");
      }
    }
  }
}

// A crop that leaves the chroma fewer than 2 samples wide makes jpeg_crop_scanline re-initialise
// the upsampler in place; under merged upsampling (4:2:0 and 4:2:2 at 8/8 with fast upsampling)
// libjpeg-turbo then writes a separate upsampler's fields past the merged upsampler's struct, over
// the color tables that its C code (no SIMD, as under valgrind here) reads. Boxes 1 and 2 pixels
// wide at every column, on colors that use every table entry, must still match a full decode.
TEST(JpegDecoderReuse, NarrowCropsWithMergedUpsamplingDecodeExactly) {
  constexpr int w = 64, h = 48;
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i)
    rgb[i] = static_cast<uint8_t>((i * 97 + i / 3 * 31) & 0xFF);
  for (const int v_samp : {2, 1}) {
    EncodeOptions o;
    o.v_samp = v_samp;
    o.quality = 100;
    const auto jpeg = encode_jpeg(rgb.data(), w, h, o);
    DecodeOptions options;
    options.channels = 4;
    options.fast_upsampling = true;
    JpegDecoder decoder({}, options);
    for (int x = 0; x < w; ++x) {
      for (const int bw : {1, 2}) {
        if (x + bw > w) continue;
        const std::string what = std::string(v_samp == 2 ? "420" : "422") + " box (" +
                                 std::to_string(x) + ", 5) " + std::to_string(bw) + "x40";
        const DecodedImage region =
            decoder.decode_region(jpeg.data(), jpeg.size(), x, 5, bw, 40, 2 * bw, 80);
        ASSERT_EQ(region.scale, 8) << what;
        expect_matches_full_decode(jpeg, region, x, 5, true, 4, what);
      }
    }
  }
}

}  // namespace
}  // namespace conveyor
