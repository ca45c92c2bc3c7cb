// WebP through the codec seam (issue 32): files written by libwebp's encoder here and by Pillow
// (webp_write.py, the venv's Pillow 13), lossy and lossless, with and without alpha, at odd sizes
// from 1x1, decoded by ImageWriter, equal libwebp's full decode then the project's own crop,
// resize and flip, for many random (seed, index) crops; the decoder's regions (libwebp's cropping,
// which snaps to even x and y) equal the full decode's; a header that promises a huge image is
// refused before decoding; truncated and corrupt files are errors naming the file; a WebP named
// .jpg in an ImageFolder is read by its content; WebDataset shards with .png and .webp members
// read back through tar_shards with the default image keys.
#include <webp/encode.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codec/image_codec.h"
#include "image_writer_checks.h"
#include "png_reference.h"
#include "shards_test_support.h"
#include "test_support.h"
#include "webp_reference.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::expected_row;
using testing::Reference;
using testing::TempDir;
using testing::write_bytes;

using testing::encoded_webps;
using testing::webp_reference;
using testing::WebpFile;

std::vector<uint8_t> read_file(const fs::path& path) {
  const std::string str = testing::shards::slurp(path);
  return {str.begin(), str.end()};
}

std::vector<WebpFile> encoded_here() {
  const int sizes[][2] = {{1, 1}, {1, 7}, {9, 1}, {5, 3}, {17, 13}, {33, 31}, {64, 41}, {99, 70}};
  return encoded_webps(sizes, 1);
}

// Pillow's files (webp_write.py), written once into a folder kept for the whole test program.
struct PillowFiles {
  TempDir dir;
  std::vector<WebpFile> kinds;
  std::string error;
  PillowFiles() {
    const testing::shards::CommandResult r = testing::shards::run(
        std::string(CONVEYOR_VENV_PYTHON) + " " + WEBP_WRITE + " " + dir.path().string(), dir);
    if (r.status != 0) {
      error = r.err;
      return;
    }
    std::set<fs::path> paths;
    for (const auto& e : fs::directory_iterator(dir / "kinds")) paths.insert(e.path());
    for (const fs::path& p : paths)
      kinds.push_back({p.filename().string() + " (Pillow)", read_file(p)});
  }
};

const PillowFiles& pillow() {
  static const PillowFiles files;
  return files;
}

std::vector<WebpFile> corpus() {
  std::vector<WebpFile> files = encoded_here();
  const std::vector<WebpFile>& from_pillow = pillow().kinds;
  files.insert(files.end(), from_pillow.begin(), from_pillow.end());
  return files;
}

#define ASSERT_PILLOW_WROTE()                                                               \
  ASSERT_EQ(pillow().error, "") << "webp_write.py failed (" << CONVEYOR_VENV_PYTHON << ")"; \
  ASSERT_EQ(pillow().kinds.size(), 28u)

TEST(WebpImageWriter, EveryKindMatchesLibwebpThenTheSameCropResizeAndFlip) {
  ASSERT_PILLOW_WROTE();
  const std::vector<WebpFile> files = corpus();
  ASSERT_EQ(files.size(), 32u + 28u);
  std::vector<ImageWriter> writers = testing::checked_writers();
  testing::RowCounts counts;
  for (const WebpFile& f : files) {
    ASSERT_NO_FATAL_FAILURE(
        testing::expect_rows_match(writers, f.bytes, webp_reference(f), 12, 31, f.name, counts));
  }
  EXPECT_EQ(counts.compared, files.size() * 36);
  EXPECT_GT(counts.flipped, counts.compared / 8);
}

// libwebp's cropping starts at even x and y; the decoder's regions at odd ones too equal the full
// decode's pixels, lossy (chroma upsampled around the region as in the full decode) and lossless.
TEST(WebpDecoder, RegionsAreThoseOfTheFullDecodeAtOddAndEvenOrigins) {
  ASSERT_PILLOW_WROTE();
  std::unique_ptr<detail::ImageDecoder> d =
      detail::make_image_decoder(detail::ImageFormat::kWebp, DecodeLimits{}, DecodeOptions{});
  ASSERT_NE(d, nullptr);
  std::mt19937 rng(7);
  size_t odd_x = 0, odd_y = 0;
  for (const WebpFile& f : corpus()) {
    const Reference ref = webp_reference(f);
    for (int k = 0; k < 16; ++k) {
      const detail::ImageInfo info = d->begin(f.bytes.data(), f.bytes.size());
      ASSERT_EQ(info.width, ref.width);
      ASSERT_EQ(info.height, ref.height);
      EXPECT_EQ(info.channels, f.name.find("rgba") != std::string::npos ? 4 : 3) << f.name;
      const int x = static_cast<int>(rng() % ref.width);
      const int y = static_cast<int>(rng() % ref.height);
      const int w = 1 + static_cast<int>(rng() % (ref.width - x));
      const int h = 1 + static_cast<int>(rng() % (ref.height - y));
      odd_x += x % 2;
      odd_y += y % 2;
      const DecodedImage image = d->finish_region(x, y, w, h, w, h);
      ASSERT_NO_FATAL_FAILURE(testing::expect_region_of(ref, image, x, y, w, h, f.name));
    }
  }
  EXPECT_GT(odd_x, 100u);
  EXPECT_GT(odd_y, 100u);
}

// A lossless header (VP8L) that declares width x height, and nothing after it.
std::vector<uint8_t> webp_declaring(uint32_t width, uint32_t height) {
  const uint32_t bits = (width - 1) | (height - 1) << 14;  // then alpha 0, version 0
  std::vector<uint8_t> f = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'L'};
  const std::vector<uint8_t> chunk = {5,
                                      0,
                                      0,
                                      0,
                                      0x2f,
                                      static_cast<uint8_t>(bits),
                                      static_cast<uint8_t>(bits >> 8),
                                      static_cast<uint8_t>(bits >> 16),
                                      static_cast<uint8_t>(bits >> 24),
                                      0};
  f.insert(f.end(), chunk.begin(), chunk.end());
  const uint32_t riff = static_cast<uint32_t>(f.size() - 8);
  for (int i = 0; i < 4; ++i) f[4 + i] = static_cast<uint8_t>(riff >> (8 * i));
  return f;
}

TEST(WebpImageWriter, AHugeDeclaredSizeIsRefusedBeforeDecoding) {
  ImageWriter writer(ImageTransform::train(8));
  const std::string huge = error_of(writer, webp_declaring(16383, 16383));
  EXPECT_NE(huge.find("WebP rejected: 16383x16383 = 268402689 pixels exceeds the limit of "
                      "100000000"),
            std::string::npos)
      << huge;
  ImageTransform small = ImageTransform::train(8);
  small.limits.max_pixels = 100;
  ImageWriter strict(small);
  const std::vector<uint8_t> pixels = testing::photo_pixels(11, 10, 3, 1);
  uint8_t* out = nullptr;
  size_t size = WebPEncodeLosslessRGB(pixels.data(), 11, 10, 33, &out);
  const std::vector<uint8_t> over(out, out + size);
  WebPFree(out);
  EXPECT_NE(error_of(strict, over).find("110 pixels exceeds the limit of 100"), std::string::npos)
      << error_of(strict, over);
  size = WebPEncodeLosslessRGB(pixels.data(), 10, 10, 33, &out);
  const std::vector<uint8_t> under(out, out + size);
  WebPFree(out);
  EXPECT_EQ(error_of(strict, under), "");
}

// Cut anywhere, a file decoded whole (kResize) is an error, never a crash or a partly decoded
// image; an animated WebP is refused by name.
TEST(WebpImageWriter, TruncatedFilesAreClearErrors) {
  ImageTransform whole = ImageTransform::train(8);
  whole.mode = ImageTransform::Mode::kResize;
  ImageWriter writer(whole);
  for (const WebpFile& f : encoded_here()) {
    if (f.bytes.size() < 100) continue;
    for (size_t cut = 0; cut < f.bytes.size(); cut += 1 + f.bytes.size() / 40) {
      const std::vector<uint8_t> truncated(f.bytes.begin(),
                                           f.bytes.begin() + static_cast<long>(cut));
      EXPECT_NE(error_of(writer, truncated), "") << f.name << " cut at " << cut;
    }
    EXPECT_EQ(error_of(writer, f.bytes), "") << f.name;
  }
}

// An ImageFolder of JPEGs with a lossy WebP named .jpg, a lossless one with alpha named .webp, a
// truncated WebP and one whose VP8L signature is broken: under kRaise the two bad files are
// SampleErrors naming the file (and WebP), every other file is read by its content as libwebp's
// decode and the same transform give it.
TEST(ImageFolderFormats, AWebpNamedJpgIsReadByItsContentAndABrokenOneIsNamed) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"n01"}, 3);
  std::map<std::string, WebpFile> webps;
  for (const WebpFile& f : encoded_here()) {
    if (f.name == "lossy_rgb-99x70 (libwebp)") webps["n01/photo.jpg"] = f;
    if (f.name == "lossless_rgba-64x41 (libwebp)") webps["n01/alpha.webp"] = f;
  }
  ASSERT_EQ(webps.size(), 2u);
  for (const auto& [name, f] : webps) write_bytes(dir / name, f.bytes);
  const std::vector<uint8_t>& lossless = webps["n01/alpha.webp"].bytes;
  write_bytes(dir / "n01/truncated.webp",
              std::vector<uint8_t>(lossless.begin(), lossless.begin() + lossless.size() / 2));
  std::vector<uint8_t> broken = lossless;
  broken[20] = 0x00;  // VP8L's signature byte (0x2f)
  write_bytes(dir / "n01/broken.webp", broken);
  ImageTransform t = ImageTransform::train(16);
  auto source = std::shared_ptr<ImageSource>(ImageSource::image_folder(dir.path(), t));
  ASSERT_EQ(source->size(), 7u);
  LoaderOptions o;
  o.batch_size = 1;
  o.workers = 2;
  o.seed = 5;
  std::map<std::string, std::string> failed;
  size_t rows = 0, webps_checked = 0;
  {
    DataLoader loader(source, o);
    testing::finishes_within(std::chrono::seconds(20), "an ImageFolder with WebPs", [&] {
      for (;;) {
        std::optional<Batch> b;
        try {
          b = loader.next();
          if (!b) break;
        } catch (const SampleError& e) {
          failed[fs::path(e.path()).filename().string()] = e.what();
          continue;
        }
        ++rows;
        const size_t index = b->indices[0];
        const std::string name = fs::relative(source->items()[index].path, dir.path()).string();
        const auto webp = webps.find(name);
        if (webp == webps.end()) continue;
        const SampleContext ctx{0, index, o.seed, 0};
        const std::vector<uint8_t> expected = expected_row(webp_reference(webp->second), t, ctx);
        const at::Tensor image = b->images().contiguous();
        const auto* got = image.data_ptr<uint8_t>();
        EXPECT_EQ(std::vector<uint8_t>(got, got + expected.size()), expected) << name;
        ++webps_checked;
      }
    });
  }
  EXPECT_EQ(rows, 5u);
  EXPECT_EQ(webps_checked, 2u);
  ASSERT_EQ(failed.size(), 2u);
  for (const auto& [file, what] : failed) {
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find("WebP decode failed"), std::string::npos) << what;
  }
}

// Shards written by WebDataset's ShardWriter with .png and .webp members (webdataset_write.py
// names a member by its bytes) read back through tar_shards with the default image keys
// (Field::kDefaultImageKeys), streamed: the same samples as the ImageFolder they were written
// from, each decoded by its content.
TEST(WebDatasetShards, PngAndWebpMembersAreImages) {
  ASSERT_PILLOW_WROTE();
  const fs::path folder = pillow().dir / "folder";
  TempDir out;
  const testing::shards::CommandResult r =
      testing::shards::run(std::string(CONVEYOR_VENV_PYTHON) + " " + WEBDATASET_WRITE + " " +
                               folder.string() + " " + (out / "mixed").string() + " 4",
                           out);
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(std::stoul(r.out), 3u);
  using namespace testing::shards;
  auto shards = shards_source({(out / "mixed-{000000..000002}.tar").string()}, streamed());
  ASSERT_EQ(shards->size(), 10u) << "counted by a pass over the tar headers";
  const std::multiset<Sample> from_folder = folder_samples(folder);
  ASSERT_EQ(from_folder.size(), 10u);
  EXPECT_EQ(as_set(samples_of(read_stream(shards))), from_folder);
}

}  // namespace
}  // namespace conveyor
