// Image sources: folder layout and labels, file lists, the transform's pixels, and bad files
// through the whole loader.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <turbojpeg.h>
#include <opencv2/imgproc.hpp>

#include "many_scans_jpeg.h"
#include "test_support.h"

namespace conveyor {
namespace {

using testing::TempDir;
using testing::write_bytes;

// torchvision's extensions (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case) are listed,
// whatever the files hold (each is decoded by its content, and refused by it: png_test).
TEST(ImageFolder, LabelsFollowSortedClassFoldersAndOnlyImageFilesCount) {
  TempDir dir;
  write_bytes(dir / "zebra/b.jpg", make_photo_jpeg(16, 16, 1));
  write_bytes(dir / "zebra/a.JPEG", make_photo_jpeg(16, 16, 2));
  write_bytes(dir / "apple/x.Jpg", make_photo_jpeg(16, 16, 3));
  write_bytes(dir / "apple/nested/y.jpeg", make_photo_jpeg(16, 16, 4));
  write_bytes(dir / "apple/notes.txt", {'h', 'i'});
  write_bytes(dir / "apple/pic.png", {1, 2, 3});
  write_bytes(dir / "apple/anim.gif", {'G', 'I', 'F'});           // not an ImageFolder extension
  std::filesystem::create_directories(dir / "mango/folder.jpg");  // a folder named like an image
  write_bytes(dir / "stray.jpg", make_photo_jpeg(16, 16, 5));     // not in a class folder
  auto source = ImageSource::image_folder(dir.path(), ImageTransform::train(8));
  EXPECT_EQ(source->classes(), (std::vector<std::string>{"apple", "mango", "zebra"}));
  ASSERT_EQ(source->size(), 5u);
  std::vector<std::pair<std::string, int64_t>> got;
  for (const auto& item : source->items()) {
    got.emplace_back(std::filesystem::relative(item.path, dir.path()).string(), item.label);
  }
  EXPECT_EQ(got, (std::vector<std::pair<std::string, int64_t>>{{"apple/nested/y.jpeg", 0},
                                                               {"apple/pic.png", 0},
                                                               {"apple/x.Jpg", 0},
                                                               {"zebra/a.JPEG", 2},
                                                               {"zebra/b.jpg", 2}}));
}

TEST(ImageFolder, MissingOrEmptyFoldersAreClearErrors) {
  TempDir dir;
  try {
    ImageSource::image_folder(dir / "nope", ImageTransform::train());
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
  }
  std::filesystem::create_directories(dir / "empty_class");
  EXPECT_THROW(ImageSource::image_folder(dir.path(), ImageTransform::train()), std::runtime_error);
}

TEST(FileList, ReadsPathsAndLabelsAndNamesTheBadLine) {
  TempDir dir;
  write_bytes(dir / "imgs/a.jpg", make_photo_jpeg(16, 16, 1));
  {
    std::ofstream(dir / "list.txt") << "# comment\nimgs/a.jpg\t3\n"
                                    << (dir / "imgs/a.jpg").string() << "\t0\n";
  }
  auto source = ImageSource::file_list(dir / "list.txt", ImageTransform::train(8));
  ASSERT_EQ(source->size(), 2u);
  EXPECT_EQ(source->items()[0].label, 3);
  EXPECT_EQ(source->items()[0].path, (dir / "imgs/a.jpg").string());
  { std::ofstream(dir / "bad.txt") << "imgs/a.jpg\t1\nimgs/a.jpg 2\n"; }
  try {
    ImageSource::file_list(dir / "bad.txt", ImageTransform::train());
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt:2"), std::string::npos) << e.what();
  }
}

TEST(Transforms, RandomResizedCropFollowsTorchvisionRulesAndIsDeterministic) {
  ImageTransform t = ImageTransform::train(224);
  size_t flips = 0;
  for (size_t i = 0; i < 2000; ++i) {
    CropBox b = choose_crop(t, 500, 375, 7, 2, i);
    CropBox again = choose_crop(t, 500, 375, 7, 2, i);
    EXPECT_EQ(b.x, again.x);
    EXPECT_EQ(b.width, again.width);
    EXPECT_EQ(b.flip, again.flip);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_LE(b.x + b.width, 500);
    ASSERT_LE(b.y + b.height, 375);
    double area = static_cast<double>(b.width) * b.height / (500.0 * 375.0);
    EXPECT_GE(area, 0.07);
    EXPECT_LE(area, 1.0);
    flips += b.flip;
  }
  EXPECT_GT(flips, 850u);
  EXPECT_LT(flips, 1150u);
  // Different epochs give different crops of the same sample.
  EXPECT_NE(choose_crop(t, 500, 375, 7, 0, 1).x + choose_crop(t, 500, 375, 7, 0, 1).width * 1000,
            choose_crop(t, 500, 375, 7, 1, 1).x + choose_crop(t, 500, 375, 7, 1, 1).width * 1000);
  // Center crop for evaluation: 224 of a 256-short-side resize.
  CropBox c = choose_crop(ImageTransform::eval(224, 256), 500, 375, 0, 0, 0);
  EXPECT_EQ(c.height, 328);  // 224 * 375 / 256
  EXPECT_EQ(c.width, 328);
  EXPECT_EQ(c.x, (500 - 328) / 2);
  EXPECT_FALSE(c.flip);
}

// The transform's output against a reference: a full TurboJPEG decode, the same crop, an OpenCV
// area resize, the same flip.
TEST(ImageWriter, PixelsMatchAReferenceDecodeCropAndResize) {
  auto jpeg = make_photo_jpeg(500, 375, 21);
  tjhandle h = tjInitDecompress();
  cv::Mat full(375, 500, CV_8UC3);
  ASSERT_EQ(tjDecompress2(h, jpeg.data(), jpeg.size(), full.data, 500, 0, 375, TJPF_RGB, 0), 0);
  tjDestroy(h);
  for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
    ImageTransform t = ImageTransform::train(224);
    t.layout = layout;
    ImageWriter writer(t);
    for (size_t index = 0; index < 12; ++index) {
      SampleContext ctx{0, index, 5, 0};
      std::vector<std::byte> out(224 * 224 * 3);
      writer.write(jpeg.data(), jpeg.size(), ctx, out.data());
      CropBox box = choose_crop(t, 500, 375, 5, 0, index);
      cv::Mat ref;
      cv::resize(full(cv::Rect(box.x, box.y, box.width, box.height)), ref, cv::Size(224, 224), 0, 0,
                 cv::INTER_AREA);
      if (box.flip) cv::flip(ref, ref, 1);
      double diff = 0;
      for (int y = 0; y < 224; ++y) {
        for (int x = 0; x < 224; ++x) {
          for (int c = 0; c < 3; ++c) {
            size_t o = layout == ImageLayout::kHWC
                           ? (static_cast<size_t>(y) * 224 + x) * 3 + c
                           : static_cast<size_t>(c) * 224 * 224 + y * 224 + x;
            diff += std::abs(static_cast<int>(out[o]) - ref.at<cv::Vec3b>(y, x)[c]);
          }
        }
      }
      diff /= 224.0 * 224 * 3;
      EXPECT_LT(diff, 12.0) << "index " << index << " scale " << writer.last_scale();
    }
  }
}

TEST(ImageWriter, ExactWhenNoResizeIsNeeded) {
  auto jpeg = make_photo_jpeg(64, 64, 9);
  tjhandle h = tjInitDecompress();
  std::vector<uint8_t> ref(64 * 64 * 3);
  // ImageWriter upsamples chroma by replication (cheaper; see BENCHMARKS.md), which is
  // TurboJPEG's TJFLAG_FASTUPSAMPLE decode.
  ASSERT_EQ(tjDecompress2(h, jpeg.data(), jpeg.size(), ref.data(), 64, 0, 64, TJPF_RGB,
                          TJFLAG_FASTUPSAMPLE),
            0);
  tjDestroy(h);
  ImageTransform t;
  t.mode = ImageTransform::Mode::kResize;
  t.size = 64;
  t.flip_probability = 0;
  ImageWriter writer(t);
  std::vector<std::byte> out(64 * 64 * 3);
  writer.write(jpeg.data(), jpeg.size(), SampleContext{}, out.data());
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 64 * 64; ++i) {
      ASSERT_EQ(static_cast<uint8_t>(out[static_cast<size_t>(c) * 4096 + i]), ref[i * 3 + c]);
    }
  }
}

// Grayscale and CMYK JPEGs come out as three RGB planes through the RGBX fast path too.
TEST(ImageWriter, WritesGrayscaleAndCmykAsRgb) {
  const int w = 40, h = 30, side = 16;
  auto encode = [&](const std::vector<uint8_t>& pixels, int format, int subsampling) {
    tjhandle handle = tjInitCompress();
    unsigned char* data = nullptr;
    unsigned long size = 0;
    EXPECT_EQ(tjCompress2(handle, pixels.data(), w, 0, h, format, &data, &size, subsampling, 95, 0),
              0);
    std::vector<uint8_t> jpeg(data, data + size);
    tjFree(data);
    tjDestroy(handle);
    return jpeg;
  };
  std::vector<uint8_t> grey(static_cast<size_t>(w) * h * 3, 100);
  std::vector<uint8_t> cyan(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < cyan.size(); i += 4) {  // Adobe-inverted CMYK: 0 = full ink
    cyan[i] = 0;
    cyan[i + 1] = cyan[i + 2] = cyan[i + 3] = 255;
  }
  struct Case {
    const char* name;
    std::vector<uint8_t> jpeg;
    int r, g, b;
  };
  for (const Case& c : {Case{"gray", encode(grey, TJPF_RGB, TJSAMP_GRAY), 100, 100, 100},
                        Case{"ycck", encode(cyan, TJPF_CMYK, TJSAMP_420), 0, 255, 255}}) {
    SCOPED_TRACE(c.name);
    for (int flip : {0, 1}) {
      ImageTransform t;
      t.mode = ImageTransform::Mode::kResize;
      t.size = side;
      t.flip_probability = flip;
      ImageWriter writer(t);
      std::vector<std::byte> out(side * side * 3);
      writer.write(c.jpeg.data(), c.jpeg.size(), SampleContext{}, out.data());
      const int expected[3] = {c.r, c.g, c.b};
      for (int ch = 0; ch < 3; ++ch) {
        for (int i = 0; i < side * side; i += 37) {
          EXPECT_NEAR(static_cast<int>(out[static_cast<size_t>(ch * side * side + i)]),
                      expected[ch], 6)
              << "channel " << ch << " pixel " << i;
        }
      }
    }
  }
}

// `jpeg` with an APP1 Exif block that says `orientation`, right after SOI: "Exif\0\0", a
// big-endian TIFF header and an IFD0 with the one SHORT entry.
std::vector<uint8_t> with_orientation(std::vector<uint8_t> jpeg, int orientation) {
  const auto o = static_cast<uint8_t>(orientation);
  const std::vector<uint8_t> payload = {'E',  'x',  'i', 'f', 0, 0,        // APP1 Exif header
                                        'M',  'M',  0,   42,  0, 0, 0, 8,  // TIFF, IFD0 at 8
                                        0,    1,                           // one entry:
                                        0x01, 0x12, 0,   3,   0, 0, 0, 1,  // Orientation SHORT x1
                                        0,    o,    0,   0,                // its value
                                        0,    0,    0,   0};               // no next IFD
  const size_t length = payload.size() + 2;
  std::vector<uint8_t> segment = {0xFF, 0xE1, static_cast<uint8_t>(length >> 8),
                                  static_cast<uint8_t>(length & 0xFF)};
  segment.insert(segment.end(), payload.begin(), payload.end());
  jpeg.insert(jpeg.begin() + 2, segment.begin(), segment.end());
  return jpeg;
}

// Stored pixels of four solid quadrants (red, green / blue, white), 96x64: not square, so that
// orientations 5..8 swap width and height.
std::vector<uint8_t> quadrants_with_orientation(int orientation) {
  const int w = 96, h = 64;
  cv::Mat img(h, w, CV_8UC3);
  img(cv::Rect(0, 0, w / 2, h / 2)).setTo(cv::Scalar(255, 0, 0));
  img(cv::Rect(w / 2, 0, w / 2, h / 2)).setTo(cv::Scalar(0, 255, 0));
  img(cv::Rect(0, h / 2, w / 2, h / 2)).setTo(cv::Scalar(0, 0, 255));
  img(cv::Rect(w / 2, h / 2, w / 2, h / 2)).setTo(cv::Scalar(255, 255, 255));
  return with_orientation(encode_jpeg(img.data, w, h, 95), orientation);
}

TEST(ImageWriter, ExifOrientationTurnsTheImageUprightWhenAsked) {
  // Where the stored red (top-left) and green (top-right) quadrants show up once upright:
  // 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right.
  const int red_at[9] = {0, 0, 1, 3, 2, 0, 1, 3, 2};
  const int green_at[9] = {0, 1, 0, 2, 3, 2, 3, 1, 0};
  const int side = 32;
  for (int orientation = 1; orientation <= 8; ++orientation) {
    SCOPED_TRACE("orientation " + std::to_string(orientation));
    auto jpeg = quadrants_with_orientation(orientation);
    for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
      for (bool honour : {true, false}) {
        ImageTransform t;
        t.mode = ImageTransform::Mode::kResize;
        t.size = side;
        t.flip_probability = 0;
        t.layout = layout;
        t.exif_orientation = honour;
        ImageWriter writer(t);
        std::vector<std::byte> out(side * side * 3);
        writer.write(jpeg.data(), jpeg.size(), SampleContext{}, out.data());
        auto pixel = [&](int quadrant, int c) {
          const int x = quadrant % 2 == 0 ? side / 4 : 3 * side / 4;
          const int y = quadrant < 2 ? side / 4 : 3 * side / 4;
          size_t o = layout == ImageLayout::kHWC
                         ? (static_cast<size_t>(y) * side + x) * 3 + c
                         : static_cast<size_t>(c) * side * side + y * side + x;
          return static_cast<int>(out[o]);
        };
        const int red = honour ? red_at[orientation] : 0;
        const int green = honour ? green_at[orientation] : 1;
        EXPECT_NEAR(pixel(red, 0), 255, 10);
        EXPECT_NEAR(pixel(red, 1), 0, 10);
        EXPECT_NEAR(pixel(red, 2), 0, 10);
        EXPECT_NEAR(pixel(green, 0), 0, 10);
        EXPECT_NEAR(pixel(green, 1), 255, 10);
        EXPECT_NEAR(pixel(green, 2), 0, 10);
      }
    }
  }
}

// Random crops and flips of an EXIF-oriented photo against a reference that turns the whole
// decoded image upright first, then crops, resizes and flips it.
TEST(ImageWriter, ExifOrientationChoosesTheCropInTheUprightImage) {
  const auto photo = make_photo_jpeg(200, 120, 31);
  tjhandle h = tjInitDecompress();
  cv::Mat stored(120, 200, CV_8UC3);
  ASSERT_EQ(tjDecompress2(h, photo.data(), photo.size(), stored.data, 200, 0, 120, TJPF_RGB,
                          TJFLAG_FASTUPSAMPLE),
            0);
  tjDestroy(h);
  for (int orientation = 1; orientation <= 8; ++orientation) {
    SCOPED_TRACE("orientation " + std::to_string(orientation));
    cv::Mat upright;
    switch (orientation) {
      case 2:
        cv::flip(stored, upright, 1);
        break;
      case 3:
        cv::flip(stored, upright, -1);
        break;
      case 4:
        cv::flip(stored, upright, 0);
        break;
      case 5:
        cv::transpose(stored, upright);
        break;
      case 6:
        cv::rotate(stored, upright, cv::ROTATE_90_CLOCKWISE);
        break;
      case 7:
        cv::transpose(stored, upright);
        cv::flip(upright, upright, -1);
        break;
      case 8:
        cv::rotate(stored, upright, cv::ROTATE_90_COUNTERCLOCKWISE);
        break;
      default:
        upright = stored.clone();
    }
    const auto jpeg = with_orientation(photo, orientation);
    ImageTransform t = ImageTransform::train(48);
    t.exif_orientation = true;
    ImageWriter writer(t);
    for (size_t i = 0; i < 6; ++i) {
      SampleContext ctx{0, i, 3, 0};
      std::vector<std::byte> out(48 * 48 * 3);
      writer.write(jpeg.data(), jpeg.size(), ctx, out.data());
      CropBox box = choose_crop(t, upright.cols, upright.rows, 3, 0, i);
      ASSERT_LE(box.x + box.width, upright.cols);
      ASSERT_LE(box.y + box.height, upright.rows);
      cv::Mat ref;
      cv::resize(upright(cv::Rect(box.x, box.y, box.width, box.height)), ref, cv::Size(48, 48), 0,
                 0, cv::INTER_AREA);
      if (box.flip) cv::flip(ref, ref, 1);
      double diff = 0;
      for (int y = 0; y < 48; ++y) {
        for (int x = 0; x < 48; ++x) {
          for (int c = 0; c < 3; ++c) {
            diff += std::abs(static_cast<int>(out[static_cast<size_t>(c) * 48 * 48 + y * 48 + x]) -
                             ref.at<cv::Vec3b>(y, x)[c]);
          }
        }
      }
      // Same tolerance as PixelsMatchAReferenceDecodeCropAndResize; a crop taken from the wrong
      // place or turned the wrong way differs by far more on this textured photo.
      EXPECT_LT(diff / (48.0 * 48 * 3), 12.0) << "index " << i;
    }
  }
}

TEST(ImageLoader, DeliversEveryImageOnceWithItsLabel) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"cat", "dog", "eel"}, 7);
  auto source = std::shared_ptr<ImageSource>(
      ImageSource::image_folder(dir.path(), ImageTransform::train(32)));
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  DataLoader loader(source, o, RandomSampler::make(1));
  std::multiset<size_t> seen;
  for (Batch& b : loader) {
    EXPECT_EQ(b.images().sizes(),
              (std::vector<int64_t>{static_cast<int64_t>(b.size()), 3, 32, 32}));
    EXPECT_EQ(b.images().scalar_type(), at::kByte);
    EXPECT_EQ(b.labels().scalar_type(), at::kLong);
    for (size_t r = 0; r < b.size(); ++r) {
      seen.insert(b.indices[r]);
      EXPECT_EQ(b.labels()[static_cast<int64_t>(r)].item<int64_t>(),
                source->items()[b.indices[r]].label);
    }
    EXPECT_GT(b.images().to(at::kFloat).std().item<float>(), 5.0f) << "images are not blank";
  }
  EXPECT_EQ(seen.size(), 21u);
  EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), 21u);
}

// Every kind of bad file in one folder: each must come back as an error naming it, or be skipped
// and counted; never a crash or a hang.
TEST(ImageLoader, BadFilesAreNamedOrSkipped) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a"}, 4);
  auto good = make_photo_jpeg(64, 48, 99);
  std::vector<uint8_t> truncated(good.begin(), good.begin() + static_cast<long>(good.size() / 2));
  write_bytes(dir / "a/bad_truncated.jpg", truncated);
  write_bytes(dir / "a/bad_garbage.jpg", std::vector<uint8_t>(500, 7));
  write_bytes(dir / "a/bad_empty.jpg", {});
  std::filesystem::create_symlink(dir / "a/missing_target.jpg", dir / "a/bad_dangling.jpg");
  ASSERT_EQ(::mkfifo((dir / "a/bad_fifo.jpg").c_str(), 0644), 0);
  auto source = std::shared_ptr<ImageSource>(
      ImageSource::image_folder(dir.path(), ImageTransform::train(16)));
  ASSERT_EQ(source->size(), 9u);

  LoaderOptions o;
  o.batch_size = 1;
  o.workers = 2;
  std::set<std::string> failed;
  {
    DataLoader loader(source, o);
    testing::finishes_within(std::chrono::seconds(20), "bad files, raise", [&] {
      for (;;) {
        try {
          if (!loader.next()) break;
        } catch (const SampleError& e) {
          std::string what = e.what();
          EXPECT_NE(what.find(e.path()), std::string::npos) << what;
          EXPECT_NE(what.find("sample " + std::to_string(e.index())), std::string::npos) << what;
          failed.insert(std::filesystem::path(e.path()).filename().string());
        }
      }
    });
  }
  EXPECT_EQ(failed, (std::set<std::string>{"bad_dangling.jpg", "bad_empty.jpg", "bad_fifo.jpg",
                                           "bad_garbage.jpg", "bad_truncated.jpg"}));

  o.on_error = ErrorPolicy::kSkip;
  o.batch_size = 3;
  DataLoader skipping(source, o);
  size_t rows = 0;
  for (Batch& b : skipping) {
    rows += b.size();
    for (size_t idx : b.indices) {
      EXPECT_EQ(source->items()[idx].path.find("bad_"), std::string::npos);
    }
  }
  EXPECT_EQ(rows, 9u);
  EXPECT_EQ(skipping.stats().skipped, 5u);
}

// Files over the limits every image meets (issue 29), each refused before the work it would cost:
// a sparse file larger than kMaxImageBytes (as `truncate -s 3G` makes one: no disk used, and
// before the limit 3.5 GB of memory per worker), and a progressive JPEG of more scans than
// DecodeLimits::max_scans. Each is an error naming the file and the limit, or skipped and counted.
TEST(ImageLoader, FilesOverTheImageLimitsAreNamedOrSkipped) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a"}, 3);
  write_bytes(dir / "a/bad_scans.jpg",
              testing::progressive_jpeg_with_scans(48, 40, DecodeLimits{}.max_scans + 1));
  const std::pair<const char*, uint64_t> sparse[] = {{"bad_sparse_3g.jpg", uint64_t{3} << 30},
                                                     {"bad_sparse_limit.jpg", kMaxImageBytes + 1}};
  for (const auto& [name, size] : sparse) {
    write_bytes(dir / "a" / name, {});
    std::filesystem::resize_file(dir / "a" / name, size);
  }
  auto source = std::shared_ptr<ImageSource>(
      ImageSource::image_folder(dir.path(), ImageTransform::train(16)));
  ASSERT_EQ(source->size(), 6u);

  LoaderOptions o;
  o.batch_size = 1;
  o.workers = 1;
  std::map<std::string, std::string> errors;  // file name -> message
  {
    DataLoader loader(source, o);
    testing::finishes_within(std::chrono::seconds(20), "files over the limits, raise", [&] {
      for (;;) {
        try {
          if (!loader.next()) break;
        } catch (const SampleError& e) {
          errors[std::filesystem::path(e.path()).filename().string()] = e.what();
        }
      }
    });
  }
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_NE(errors["bad_scans.jpg"].find("more than 500 scans"), std::string::npos)
      << errors["bad_scans.jpg"];
  EXPECT_NE(errors["bad_sparse_3g.jpg"].find("3221225472 bytes, more than the limit of 268435456"),
            std::string::npos)
      << errors["bad_sparse_3g.jpg"];
  EXPECT_NE(
      errors["bad_sparse_limit.jpg"].find("268435457 bytes, more than the limit of 268435456"),
      std::string::npos)
      << errors["bad_sparse_limit.jpg"];
  for (const auto& [name, what] : errors) {
    EXPECT_NE(what.find((dir / "a" / name).string()), std::string::npos) << what;
  }

  o.on_error = ErrorPolicy::kSkip;
  DataLoader skipping(source, o);
  size_t rows = 0;
  for (Batch& b : skipping) {
    rows += b.size();
    for (size_t idx : b.indices) {
      EXPECT_EQ(source->items()[idx].path.find("bad_"), std::string::npos);
    }
  }
  EXPECT_EQ(rows, 6u);  // each skipped sample's row is filled by another
  EXPECT_EQ(skipping.stats().skipped, 3u);
}

}  // namespace
}  // namespace conveyor
