// The photo-like synthetic dataset. Smooth synthetic images decode several times faster than
// photos (their DCT blocks are nearly empty), which misleads every decode optimization, so each
// image here layers what makes photos expensive to decode: overlapping shapes with hard and soft
// edges, mid-frequency texture, fine strokes, and per-pixel sensor-like noise.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "synthetic.h"

namespace conveyor {
namespace {

constexpr int kGeneratorVersion = 1;

cv::Scalar random_color(SampleRng& rng) {
  return cv::Scalar(rng.uniform(0, 255), rng.uniform(0, 255), rng.uniform(0, 255));
}

}  // namespace

namespace {

cv::Mat make_photo(int width, int height, uint64_t seed) {
  SampleRng rng(seed, 0x9407, 0);
  cv::Mat img(height, width, CV_8UC3);
  // Sky-to-ground gradient.
  cv::Scalar top = random_color(rng), bottom = random_color(rng);
  for (int y = 0; y < height; ++y) {
    double t = static_cast<double>(y) / std::max(1, height - 1);
    img.row(y).setTo(top * (1.0 - t) + bottom * t);
  }
  // Objects: filled ellipses, rectangles and polygons, some with soft edges.
  int objects = 12 + rng.randint(0, 20);
  for (int i = 0; i < objects; ++i) {
    cv::Point c(rng.randint(0, width), rng.randint(0, height));
    cv::Scalar color = random_color(rng);
    switch (rng.randint(0, 3)) {
      case 0:
        cv::ellipse(img, c, cv::Size(rng.randint(5, width / 3 + 6), rng.randint(5, height / 3 + 6)),
                    rng.uniform(0, 180), 0, 360, color, cv::FILLED, cv::LINE_AA);
        break;
      case 1:
        cv::rectangle(
            img, c,
            c + cv::Point(rng.randint(-width / 3, width / 3), rng.randint(-height / 3, height / 3)),
            color, cv::FILLED, cv::LINE_AA);
        break;
      default: {
        std::vector<cv::Point> poly;
        for (int k = 0; k < 3 + rng.randint(0, 5); ++k) {
          poly.emplace_back(c.x + rng.randint(-width / 4, width / 4 + 1),
                            c.y + rng.randint(-height / 4, height / 4 + 1));
        }
        cv::fillPoly(img, std::vector<std::vector<cv::Point>>{poly}, color, cv::LINE_AA);
      }
    }
  }
  cv::GaussianBlur(img, img, cv::Size(0, 0), rng.uniform(0.6, 1.6));
  // Fine strokes (foliage, hair, fabric).
  int strokes = 150 + rng.randint(0, 300);
  for (int i = 0; i < strokes; ++i) {
    cv::Point a(rng.randint(0, width), rng.randint(0, height));
    cv::Point b = a + cv::Point(rng.randint(-12, 13), rng.randint(-12, 13));
    cv::line(img, a, b, random_color(rng), 1, cv::LINE_AA);
  }
  // Mid-frequency texture: coarse noise upsampled, in every channel.
  cv::Mat coarse(std::max(2, height / 6), std::max(2, width / 6), CV_32FC3);
  cv::RNG cvrng(splitmix64(seed));
  cvrng.fill(coarse, cv::RNG::NORMAL, 0.0, 18.0);
  cv::Mat texture;
  cv::resize(coarse, texture, img.size(), 0, 0, cv::INTER_CUBIC);
  // Per-pixel sensor-like noise.
  cv::Mat noise(img.size(), CV_32FC3);
  cvrng.fill(noise, cv::RNG::NORMAL, 0.0, rng.uniform(16.0, 21.0));
  cv::Mat f;
  img.convertTo(f, CV_32FC3);
  f += texture + noise;
  f.convertTo(img, CV_8UC3);  // saturating
  return img;
}

// GeneratorOptions::mixed: how file `index` is encoded.
EncodeOptions mixed_encoding(size_t index, int quality) {
  using Color = EncodeOptions::Color;
  EncodeOptions o;
  o.quality = quality;
  switch (index % 25) {
    case 3:
      o.color = Color::kGray;
      break;
    case 7:
      o.color = Color::kCmyk;
      o.adobe_marker = true;
      break;
    case 11:
      o.color = Color::kCmyk;
      o.adobe_marker = false;
      break;
    case 15:
      o.color = Color::kYcck;
      break;
    case 5:
    case 19:
      o.progressive = true;
      break;
    case 22:
      o.h_samp = 1;
      o.v_samp = 1;
      break;
    default:
      break;
  }
  return o;
}

}  // namespace

std::vector<uint8_t> make_photo_jpeg(int width, int height, uint64_t seed, int quality) {
  cv::Mat img = make_photo(width, height, seed);
  return encode_jpeg(img.ptr<uint8_t>(), width, height, quality);
}

std::vector<uint8_t> make_grid_jpeg(int width, int height) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p =
          &rgb[(static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3];
      p[0] = x % 2 ? 255 : 0;
      p[1] = y % 2 ? 255 : 0;
      p[2] = (x / 2 + y / 2) % 2 ? 255 : 0;
    }
  }
  EncodeOptions e;
  e.quality = 100;
  e.h_samp = 1;
  e.v_samp = 1;
  return encode_jpeg(rgb.data(), width, height, e);
}

GeneratedDataset generate_image_folder(const std::filesystem::path& root,
                                       const GeneratorOptions& options) {
  namespace fs = std::filesystem;
  std::ostringstream stamp_text;
  stamp_text << "conveyor photo-like dataset v" << kGeneratorVersion
             << " classes=" << options.classes << " per_class=" << options.images_per_class
             << " quality=" << options.quality << " seed=" << options.seed
             << (options.mixed ? " mixed=v1" : "") << "\n";
  const fs::path stamp = root / ".conveyor-dataset";
  GeneratedDataset result;
  result.root = root;
  result.images = options.classes * options.images_per_class;
  {
    std::ifstream in(stamp);
    std::stringstream existing;
    existing << in.rdbuf();
    if (in && existing.str() == stamp_text.str()) {
      for (const auto& e : fs::recursive_directory_iterator(root)) {
        if (e.is_regular_file() && e.path().extension() == ".jpg") result.bytes += e.file_size();
      }
      result.reused = true;
      return result;
    }
  }
  fs::remove(stamp);
  for (size_t c = 0; c < options.classes; ++c) {
    char name[32];
    std::snprintf(name, sizeof name, "class_%03zu", c);
    fs::create_directories(root / name);
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex failure_mutex;
  auto work = [&] {
    for (size_t i = next++; i < result.images && !failed; i = next++) {
      try {
        size_t c = i / options.images_per_class;
        SampleRng shape(options.seed, 0x5123, i);
        double kind = shape.uniform(0, 1);
        int w = 500, h = 375;  // ImageNet's typical landscape size
        if (kind > 0.8) {
          w = shape.randint(300, 501);
          h = shape.randint(250, 501);
        } else if (kind > 0.6) {
          std::swap(w, h);  // portrait
        }
        const uint64_t seed = splitmix64(options.seed) ^ i;
        std::vector<uint8_t> jpeg;
        if (options.mixed) {
          cv::Mat img = make_photo(w, h, seed);
          jpeg = encode_jpeg(img.ptr<uint8_t>(), w, h, mixed_encoding(i, options.quality));
        } else {
          jpeg = make_photo_jpeg(w, h, seed, options.quality);
        }
        char name[64];
        std::snprintf(name, sizeof name, "class_%03zu/img_%06zu.jpg", c, i);
        std::ofstream out(root / name, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(jpeg.data()),
                  static_cast<std::streamsize>(jpeg.size()));
        if (!out) throw std::runtime_error("cannot write " + (root / name).string());
        bytes += jpeg.size();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failed.exchange(true)) failure = e.what();
      }
    }
  };
  size_t threads = options.threads != 0 ? options.threads
                                        : std::max<size_t>(1, std::thread::hardware_concurrency());
  {
    std::vector<std::jthread> pool;
    for (size_t t = 0; t < threads; ++t) pool.emplace_back(work);
  }
  if (failed) throw std::runtime_error("generate_image_folder: " + failure);
  std::ofstream(stamp) << stamp_text.str();
  result.bytes = bytes;
  return result;
}

}  // namespace conveyor
