// PNG through the codec seam (issue 32): a generated corpus of every colour type, bit depth and
// interlacing at odd sizes from 1x1 (tests/png_writer.h), decoded by ImageWriter, equals libpng's
// full decode then the project's own crop, resize and flip byte for byte, for many random
// (seed, index) crops; a header that promises a huge image, truncated and corrupt files are clear
// errors; an ImageFolder holding a PNG named .JPEG among JPEGs reads every file, and a GIF or a
// TIFF in it is an error naming the file and the format, or a counted skip.
#include <gtest/gtest.h>

#include <csetjmp>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codec/image_codec.h"
#include "image_writer_checks.h"
#include "png_reference.h"
#include "png_writer.h"
#include "test_support.h"

namespace conveyor {
namespace {

using testing::error_of;
using testing::expected_row;
using testing::make_png;
using testing::PngFile;
using testing::PngSpec;
using testing::Reference;
using testing::reference_of;
using testing::TempDir;
using testing::write_bytes;

// Every kind at odd sizes, interlaced or not, with and without tRNS.
std::vector<PngFile> corpus() {
  const int sizes[][2] = {{1, 1}, {1, 7}, {9, 1}, {5, 3}, {17, 13}, {33, 31}, {64, 41}};
  return testing::png_corpus(sizes, 3);
}

TEST(PngImageWriter, EveryKindMatchesLibpngThenTheSameCropResizeAndFlip) {
  const std::vector<PngFile> files = corpus();
  ASSERT_EQ(files.size(), 15u * 7 * 2);
  std::vector<ImageWriter> writers = testing::checked_writers();
  testing::RowCounts counts;
  for (const PngFile& f : files) {
    const Reference ref = reference_of(f);
    ASSERT_EQ(ref.width, f.spec.width);
    ASSERT_NO_FATAL_FAILURE(
        testing::expect_rows_match(writers, f.bytes, ref, 6, 11, describe(f.spec), counts));
  }
  EXPECT_EQ(counts.compared, files.size() * 18);
  EXPECT_GT(counts.flipped, counts.compared / 8);
}

// The region decode itself is exact: every region of a full decode, at full size (no scaling).
TEST(PngDecoder, RegionsAreThoseOfTheFullDecode) {
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  ASSERT_NE(d, nullptr);
  std::mt19937 rng(7);
  for (const PngFile& f : corpus()) {
    const Reference ref = reference_of(f);
    for (int k = 0; k < 4; ++k) {
      const int x = static_cast<int>(rng() % f.spec.width);
      const int y = static_cast<int>(rng() % f.spec.height);
      const int w = 1 + static_cast<int>(rng() % (f.spec.width - x));
      const int h = 1 + static_cast<int>(rng() % (f.spec.height - y));
      const detail::ImageInfo info = d->begin(f.bytes.data(), f.bytes.size());
      EXPECT_EQ(info.width, f.spec.width);
      EXPECT_EQ(info.height, f.spec.height);
      EXPECT_EQ(info.bit_depth, f.spec.bit_depth);
      EXPECT_EQ(info.channels,
                testing::png_channels(f.spec.color_type) == 1 && f.spec.color_type == 3
                    ? 3
                    : testing::png_channels(f.spec.color_type));
      const DecodedImage image = d->finish_region(x, y, w, h, w, h);
      ASSERT_NO_FATAL_FAILURE(testing::expect_region_of(ref, image, x, y, w, h, describe(f.spec)));
    }
  }
}

// The samples mode (masks) returns the file's own samples for every gray and palette kind, 1 to
// 16 bits, interlaced or not, in random regions: the samples png_writer.h wrote (with zlib alone),
// not a libspng decode. (libspng 0.7.3's own Adam7 placement was wrong below 8 bits.)
TEST(PngDecoder, SamplesAreTheFilesOwnForEveryOneChannelKind) {
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  std::mt19937 rng(11);
  size_t compared = 0;
  for (PngSpec kind : testing::every_png_kind()) {
    if (kind.color_type != 0 && kind.color_type != 3) continue;
    for (int k = 0; k < 24; ++k) {
      PngSpec s = kind;
      s.width = 1 + static_cast<int>(rng() % 70);
      s.height = 1 + static_cast<int>(rng() % 40);
      s.interlaced = k % 2 == 1;
      const PngFile f = make_png(s, 500 + k);
      const int x = static_cast<int>(rng() % s.width);
      const int y = static_cast<int>(rng() % s.height);
      const int w = 1 + static_cast<int>(rng() % (s.width - x));
      const int h = 1 + static_cast<int>(rng() % (s.height - y));
      d->begin(f.bytes.data(), f.bytes.size());
      const detail::SampleRegion region = d->finish_samples(x, y, w, h);
      ASSERT_EQ(region.width, w);
      ASSERT_EQ(region.height, h);
      ASSERT_EQ(region.bit_depth, s.bit_depth);
      for (int r = 0; r < h; ++r) {
        for (int c = 0; c < w; ++c) {
          const uint8_t* at = region.samples + static_cast<size_t>(r) * region.stride;
          uint16_t got = at[c];
          if (s.bit_depth == 16) std::memcpy(&got, at + 2 * c, sizeof got);
          ASSERT_EQ(got, f.samples[static_cast<size_t>(y + r) * s.width + x + c])
              << describe(s) << " region " << x << "," << y << " " << w << "x" << h << " at " << c
              << "," << r;
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 9u * 24 * 20);
}

// 16-bit samples become the nearest 8-bit value (Pillow clips 16-bit gray to 255 instead).
TEST(PngDecoder, SixteenBitSamplesAreRoundedToTheNearestEightBitValue) {
  PngSpec s;
  s.width = 6;
  s.height = 1;
  s.color_type = 0;
  s.bit_depth = 16;
  const PngFile f = make_png(s, 1);  // its signature and IHDR; the data is written here
  const uint16_t values[6] = {0, 128, 129, 257, 32896, 65535};
  std::vector<uint8_t> filtered = {0};
  for (uint16_t v : values) {
    filtered.push_back(static_cast<uint8_t>(v >> 8));
    filtered.push_back(static_cast<uint8_t>(v));
  }
  uLongf size = compressBound(static_cast<uLong>(filtered.size()));
  std::vector<uint8_t> idat(size);
  ASSERT_EQ(compress2(idat.data(), &size, filtered.data(), static_cast<uLong>(filtered.size()), 6),
            Z_OK);
  idat.resize(size);
  std::vector<uint8_t> file(f.bytes.begin(), f.bytes.begin() + 33);  // signature + IHDR
  testing::png_detail::chunk(file, "IDAT", idat);
  testing::png_detail::chunk(file, "IEND", {});
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  d->begin(file.data(), file.size());
  const DecodedImage image = d->finish_region(0, 0, 6, 1, 6, 1);
  const uint8_t expected[6] = {0, 0, 1, 1, 128, 255};
  for (int i = 0; i < 6; ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(image.pixels[i * 3 + c], expected[i]) << values[i];
  }
}

TEST(PngImageWriter, AHugeDeclaredSizeIsRefusedBeforeDecoding) {
  ImageWriter writer(ImageTransform::train(8));
  const std::string huge = error_of(writer, testing::png_declaring(200000, 100000));
  EXPECT_NE(huge.find("PNG rejected: 200000x100000 = 20000000000 pixels exceeds the limit of "
                      "100000000"),
            std::string::npos)
      << huge;
  // Under the limit, but far more rows than its few bytes can hold: refused before any buffer of
  // the declared size is allocated.
  const std::string short_file = error_of(writer, testing::png_declaring(9000, 9000));
  EXPECT_NE(short_file.find("cannot hold a 9000x9000 image"), std::string::npos) << short_file;
  ImageTransform small = ImageTransform::train(8);
  small.limits.max_pixels = 100;
  ImageWriter strict(small);
  PngSpec s;
  s.width = 11;
  s.height = 10;
  EXPECT_NE(error_of(strict, make_png(s, 1).bytes).find("110 pixels exceeds the limit of 100"),
            std::string::npos);
  s.width = 10;
  EXPECT_EQ(error_of(strict, make_png(s, 1).bytes), "");
}

// Cut anywhere before the end of its last IDAT chunk, a file decoded whole (kResize) is an error,
// never a crash or a partly grey image; so is any byte of its header or data changed (CRC).
TEST(PngImageWriter, TruncatedAndCorruptFilesAreClearErrors) {
  ImageTransform whole = ImageTransform::train(8);
  whole.mode = ImageTransform::Mode::kResize;
  ImageWriter writer(whole);
  for (bool interlaced : {false, true}) {
    PngSpec s;
    s.width = 23;
    s.height = 19;
    s.interlaced = interlaced;
    const std::vector<uint8_t> file = make_png(s, 5).bytes;
    const size_t data_end = file.size() - 12;  // IEND is the last 12 bytes
    for (size_t cut = 0; cut < data_end; cut += 3) {
      const std::vector<uint8_t> truncated(file.begin(), file.begin() + static_cast<long>(cut));
      EXPECT_NE(error_of(writer, truncated), "") << describe(s) << " cut at " << cut;
    }
    for (size_t at = 8; at < data_end; at += 5) {
      std::vector<uint8_t> corrupt = file;
      corrupt[at] ^= 0x5A;
      EXPECT_NE(error_of(writer, corrupt), "") << describe(s) << " byte " << at;
    }
    EXPECT_EQ(error_of(writer, file), "");
  }
}

// Non-interlaced rows are decoded only down to the region's last: a file cut below it still
// gives the region, and the whole image is an error.
TEST(PngDecoder, RowsBelowTheRegionAreNotDecoded) {
  PngSpec s;
  s.width = 64;
  s.height = 64;
  const PngFile f = make_png(s, 3);
  const Reference ref = reference_of(f);
  const std::vector<uint8_t> cut(f.bytes.begin(),
                                 f.bytes.begin() + static_cast<long>(f.bytes.size() * 3 / 4));
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kPng, DecodeLimits{}, DecodeOptions{});
  d->begin(cut.data(), cut.size());
  const DecodedImage top = d->finish_region(10, 2, 20, 6, 20, 6);
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 20; ++c) {
      for (int ch = 0; ch < 3; ++ch) {
        ASSERT_EQ(top.pixels[r * top.stride + c * 3 + ch],
                  ref.rgbx[((2 + r) * 64 + 10 + c) * 4 + ch]);
      }
    }
  }
  d->begin(cut.data(), cut.size());
  EXPECT_THROW(d->finish_region(0, 0, 64, 64, 64, 64), detail::ImageDecodeError);
}

TEST(ImageFormats, DetectedByContentAndFormatsWithoutACodecAreNamed) {
  PngSpec s;
  EXPECT_EQ(detail::detect_format(make_png(s, 1).bytes.data(), 33), detail::ImageFormat::kPng);
  const std::vector<uint8_t> jpeg = make_photo_jpeg(8, 8, 1);
  EXPECT_EQ(detail::detect_format(jpeg.data(), jpeg.size()), detail::ImageFormat::kJpeg);
  const std::string gif = "GIF89a\x01\x00\x01\x00\x00\x00\x00;";
  const std::string tiff("II*\0\x08\0\0\0", 8);
  const std::string webp("RIFF\x10\0\0\0WEBPVP8L", 16);
  const std::string bmp = "BM\x3a\0\0\0";
  const std::string pnm = "P6\n1 1\n255\n";
  ImageWriter writer(ImageTransform::train(8));
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  EXPECT_NE(error_of(writer, bytes(gif))
                .find("a GIF image: no codec for GIF (Conveyor decodes JPEG, PNG and WebP)"),
            std::string::npos)
      << error_of(writer, bytes(gif));
  EXPECT_NE(error_of(writer, bytes(tiff)).find("a TIFF image: no codec for TIFF"),
            std::string::npos);
  // WebP has its codec (webp_test): a header alone is a WebP decode error, not "no codec".
  EXPECT_NE(error_of(writer, bytes(webp)).find("WebP decode failed"), std::string::npos)
      << error_of(writer, bytes(webp));
  EXPECT_NE(error_of(writer, bytes(bmp)).find("a BMP image: no codec for BMP"), std::string::npos);
  EXPECT_NE(error_of(writer, bytes(pnm)).find("a PNM image: no codec for PNM"), std::string::npos);
  EXPECT_NE(error_of(writer, bytes("<html>")).find("first bytes 3c 68 74 6d 6c 3e"),
            std::string::npos)
      << error_of(writer, bytes("<html>"));
  EXPECT_NE(error_of(writer, {}).find("an empty file"), std::string::npos);
}

// An ImageNet-like folder: JPEGs, a PNG named .JPEG (n02105855_2933.JPEG), a .png and a .PNG;
// every file is read, each PNG's row as libpng's decode and the same transform give it.
TEST(ImageFolderFormats, APngNamedJpegAmongJpegsIsReadByItsContent) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"n02105855"}, 3);
  PngSpec gray16;
  gray16.width = 40;
  gray16.height = 30;
  gray16.color_type = 0;
  gray16.bit_depth = 16;
  PngSpec palette;
  palette.width = 31;
  palette.height = 45;
  palette.color_type = 3;
  palette.bit_depth = 4;
  palette.interlaced = true;
  palette.transparency = true;
  PngSpec rgba;
  rgba.width = 50;
  rgba.height = 37;
  rgba.color_type = 6;
  const std::map<std::string, PngFile> pngs = {{"n02105855/n02105855_2933.JPEG", make_png(rgba, 1)},
                                               {"n02105855/gray.png", make_png(gray16, 2)},
                                               {"n02105855/palette.PNG", make_png(palette, 3)}};
  for (const auto& [name, f] : pngs) write_bytes(dir / name, f.bytes);
  ImageTransform t = ImageTransform::train(16);
  auto source = std::shared_ptr<ImageSource>(ImageSource::image_folder(dir.path(), t));
  ASSERT_EQ(source->size(), 6u);
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.seed = 5;
  DataLoader loader(source, o);
  std::set<size_t> seen;
  size_t pngs_checked = 0;
  for (Batch& b : loader) {
    const at::Tensor images = b.images().contiguous();
    for (size_t r = 0; r < b.size(); ++r) {
      seen.insert(b.indices[r]);
      const std::string name =
          std::filesystem::relative(source->items()[b.indices[r]].path, dir.path()).string();
      const auto png = pngs.find(name);
      if (png == pngs.end()) continue;
      const SampleContext ctx{0, b.indices[r], o.seed, 0};
      const std::vector<uint8_t> expected = expected_row(reference_of(png->second), t, ctx);
      const auto* got = images[static_cast<int64_t>(r)].data_ptr<uint8_t>();
      EXPECT_EQ(std::vector<uint8_t>(got, got + expected.size()), expected) << name;
      ++pngs_checked;
    }
  }
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(pngs_checked, 3u);
}

// A GIF named .jpg and a TIFF named .tif: under kRaise each is a SampleError naming the file and
// the format found; under kSkip each is a counted skip and every other file is read.
TEST(ImageFolderFormats, AFormatWithoutACodecIsNamedOrSkipped) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a"}, 3);
  PngSpec s;
  s.width = 20;
  s.height = 20;
  write_bytes(dir / "a/real.png", make_png(s, 1).bytes);
  const std::string gif = "GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00,";
  write_bytes(dir / "a/animated.jpg", std::vector<uint8_t>(gif.begin(), gif.end()));
  const std::string tiff("II*\0\x08\0\0\0\0\0", 10);
  write_bytes(dir / "a/scan.tif", std::vector<uint8_t>(tiff.begin(), tiff.end()));
  auto source = std::shared_ptr<ImageSource>(
      ImageSource::image_folder(dir.path(), ImageTransform::train(16)));
  ASSERT_EQ(source->size(), 6u);
  LoaderOptions o;
  o.batch_size = 1;
  o.workers = 2;
  std::map<std::string, std::string> failed;
  {
    DataLoader loader(source, o);
    testing::finishes_within(std::chrono::seconds(20), "formats without a codec, raise", [&] {
      for (;;) {
        try {
          if (!loader.next()) break;
        } catch (const SampleError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(e.path()), std::string::npos) << what;
          failed[std::filesystem::path(e.path()).filename().string()] = what;
        }
      }
    });
  }
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_NE(failed["animated.jpg"].find("a GIF image: no codec for GIF"), std::string::npos)
      << failed["animated.jpg"];
  EXPECT_NE(failed["scan.tif"].find("a TIFF image: no codec for TIFF"), std::string::npos)
      << failed["scan.tif"];

  o.on_error = ErrorPolicy::kSkip;
  o.batch_size = 2;
  DataLoader skipping(source, o);
  size_t rows = 0;
  for (Batch& b : skipping) {
    rows += b.size();
    for (size_t idx : b.indices) {
      const std::string path = source->items()[idx].path;
      EXPECT_EQ(path.find("animated"), std::string::npos);
      EXPECT_EQ(path.find("scan"), std::string::npos);
    }
  }
  EXPECT_EQ(rows, 6u);
  EXPECT_EQ(skipping.stats().skipped, 2u);
}

}  // namespace
}  // namespace conveyor
