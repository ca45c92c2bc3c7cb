#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <libyuv.h>

#include "conveyor/datasets.h"
#include "conveyor/internal/trace.h"
#include "conveyor/random.h"
#include "file_descriptor.h"
#include "shard_stream.h"
#include "shards.h"

namespace conveyor {

size_t FieldSpec::sample_bytes() const {
  size_t n = c10::elementSize(dtype);
  for (int64_t d : sample_shape) n *= static_cast<size_t>(d);
  return n;
}

std::string SampleSource::describe(size_t index) const { return "sample " + std::to_string(index); }

ImageTransform ImageTransform::train(int size) {
  ImageTransform t;
  t.mode = Mode::kRandomResizedCrop;
  t.size = size;
  return t;
}

ImageTransform ImageTransform::eval(int size, int resize) {
  ImageTransform t;
  t.mode = Mode::kResizeCenterCrop;
  t.size = size;
  t.resize = resize;
  t.flip_probability = 0.0;
  return t;
}

CropBox choose_crop(const ImageTransform& transform, int width, int height, uint64_t seed,
                    uint64_t epoch, size_t index) {
  SampleRng rng(seed, epoch, index);
  CropBox box{0, 0, width, height, false};
  switch (transform.mode) {
    case ImageTransform::Mode::kRandomResizedCrop: {
      const double area = static_cast<double>(width) * height;
      const double log_r0 = std::log(transform.ratio_min);
      const double log_r1 = std::log(transform.ratio_max);
      bool found = false;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        double target = area * rng.uniform(transform.scale_min, transform.scale_max);
        double aspect = std::exp(rng.uniform(log_r0, log_r1));
        int w = static_cast<int>(std::nearbyint(std::sqrt(target * aspect)));
        int h = static_cast<int>(std::nearbyint(std::sqrt(target / aspect)));
        if (w > 0 && h > 0 && w <= width && h <= height) {
          box = {rng.randint(0, width - w + 1), rng.randint(0, height - h + 1), w, h, false};
          found = true;
        }
      }
      if (!found) {  // torchvision's fallback: the central crop of the clamped aspect ratio
        double in_ratio = static_cast<double>(width) / height;
        int w = width, h = height;
        if (in_ratio < transform.ratio_min) {
          h = static_cast<int>(std::nearbyint(w / transform.ratio_min));
        } else if (in_ratio > transform.ratio_max) {
          w = static_cast<int>(std::nearbyint(h * transform.ratio_max));
        }
        box = {(width - w) / 2, (height - h) / 2, w, h, false};
      }
      break;
    }
    case ImageTransform::Mode::kResizeCenterCrop: {
      // The crop of size x size in an image whose shorter side was resized to `resize`.
      double factor = static_cast<double>(transform.resize) / std::min(width, height);
      int side_w = std::min(width, static_cast<int>(std::nearbyint(transform.size / factor)));
      int side_h = std::min(height, static_cast<int>(std::nearbyint(transform.size / factor)));
      side_w = std::max(side_w, 1);
      side_h = std::max(side_h, 1);
      box = {(width - side_w) / 2, (height - side_h) / 2, side_w, side_h, false};
      break;
    }
    case ImageTransform::Mode::kResize:
      break;
  }
  box.flip = transform.flip_probability > 0.0 && rng.uniform(0.0, 1.0) < transform.flip_probability;
  return box;
}

// ---------------------------------------------------------------------------------------------
// ImageWriter

namespace {

// The decoder options ImageWriter uses, chosen by measurement (BENCHMARKS.md, "JPEG pipeline vs
// decode ceiling"): RGBX pixels, which libyuv scales, mirrors and splits into planes with its
// SIMD 4-byte-pixel kernels; SIMD DCT scales only; replicated chroma, whose
// one-pixel chroma shift the following resize mostly averages away.
DecodeOptions writer_decode_options(const ImageTransform& t) {
  DecodeOptions o;
  o.channels = 4;
  o.fast_upsampling = true;
  o.read_orientation = t.exif_orientation;
  o.dct_scales = t.dct_scales;
  return o;
}

// The source region that shows the display-oriented box `b` of an image whose EXIF orientation is
// `orientation` and whose display size is width x height (see JpegHeader::orientation).
CropBox stored_box(const CropBox& b, int orientation, int width, int height) {
  switch (orientation) {
    case 2:  // mirrored horizontally
      return {width - b.x - b.width, b.y, b.width, b.height, b.flip};
    case 3:  // rotated 180
      return {width - b.x - b.width, height - b.y - b.height, b.width, b.height, b.flip};
    case 4:  // mirrored vertically
      return {b.x, height - b.y - b.height, b.width, b.height, b.flip};
    case 5:  // transposed
      return {b.y, b.x, b.height, b.width, b.flip};
    case 6:  // to be rotated 90 degrees clockwise
      return {b.y, width - b.x - b.width, b.height, b.width, b.flip};
    case 7:  // transversed
      return {height - b.y - b.height, width - b.x - b.width, b.height, b.width, b.flip};
    case 8:  // to be rotated 90 degrees counter-clockwise
      return {height - b.y - b.height, b.x, b.height, b.width, b.flip};
    default:
      return b;
  }
}

// Turns the square `img` (stored orientation) upright as EXIF `orientation` says, into `scratch`
// when it cannot be done in place; returns the upright image.
cv::Mat orient(cv::Mat img, int orientation, cv::Mat& scratch) {
  switch (orientation) {
    case 2:
      cv::flip(img, img, 1);
      return img;
    case 3:
      cv::flip(img, img, -1);
      return img;
    case 4:
      cv::flip(img, img, 0);
      return img;
    case 5:
      cv::transpose(img, scratch);
      return scratch;
    case 6:
      cv::rotate(img, scratch, cv::ROTATE_90_CLOCKWISE);
      return scratch;
    case 7:
      cv::transpose(img, scratch);
      cv::flip(scratch, scratch, -1);
      return scratch;
    case 8:
      cv::rotate(img, scratch, cv::ROTATE_90_COUNTERCLOCKWISE);
      return scratch;
    default:
      return img;
  }
}

}  // namespace

struct ImageWriter::State {
  ImageTransform transform;
  JpegDecoder decoder;
  std::vector<uint8_t> scaled;    // size x size RGBX scratch, reused
  std::vector<uint8_t> mirrored;  // size x size RGBX scratch for the flip, reused
  cv::Mat rotated;                // size x size RGBX scratch for EXIF rotations, reused
  int last_scale = 8;
  ImageWriter::Timing last_timing;
  explicit State(ImageTransform t) : transform(t), decoder(t.limits, writer_decode_options(t)) {
    const size_t bytes = static_cast<size_t>(t.size) * static_cast<size_t>(t.size) * 4;
    scaled.resize(bytes);
    mirrored.resize(bytes);
  }
};

ImageWriter::ImageWriter(ImageTransform transform) {
  if (transform.size <= 0) throw std::invalid_argument("ImageTransform.size must be positive");
  state_ = std::make_unique<State>(transform);
}
ImageWriter::~ImageWriter() = default;
ImageWriter::ImageWriter(ImageWriter&&) noexcept = default;
ImageWriter& ImageWriter::operator=(ImageWriter&&) noexcept = default;
const ImageTransform& ImageWriter::transform() const { return state_->transform; }
int ImageWriter::last_scale() const { return state_->last_scale; }
ImageWriter::Timing ImageWriter::last_timing() const { return state_->last_timing; }

void ImageWriter::write(const uint8_t* bytes, size_t size, const SampleContext& ctx,
                        std::byte* out) {
  State& s = *state_;
  std::optional<trace::Range> stage(std::in_place, trace::Name::kDecode);  // for a profiler
  const auto started = std::chrono::steady_clock::now();
  const int side = s.transform.size;
  const JpegHeader header = s.decoder.begin(bytes, size);
  const bool swapped = header.orientation >= 5;  // displayed with width and height exchanged
  const int width = swapped ? header.height : header.width;
  const int height = swapped ? header.width : header.height;
  const CropBox box = choose_crop(s.transform, width, height, ctx.seed, ctx.epoch, ctx.index);
  const CropBox src_box = stored_box(box, header.orientation, width, height);
  const DecodedImage image =
      s.decoder.finish_region(src_box.x, src_box.y, src_box.width, src_box.height, side, side);
  s.last_scale = image.scale;
  const auto decoded = std::chrono::steady_clock::now();
  s.last_timing.decode = decoded - started;
  stage.emplace(trace::Name::kResize);
  // The rest of write() is the transform, however it returns.
  struct TransformClock {
    ImageWriter::Timing& timing;
    std::chrono::steady_clock::time_point from;
    ~TransformClock() { timing.transform = std::chrono::steady_clock::now() - from; }
  } transform_clock{s.last_timing, decoded};

  // Decoded RGBX -> size x size RGBX (straight from the decoder's buffer when no resize is
  // needed), upright, flipped if asked, then split into the row's planes or packed as RGB.
  // libyuv does the pixel work (BENCHMARKS.md, "JPEG pipeline"): it calls RGBX "ABGR", and its
  // ARGB functions see the bytes R,G,B,X as B,G,R,A, which only renames the planes below.
  const int row = side * 4;
  const uint8_t* pixels = image.pixels;
  int stride = static_cast<int>(image.stride);
  if (image.width != side || image.height != side) {
    libyuv::ARGBScale(pixels, stride, image.width, image.height, s.scaled.data(), row, side, side,
                      libyuv::kFilterBilinear);
    pixels = s.scaled.data();
    stride = row;
  }
  if (header.orientation != 1) {  // rare: OpenCV turns the square upright
    cv::Mat square(side, side, CV_8UC4, s.scaled.data(), static_cast<size_t>(row));
    if (pixels != s.scaled.data()) {  // the decoder's pixels are read-only
      cv::Mat(side, side, CV_8UC4, const_cast<uint8_t*>(pixels), static_cast<size_t>(stride))
          .copyTo(square);
    }
    cv::Mat upright = orient(square, header.orientation, s.rotated);
    pixels = upright.data;
    stride = static_cast<int>(upright.step);
  }
  if (box.flip) {
    libyuv::ARGBMirror(pixels, stride, s.mirrored.data(), row, side, side);
    pixels = s.mirrored.data();
    stride = row;
  }
  auto* dst = reinterpret_cast<uint8_t*>(out);
  if (s.transform.layout == ImageLayout::kHWC) {
    libyuv::ARGBToRGB24(pixels, stride, dst, side * 3, side, side);  // bytes 0,1,2 of each pixel
    return;
  }
  const size_t plane = static_cast<size_t>(side) * static_cast<size_t>(side);
  // libyuv's "B" plane is byte 0 of each pixel (R), its "R" plane byte 2 (B); X is dropped.
  libyuv::SplitARGBPlane(pixels, stride, dst + 2 * plane, side, dst + plane, side, dst, side,
                         nullptr, 0, side, side);
}

// ---------------------------------------------------------------------------------------------
// Files

namespace {
using detail::FileDescriptor;

[[noreturn]] void file_error(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}
}  // namespace

void read_file(const std::string& path, std::vector<uint8_t>& out) {
  // O_NONBLOCK: opening a FIFO named like an image must not wait for a writer; it is refused
  // below as not a regular file. Reads from regular files ignore the flag.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    int e = errno;
    struct stat link {};
    if (e == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      file_error(path, "dangling symbolic link");
    }
    file_error(path, std::string("cannot open: ") + std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    file_error(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) file_error(path, "not a regular file");
  if (st.st_size == 0) file_error(path, "empty file");
  const size_t size = static_cast<size_t>(st.st_size);
  if (out.capacity() < size) out.reserve(size + size / 4);
  out.resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd.get(), out.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      file_error(path, std::string("read failed: ") + std::strerror(errno));
    }
    if (n == 0) file_error(path, "file shrank while being read");
    done += static_cast<size_t>(n);
  }
}

// ---------------------------------------------------------------------------------------------
// ImageSource

struct ImageSource::Worker {
  ImageWriter writer;
  std::vector<uint8_t> file;
  std::unique_ptr<detail::ShardReader> shard_reader;  // tar_shards: made on first use
  std::vector<detail::MemberRange> upcoming;          // will_write's members, reused
  std::array<std::atomic<uint64_t>, 9> scales{};
  // Nanoseconds in write_sample(): reading, decoding, transforming.
  std::atomic<uint64_t> read_ns{0}, decode_ns{0}, transform_ns{0};
  // Adds the read time since `from`, and the last write's timing, to the counters.
  void count(std::chrono::steady_clock::time_point from,
             std::chrono::steady_clock::time_point read) {
    const ImageWriter::Timing t = writer.last_timing();
    read_ns.fetch_add(static_cast<uint64_t>((read - from).count()), std::memory_order_relaxed);
    decode_ns.fetch_add(static_cast<uint64_t>(t.decode.count()), std::memory_order_relaxed);
    transform_ns.fetch_add(static_cast<uint64_t>(t.transform.count()), std::memory_order_relaxed);
    scales[static_cast<size_t>(writer.last_scale())].fetch_add(1, std::memory_order_relaxed);
  }
  explicit Worker(const ImageTransform& t) : writer(t) {}
};

ImageSource::ImageSource(std::vector<ImageItem> items, std::vector<std::string> classes,
                         std::vector<std::vector<uint8_t>> memory, ImageTransform transform)
    : items_(std::move(items)),
      classes_(std::move(classes)),
      memory_(std::move(memory)),
      transform_(transform) {}

ImageSource::~ImageSource() = default;

namespace {
bool has_jpeg_extension(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg";
}
}  // namespace

std::unique_ptr<ImageSource> ImageSource::image_folder(const std::filesystem::path& root,
                                                       ImageTransform transform) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw std::runtime_error("ImageFolder: " + root.string() + " is not a folder");
  }
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) classes.push_back(entry.path().filename().string());
  }
  std::sort(classes.begin(), classes.end());
  std::vector<ImageItem> items;
  for (size_t label = 0; label < classes.size(); ++label) {
    std::vector<std::string> files;
    auto options = fs::directory_options::follow_directory_symlink |
                   fs::directory_options::skip_permission_denied;
    for (auto it = fs::recursive_directory_iterator(root / classes[label], options);
         it != fs::recursive_directory_iterator(); ++it) {
      // Regular files and links (a dangling link is kept, to be reported when read); folders
      // that happen to be named like images are not samples.
      std::error_code type_error;
      if (!has_jpeg_extension(it->path()) || it->is_directory(type_error)) continue;
      files.push_back(it->path().string());
    }
    std::sort(files.begin(), files.end());
    for (auto& f : files) items.push_back({std::move(f), static_cast<int64_t>(label)});
  }
  if (items.empty()) {
    throw std::runtime_error("ImageFolder: no .jpg/.jpeg images in class folders under " +
                             root.string());
  }
  return std::unique_ptr<ImageSource>(
      new ImageSource(std::move(items), std::move(classes), {}, transform));
}

std::unique_ptr<ImageSource> ImageSource::file_list(const std::filesystem::path& list,
                                                    ImageTransform transform) {
  std::ifstream in(list);
  if (!in) throw std::runtime_error("FileList: cannot open " + list.string());
  std::vector<ImageItem> items;
  std::string line;
  size_t line_number = 0;
  const auto base = list.parent_path();
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    size_t tab = line.rfind('\t');
    auto bad = [&](const std::string& why) {
      return std::runtime_error("FileList: " + list.string() + ":" + std::to_string(line_number) +
                                ": " + why + " (expected 'path<TAB>label')");
    };
    if (tab == std::string::npos || tab == 0) throw bad("no tab-separated label");
    std::string label_text = line.substr(tab + 1);
    char* end = nullptr;
    errno = 0;
    long long label = std::strtoll(label_text.c_str(), &end, 10);
    if (errno != 0 || end == label_text.c_str() || *end != '\0' || label < 0) {
      throw bad("label '" + label_text + "' is not a non-negative integer");
    }
    std::filesystem::path path = line.substr(0, tab);
    if (path.is_relative()) path = base / path;
    items.push_back({path.string(), static_cast<int64_t>(label)});
  }
  if (items.empty()) throw std::runtime_error("FileList: " + list.string() + " lists no images");
  return std::unique_ptr<ImageSource>(new ImageSource(std::move(items), {}, {}, transform));
}

std::unique_ptr<ImageSource> ImageSource::in_memory(std::vector<std::vector<uint8_t>> jpegs,
                                                    std::vector<int64_t> labels,
                                                    ImageTransform transform) {
  if (jpegs.size() != labels.size()) {
    throw std::invalid_argument("in_memory: " + std::to_string(jpegs.size()) + " images but " +
                                std::to_string(labels.size()) + " labels");
  }
  std::vector<ImageItem> items;
  for (size_t i = 0; i < jpegs.size(); ++i) {
    items.push_back({"<memory #" + std::to_string(i) + ">", labels[i]});
  }
  return std::unique_ptr<ImageSource>(
      new ImageSource(std::move(items), {}, std::move(jpegs), transform));
}

size_t ImageSource::size() const { return stream_ ? stream_->positions() : items_.size(); }

std::vector<FieldSpec> ImageSource::fields() const {
  const int64_t s = transform_.size;
  std::vector<int64_t> shape = transform_.layout == ImageLayout::kCHW
                                   ? std::vector<int64_t>{3, s, s}
                                   : std::vector<int64_t>{s, s, 3};
  return {{"image", c10::ScalarType::Byte, shape}, {"label", c10::ScalarType::Long, {}}};
}

void ImageSource::prepare(size_t workers) {
  while (workers_.size() < workers) workers_.push_back(std::make_unique<Worker>(transform_));
  if (stream_) stream_->reset();  // a new loader reads its epochs from their beginning
}

void ImageSource::write_sample(const SampleContext& ctx, std::byte* const* fields) {
  Worker& w = *workers_.at(ctx.worker);
  std::optional<trace::Range> reading(std::in_place, trace::Name::kRead);  // for a profiler
  const auto started = std::chrono::steady_clock::now();
  if (stream_) {
    const int64_t label = stream_->fetch(ctx.seed, ctx.epoch, ctx.index, w.file);
    const auto read = std::chrono::steady_clock::now();
    reading.reset();
    w.writer.write(w.file.data(), w.file.size(), ctx, fields[0]);
    w.count(started, read);
    std::memcpy(fields[1], &label, sizeof(int64_t));
    return;
  }
  const ImageItem& item = items_.at(ctx.index);
  const uint8_t* data = nullptr;
  size_t size = 0;
  if (shards_) {
    if (!w.shard_reader) w.shard_reader = shards_->open_reader();
    const Shards::Member& m = shards_->members.at(ctx.index);
    w.shard_reader->read(m.shard, m.offset, m.size, w.file);
    data = w.file.data();
    size = w.file.size();
  } else if (memory_.empty()) {
    read_file(item.path, w.file);
    data = w.file.data();
    size = w.file.size();
  } else {
    data = memory_[ctx.index].data();
    size = memory_[ctx.index].size();
  }
  const auto read = std::chrono::steady_clock::now();
  reading.reset();
  w.writer.write(data, size, ctx, fields[0]);
  w.count(started, read);
  std::memcpy(fields[1], &item.label, sizeof(int64_t));
}

void ImageSource::will_write(size_t worker, const size_t* indices, size_t count) {
  if (!shards_ || !shards_->remote) return;
  Worker& w = *workers_.at(worker);
  if (!w.shard_reader) w.shard_reader = shards_->open_reader();
  w.upcoming.clear();
  for (size_t i = 0; i < count; ++i) w.upcoming.push_back(shards_->members.at(indices[i]));
  w.shard_reader->will_read(w.upcoming);
}

std::string ImageSource::describe(size_t index) const {
  if (stream_) return stream_->describe(index);
  return index < items_.size() ? items_[index].path : "sample " + std::to_string(index);
}

std::vector<uint64_t> ImageSource::scale_histogram() const {
  std::vector<uint64_t> h(9, 0);
  for (const auto& w : workers_) {
    for (size_t i = 0; i < 9; ++i) h[i] += w->scales[i].load(std::memory_order_relaxed);
  }
  return h;
}

ImageSource::WorkTime ImageSource::work_time() const {
  WorkTime t;
  for (const auto& w : workers_) {
    t.read_seconds += 1e-9 * static_cast<double>(w->read_ns.load(std::memory_order_relaxed));
    t.decode_seconds += 1e-9 * static_cast<double>(w->decode_ns.load(std::memory_order_relaxed));
    t.transform_seconds +=
        1e-9 * static_cast<double>(w->transform_ns.load(std::memory_order_relaxed));
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// PatternSource

PatternSource::PatternSource(size_t size, size_t sample_bytes)
    : size_(size), sample_bytes_(sample_bytes), pattern_(sample_bytes + 251) {
  for (size_t i = 0; i < pattern_.size(); ++i) pattern_[i] = static_cast<uint8_t>(i % 251);
}

std::vector<FieldSpec> PatternSource::fields() const {
  std::vector<FieldSpec> f;
  if (sample_bytes_ > 0) {
    f.push_back({"image", c10::ScalarType::Byte, {static_cast<int64_t>(sample_bytes_)}});
  }
  f.push_back({"label", c10::ScalarType::Long, {}});
  return f;
}

void PatternSource::write_sample(const SampleContext& ctx, std::byte* const* fields) {
  size_t f = 0;
  if (sample_bytes_ > 0) {
    std::memcpy(fields[f++], pattern_.data() + ctx.index % 251, sample_bytes_);
  }
  const auto label = static_cast<int64_t>(ctx.index);
  std::memcpy(fields[f], &label, sizeof label);
}

uint8_t PatternSource::pattern_byte(size_t index, size_t offset) {
  return static_cast<uint8_t>((offset + index % 251) % 251);
}

}  // namespace conveyor
