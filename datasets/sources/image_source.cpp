// ImageSource (conveyor/datasets.h): what every kind of image source shares. The kind
// (image_kind.h) says where sample i's bytes and label come from; this file decodes them into the
// row through each worker's ImageWriter and counts where the time went.
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "conveyor/datasets.h"
#include "conveyor/internal/trace.h"
#include "sources/image_kind.h"

namespace conveyor {

size_t FieldSpec::item_bytes() const {
  size_t n = c10::elementSize(dtype);
  for (int64_t d : sample_shape) n *= static_cast<size_t>(d);
  return n;
}

size_t FieldSpec::sample_bytes() const {
  return ragged() ? sizeof(int64_t) + max_items * item_bytes() : item_bytes();
}

int64_t RaggedRow::count() const {
  int64_t n = 0;
  std::memcpy(&n, row_, sizeof n);
  return n;
}

void RaggedRow::set_count(int64_t items) { std::memcpy(row_, &items, sizeof items); }

std::string SampleSource::describe(size_t index) const { return "sample " + std::to_string(index); }

std::vector<FieldSpec> SampleSource::learn_fields(size_t) {
  throw std::logic_error("conveyor: learn_fields() on a source whose fields() are known");
}

SampleSource::Encoded SampleSource::read_encoded(const SampleContext& ctx, std::vector<uint8_t>&,
                                                 std::byte* const*) {
  throw std::logic_error("conveyor: read_encoded() of sample " + std::to_string(ctx.index) +
                         " on a source without an encoded image field");
}

struct ImageSource::Worker {
  ImageWriter writer;
  std::vector<uint8_t> file;  // the sample's encoded bytes, reused
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

ImageSource::ImageSource(std::unique_ptr<Kind> kind, ImageTransform transform)
    : kind_(std::move(kind)), transform_(transform) {}

ImageSource::~ImageSource() = default;

const std::vector<ImageItem>& ImageSource::items() const { return kind_->items(); }
const std::vector<std::string>& ImageSource::classes() const { return kind_->classes(); }
size_t ImageSource::size() const { return kind_->size(); }

std::vector<FieldSpec> ImageSource::fields() const {
  const int64_t s = transform_.size;
  std::vector<int64_t> shape = transform_.layout == ImageLayout::kCHW
                                   ? std::vector<int64_t>{3, s, s}
                                   : std::vector<int64_t>{s, s, 3};
  return {{"image", c10::ScalarType::Byte, shape}, {"label", c10::ScalarType::Long, {}}};
}

std::optional<SampleSource::EncodedImageField> ImageSource::encoded_image_field() const {
  return EncodedImageField{0, transform_};  // fields(): image, label
}

void ImageSource::prepare(size_t workers) {
  while (workers_.size() < workers) workers_.push_back(std::make_unique<Worker>(transform_));
  kind_->prepare(workers);
}

void ImageSource::write_sample(const SampleContext& ctx, std::byte* const* fields) {
  Worker& w = *workers_.at(ctx.worker);
  std::optional<trace::Range> reading(std::in_place, trace::Name::kRead);  // for a profiler
  const auto started = std::chrono::steady_clock::now();
  const Kind::Encoded image = kind_->read(ctx, w.file);
  const auto read = std::chrono::steady_clock::now();
  reading.reset();
  w.writer.write(image.data, image.size, ctx, fields[0]);
  w.count(started, read);
  std::memcpy(fields[1], &image.label, sizeof(int64_t));
}

SampleSource::Encoded ImageSource::read_encoded(const SampleContext& ctx,
                                                std::vector<uint8_t>& buffer,
                                                std::byte* const* fields) {
  Worker& w = *workers_.at(ctx.worker);
  const trace::Range reading(trace::Name::kRead);
  const auto started = std::chrono::steady_clock::now();
  const Kind::Encoded image = kind_->read(ctx, buffer);
  w.read_ns.fetch_add(static_cast<uint64_t>((std::chrono::steady_clock::now() - started).count()),
                      std::memory_order_relaxed);
  std::memcpy(fields[1], &image.label, sizeof(int64_t));
  return {image.data, image.size};
}

void ImageSource::will_write(size_t worker, const size_t* indices, size_t count) {
  kind_->will_read(worker, indices, count);
}

std::string ImageSource::describe(size_t index) const { return kind_->describe(index); }

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

}  // namespace conveyor
