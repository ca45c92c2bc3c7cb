// GpuDecodeStage (gpu_decode_stage.h): routing rows to the decoders, the decode thread's jobs,
// and the runs of device rows handed to the copy stage.
#include "gpu_decode_stage.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <exception>
#include <utility>

#include "conveyor/internal/invariant.h"
#include "conveyor/internal/trace.h"

namespace conveyor::detail {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t nanoseconds_since(Clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

const char* mode_name(const GpuDecode& g) {
  return g.mode == GpuDecode::Mode::kAuto ? "automatic split" : "fixed share";
}

}  // namespace

GpuDecodeStage::Plan GpuDecodeStage::make(const Parts& parts,
                                          const std::optional<c10::Device>& device) {
  const GpuDecode& wanted = parts.options.gpu_decode;
  Plan plan;
  if (wanted.mode == GpuDecode::Mode::kOff) return plan;  // "off"
  const std::string unused = "GPU decode unused: ";
  if (!device) {
    plan.status = unused +
                  "batches go to the CPU, and GPU decode writes into the batch's memory "
                  "on a CUDA device";
    return plan;
  }
  const auto* images = dynamic_cast<const ImageSource*>(&parts.source);
  if (images == nullptr) {
    plan.status = unused + "the source is not an ImageSource";
    return plan;
  }
  std::shared_ptr<const DeviceDecoderFactory> factory =
      wanted.decoder ? wanted.decoder : nvjpeg_hardware_decoders();
  std::unique_ptr<DeviceImageDecoder> decoder;
  try {
    const GpuDecodeStatus status = factory->status(*device);
    if (!status.available) {
      plan.status = status.reason;
      return plan;
    }
    decoder = factory->make(images->transform(), *device, parts.options.chunk_size);
  } catch (const std::exception& e) {
    plan.status = unused + factory->name() + " could not be made: " + e.what();
    return plan;
  }
  std::string status = factory->name() + " on " + device->str() + ", " + mode_name(wanted);
  if (wanted.mode == GpuDecode::Mode::kShare) {
    status += " " + std::to_string(std::clamp(wanted.share, 0.0, 1.0)).substr(0, 4);
  }
  plan.stage = std::make_unique<GpuDecodeStage>(parts, std::move(decoder), *device, status);
  plan.status = std::move(status);
  return plan;
}

GpuDecodeStage::GpuDecodeStage(const Parts& parts, std::unique_ptr<DeviceImageDecoder> decoder,
                               c10::Device device, std::string status)
    : source_(dynamic_cast<ImageSource&>(parts.source)),
      filler_(parts.filler),
      meta_(parts.meta),
      completed_(parts.completed),
      options_(parts.options),
      order_(parts.order),
      image_field_(0),  // ImageSource::fields(): image, label
      worker_(parts.options.workers),
      status_(std::move(status)),
      decoder_(std::move(decoder)),
      jobs_(parts.options.slots, parts.options.chunks_per_batch),
      chunk_decoders_(parts.options.chunks_per_batch, 0) {
  CONVEYOR_CHECK(decoder_ != nullptr, "a GPU decode stage has a decoder");
  const std::vector<FieldSpec> fields = source_.fields();
  std::vector<int64_t> shape = fields.at(image_field_).sample_shape;
  row_bytes_ = fields[image_field_].sample_bytes();
  shape.insert(shape.begin(), static_cast<int64_t>(options_.slots * options_.batch_size));
  device_rows_ = at::empty(shape, at::TensorOptions().dtype(at::kByte).device(device));
  for (auto& meta : meta_) {
    meta->route.reserve(options_.batch_size);
    meta->device_row.reserve(options_.batch_size);
  }
  if (options_.gpu_decode.mode == GpuDecode::Mode::kAuto) {
    balancer_.emplace(options_.workers, /*gpu_available=*/true);
  }
  const size_t chunk = options_.chunk_size;
  rows_.reserve(chunk);
  hint_.reserve(chunk);
  images_.reserve(chunk);
  image_rows_.reserve(chunk);
  refused_.reserve(chunk);
  on_cpu_.reserve(chunk);
  buffers_.resize(chunk);
  thread_ = std::jthread([this] { run(); });
}

GpuDecodeStage::~GpuDecodeStage() { stop(); }

void GpuDecodeStage::stop() {
  jobs_.stop();
  if (thread_.joinable()) thread_.join();
}

size_t GpuDecodeStage::route(SlotMeta& meta, const size_t* indices, size_t rows, uint64_t epoch) {
  const size_t chunk = options_.chunk_size;
  const size_t chunks = (rows + chunk - 1) / chunk;
  meta.hybrid = true;
  meta.route.resize(rows);       // within the reserved capacity
  meta.device_row.resize(rows);  // written by the decode thread for its rows
  size_t jobs = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t first = c * chunk, last = std::min(rows, first + chunk);
    uint8_t decoders = 0;
    if (balancer_) {
      const Decoder d = balancer_->assign(last - first);
      std::fill(meta.route.begin() + static_cast<std::ptrdiff_t>(first),
                meta.route.begin() + static_cast<std::ptrdiff_t>(last), d);
      decoders = d == Decoder::kGpu ? kGpuBit : kCpuBit;
    } else {
      for (size_t r = first; r < last; ++r) {
        meta.route[r] =
            fixed_share_decoder(options_.gpu_decode.share, options_.seed, epoch, indices[r]);
        decoders |= meta.route[r] == Decoder::kGpu ? kGpuBit : kCpuBit;
      }
    }
    chunk_decoders_[c] = decoders;
    jobs += (decoders & kCpuBit ? 1 : 0) + (decoders & kGpuBit ? 1 : 0);
  }
  return jobs;
}

uint8_t* GpuDecodeStage::device_row_pointer(uint32_t slot, size_t row) const {
  return static_cast<uint8_t*>(device_rows_.data_ptr()) +
         (static_cast<size_t>(slot) * options_.batch_size + row) * row_bytes_;
}

std::vector<DeviceRows> GpuDecodeStage::device_rows(uint32_t slot, const SlotMeta& meta) const {
  std::vector<DeviceRows> runs;
  if (!meta.hybrid) return runs;
  const size_t rows = meta.route.size();
  const auto on_device = [&](size_t r) {
    return meta.route[r] == Decoder::kGpu && meta.device_row[r].has_value();
  };
  for (size_t r = 0; r < rows;) {
    if (!on_device(r)) {
      ++r;
      continue;
    }
    const size_t first = r, source = *meta.device_row[r];
    while (r < rows && on_device(r) && *meta.device_row[r] == source + (r - first)) ++r;
    const int64_t base = static_cast<int64_t>(slot * options_.batch_size + source);
    runs.push_back(DeviceRows{image_field_, static_cast<int64_t>(first),
                              device_rows_.narrow(0, base, static_cast<int64_t>(r - first))});
  }
  return runs;
}

void GpuDecodeStage::run() {
  trace::name_this_thread("Conveyor GPU decode", "conveyor-gpu");
  for (;;) {
    const std::optional<Job> job = jobs_.wait();  // idle: the thread's time not on a job
    if (!job) return;
    if (run_job(*job)) completed_.push(job->slot);
  }
}

bool GpuDecodeStage::run_job(const Job& job) noexcept {
  // The slot's meta was written before its jobs were queued.
  SlotMeta& meta = *meta_[job.slot];
  const auto t0 = Clock::now();
  const size_t first = job.chunk * options_.chunk_size;
  const size_t last = std::min(meta.indices.size(), first + options_.chunk_size);
  CONVEYOR_DEBUG_CHECK(first < last && meta.hybrid, "a GPU job is a real chunk of a routed batch");
  {
    const trace::Range range(trace::Name::kGpuDecode, meta.sequence);
    try {
      decode_rows(job.slot, meta, first, last);
    } catch (...) {  // out of memory for a name, say: the batch fails, named by its first row
      const size_t row = rows_.empty() ? first : rows_.front();
      filler_.record_failure(meta, row, order_[meta.sequence * options_.batch_size + row],
                             std::current_exception());
    }
  }
  const uint64_t busy = nanoseconds_since(t0);
  busy_ns_.fetch_add(busy, std::memory_order_relaxed);
  if (balancer_) {
    balancer_->finished(Decoder::kGpu, rows_.size(), std::chrono::nanoseconds(busy));
  }
  return filler_.finish_job(job.slot, meta);
}

void GpuDecodeStage::decode_rows(uint32_t slot, SlotMeta& meta, size_t first, size_t last) {
  const size_t base = meta.sequence * options_.batch_size;  // the batch's first place in order_
  rows_.clear();
  hint_.clear();
  for (size_t r = first; r < last; ++r) {
    if (meta.route[r] != Decoder::kGpu) continue;
    meta.device_row[r].reset();
    rows_.push_back(r);
    hint_.push_back(order_[base + r]);
  }
  if (rows_.empty()) return;
  // A batch cancelled, or already failed at an earlier row, needs none of these rows.
  if (filler_.outdated(meta)) {
    meta.cancelled.store(true);
    return;
  }
  if (meta.failed_row.load(std::memory_order_relaxed) < rows_.front()) return;
  try {  // a hint: the source may start reading the chunk's samples at once
    source_.will_write(worker_, hint_.data(), hint_.size());
  } catch (...) {  // a failed hint costs nothing; each sample's own read reports its errors
  }
  std::array<std::byte*, BatchFiller::kMaxFields> fields{};
  images_.clear();
  image_rows_.clear();
  on_cpu_.clear();
  for (size_t r : rows_) {
    const SampleContext context{worker_, order_[base + r], options_.seed, meta.epoch};
    filler_.row_pointers(slot, r, fields.data());
    try {
      const ImageSource::Encoded encoded =
          source_.read_encoded(context, buffers_[images_.size()], fields.data());
      images_.push_back(GpuJpeg{encoded.data, encoded.size, context, {}});
      image_rows_.push_back(r);
    } catch (...) {  // the CPU path reads it again, and its policy reports or skips it
      on_cpu_.push_back(r);
    }
  }
  if (!images_.empty()) {
    images_.front().name = filler_.describe(images_.front().context.index);  // for errors
    if (filler_.outdated(meta)) {
      meta.cancelled.store(true);
      return;
    }
    GpuDecodeResult result;
    try {
      result = decoder_->decode(images_.data(), images_.size(), device_row_pointer(slot, first));
    } catch (...) {  // a CUDA or nvJPEG failure: this batch fails, named by its first image
      failed_batches_.fetch_add(1, std::memory_order_relaxed);
      filler_.record_failure(meta, image_rows_.front(), images_.front().context.index,
                             std::current_exception());
      return;
    }
    refused_.assign(images_.size(), 0);
    for (size_t k : result.to_cpu) refused_.at(k) = 1;
    for (const GpuDecodeResult::Failure& f : result.failed) refused_.at(f.position) = 1;
    uint64_t decoded = 0;
    for (size_t k = 0; k < images_.size(); ++k) {
      const size_t r = image_rows_[k];
      if (refused_[k]) {
        on_cpu_.push_back(r);
        continue;
      }
      meta.indices[r] = images_[k].context.index;
      meta.device_row[r] = static_cast<uint32_t>(first + k);
      ++decoded;
    }
    gpu_images_.fetch_add(decoded, std::memory_order_relaxed);
  }
  refused_count_.fetch_add(on_cpu_.size(), std::memory_order_relaxed);
  // The rest on the CPU, in row order, as a worker would (the lowest failing row's error wins).
  std::sort(on_cpu_.begin(), on_cpu_.end());
  for (size_t r : on_cpu_) {
    if (filler_.outdated(meta)) {
      meta.cancelled.store(true);
      return;
    }
    if (meta.failed_row.load(std::memory_order_relaxed) < r) return;
    filler_.row_pointers(slot, r, fields.data());
    if (!filler_.write_with_policy(worker_, r, order_[base + r], fields.data(), meta)) return;
    cpu_images_.fetch_add(1, std::memory_order_relaxed);
  }
}

GpuDecodeStats GpuDecodeStage::stats() const {
  GpuDecodeStats s;
  s.active = true;
  s.status = status_;
  s.gpu_images = gpu_images_.load(std::memory_order_relaxed);
  s.cpu_images = cpu_images_.load(std::memory_order_relaxed);
  s.refused = refused_count_.load(std::memory_order_relaxed);
  s.failed_batches = failed_batches_.load(std::memory_order_relaxed);
  s.gpu_busy_seconds = 1e-9 * static_cast<double>(busy_ns_.load(std::memory_order_relaxed));
  // The decode thread is either on a job or waiting for one (a job under way counts as idle
  // until it ends).
  s.gpu_idle_seconds =
      std::max(0.0, 1e-9 * static_cast<double>(nanoseconds_since(started_)) - s.gpu_busy_seconds);
  s.cpu_idle_seconds = 1e-9 * static_cast<double>(cpu_idle_ns_.load(std::memory_order_relaxed));
  if (balancer_) {
    const DecodeBalancer::Snapshot b = balancer_->snapshot();
    s.cpu_ns_per_image = b.cpu_ns_per_image;
    s.gpu_ns_per_image = b.gpu_ns_per_image;
  }
  return s;
}

}  // namespace conveyor::detail
