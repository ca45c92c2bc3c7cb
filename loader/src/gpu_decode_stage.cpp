// GpuDecodeStage (gpu_decode_stage.h): routing rows to the decoders, the decode threads' calls,
// and the runs of device rows handed to the copy stage.
#include "gpu_decode_stage.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "codec/image_codec.h"
#include "conveyor/internal/cuda_check.h"
#include "conveyor/internal/invariant.h"
#include "conveyor/internal/trace.h"

namespace conveyor::detail {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t nanoseconds_since(Clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// The most images one decoder call gets: max_batch, and the last chunk taken may pass it by less
// than a chunk.
size_t call_capacity(const ResolvedOptions& o) { return o.gpu_decode.max_batch + o.chunk_size; }

// Why a source's encoded image field cannot take a device decoder's rows (empty: it can): it
// must name one of the fields, a uint8 row of the transform's size and layout.
std::string unfit_image_field(const SampleSource::EncodedImageField& image,
                              const std::vector<FieldSpec>& fields) {
  if (image.field >= fields.size()) {
    return "is number " + std::to_string(image.field) + ", and the source has " +
           std::to_string(fields.size()) + " fields";
  }
  const FieldSpec& f = fields[image.field];
  const int64_t side = image.transform.size;
  const std::vector<int64_t> shape = image.transform.layout == ImageLayout::kCHW
                                         ? std::vector<int64_t>{3, side, side}
                                         : std::vector<int64_t>{side, side, 3};
  if (f.dtype != c10::ScalarType::Byte || f.sample_shape != shape) {
    return "\"" + f.name + "\" is not a uint8 image of the transform's size and layout";
  }
  return {};
}

std::string describe_mode(const GpuDecode& g) {
  std::string text = g.mode == GpuDecode::Mode::kAuto ? "automatic split" : "fixed share ";
  if (g.mode == GpuDecode::Mode::kShare) {
    text += std::to_string(std::clamp(g.share, 0.0, 1.0)).substr(0, 4);
  }
  return text + ", " + std::to_string(g.threads) + " decode thread" + (g.threads > 1 ? "s" : "");
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
  std::optional<SampleSource::EncodedImageField> image;
  std::vector<FieldSpec> fields;
  try {
    image = parts.source.encoded_image_field();
    fields = parts.source.fields();
  } catch (const std::exception& e) {
    plan.status = unused + "the source could not say which field it decodes: " + e.what();
    return plan;
  }
  if (!image) {
    plan.status = unused +
                  "the source has no field a device decoder may write "
                  "(SampleSource::encoded_image_field)";
    return plan;
  }
  if (!image->transform.views.empty()) {
    plan.status = unused +
                  "the image has several views (ImageTransform::views), which the CPU "
                  "decodes once per image for all of them";
    return plan;
  }
  if (const std::string wrong = unfit_image_field(*image, fields); !wrong.empty()) {
    plan.status = unused + "the source's encoded image field " + wrong;
    return plan;
  }
  std::shared_ptr<const DeviceDecoderFactory> factory =
      wanted.decoder ? wanted.decoder : nvjpeg_hardware_decoders();
  std::vector<std::unique_ptr<DeviceImageDecoder>> decoders;
  try {
    const GpuDecodeStatus status = factory->status(*device);
    if (!status.available) {
      plan.status = status.reason;
      return plan;
    }
    for (size_t t = 0; t < wanted.threads; ++t) {
      decoders.push_back(factory->make(image->transform, *device, call_capacity(parts.options)));
    }
  } catch (const std::exception& e) {
    plan.status = unused + factory->name() + " could not be made: " + e.what();
    return plan;
  }
  std::string status = factory->name() + " on " + device->str() + ", " + describe_mode(wanted) +
                       ", field \"" + fields[image->field].name + "\"";
  try {
    plan.stage =
        std::make_unique<GpuDecodeStage>(parts, image->field, std::move(decoders), *device, status);
  } catch (const std::exception& e) {  // the device rows did not fit, say
    plan.status = unused + "its device rows (" +
                  std::to_string(parts.options.slots * parts.options.batch_size *
                                 fields[image->field].sample_bytes() / 1000000) +
                  " MB on " + device->str() + ") could not be allocated: " + e.what();
    return plan;
  }
  plan.status = std::move(status);
  return plan;
}

GpuDecodeStage::GpuDecodeStage(const Parts& parts, size_t image_field,
                               std::vector<std::unique_ptr<DeviceImageDecoder>> decoders,
                               c10::Device device, std::string status)
    : source_(parts.source),
      filler_(parts.filler),
      meta_(parts.meta),
      completed_(parts.completed),
      options_(parts.options),
      order_(parts.order),
      image_field_(image_field),
      status_(std::move(status)),
      jobs_(parts.options.slots, parts.options.chunks_per_batch),
      chunk_decoders_(parts.options.chunks_per_batch, 0) {
  CONVEYOR_CHECK(!decoders.empty(), "a GPU decode stage has a decoder per thread");
  const std::vector<FieldSpec> fields = source_.fields();
  if (image_field_ >= fields.size()) {  // make() checked it; a source that changed its mind
    throw std::invalid_argument("conveyor: GPU decode's field " + std::to_string(image_field_) +
                                " is not one of the source's " + std::to_string(fields.size()));
  }
  std::vector<int64_t> shape = fields[image_field_].sample_shape;
  row_bytes_ = fields[image_field_].sample_bytes();
  shape.insert(shape.begin(), static_cast<int64_t>(options_.slots * options_.batch_size));
  device_rows_ = at::empty(shape, at::TensorOptions().dtype(at::kByte).device(device));
  for (auto& meta : meta_) {
    meta->route.reserve(options_.batch_size);
    meta->device_row.reserve(options_.batch_size);
  }
  if (options_.gpu_decode.mode == GpuDecode::Mode::kAuto) {
    balancer_.emplace(options_.workers, /*gpu_available=*/true, std::chrono::milliseconds(5),
                      options_.gpu_decode.max_batch);
  }
  const size_t capacity = call_capacity(options_);
  for (size_t i = 0; i < decoders.size(); ++i) {
    CONVEYOR_CHECK(decoders[i] != nullptr, "every decode thread has a decoder");
    auto t = std::make_unique<DecodeThread>();
    t->worker = options_.workers + i;
    t->decoder = std::move(decoders[i]);
    t->taken.reserve(capacity + 1);  // every job taken holds at least one image
    t->images.reserve(capacity);
    t->destinations.reserve(capacity);
    t->of.reserve(capacity);
    t->refused.reserve(capacity);
    t->cpu.reserve(capacity);
    t->hint.reserve(options_.chunk_size);
    t->buffers.resize(capacity);
    threads_.push_back(std::move(t));
  }
  try {
    for (auto& t : threads_) t->thread = std::jthread([this, &thread = *t] { run(thread); });
  } catch (...) {  // no destructor will run: stop the threads already started
    stop();
    throw;
  }
}

GpuDecodeStage::~GpuDecodeStage() { stop(); }

void GpuDecodeStage::stop() {
  jobs_.stop();
  for (auto& t : threads_) {
    if (t->thread.joinable()) t->thread.join();
  }
}

size_t GpuDecodeStage::route(SlotMeta& meta, const size_t* indices, size_t rows, uint64_t epoch) {
  const size_t chunk = options_.chunk_size;
  const size_t chunks = (rows + chunk - 1) / chunk;
  meta.hybrid = true;
  meta.route.resize(rows);       // within the reserved capacity
  meta.device_row.resize(rows);  // written by the decode threads for their rows
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

size_t GpuDecodeStage::chunk_rows(const Job& job, const SlotMeta& meta) const {
  const size_t first = job.chunk * options_.chunk_size;
  return std::min(meta.indices.size(), first + options_.chunk_size) - first;
}

void GpuDecodeStage::taken_back(const Job& job, const SlotMeta& meta, Decoder decoder) {
  if (balancer_) balancer_->abandoned(decoder, chunk_rows(job, meta));
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

void GpuDecodeStage::run(DecodeThread& t) {
  const std::string number = std::to_string(t.worker - options_.workers);
  trace::name_this_thread("Conveyor GPU decode " + number, "conveyor-gpu" + number);
  // Its cudaMalloc, cudaFree and waits must not break a CUDA graph captured meanwhile on another
  // thread (the training loop's).
  const detail::ThreadLocalCaptureMode capture_mode;
  for (;;) {
    const std::optional<Job> job = jobs_.wait();  // idle: a thread's time not on a call
    if (!job) return;
    take_jobs(t, *job);
    run_jobs(t);
  }
}

void GpuDecodeStage::take_jobs(DecodeThread& t, const Job& first) {
  t.taken.clear();
  size_t images = 0;
  const auto take = [&](const Job& job) {
    // The slot's meta was written before its jobs were queued.
    const SlotMeta& meta = *meta_[job.slot];
    DecodeThread::Taken k;
    k.job = job;
    k.first = job.chunk * options_.chunk_size;
    k.last = k.first + chunk_rows(job, meta);
    for (size_t r = k.first; r < k.last; ++r) k.gpu_rows += meta.route[r] == Decoder::kGpu;
    CONVEYOR_DEBUG_CHECK(meta.hybrid && k.gpu_rows > 0, "a GPU job has rows for the GPU");
    images += k.gpu_rows;
    t.taken.push_back(k);
  };
  take(first);
  while (images < options_.gpu_decode.max_batch && t.taken.size() < t.taken.capacity()) {
    const std::optional<Job> next = jobs_.try_take_back();
    if (!next) break;
    take(*next);
  }
}

void GpuDecodeStage::run_jobs(DecodeThread& t) noexcept {
  const auto t0 = Clock::now();
  {
    const trace::Range range(trace::Name::kGpuDecode, meta_[t.taken.front().job.slot]->sequence);
    try {
      read_images(t);
      decode_images(t);
      decode_on_cpu(t);
    } catch (...) {  // out of memory for a name, say: the batches still live fail
      t.images.clear();
      fail_jobs(t, std::current_exception());
    }
  }
  const uint64_t busy = nanoseconds_since(t0);
  busy_ns_.fetch_add(busy, std::memory_order_relaxed);
  size_t rows = 0;
  for (const DecodeThread::Taken& k : t.taken) rows += k.gpu_rows;
  for (const DecodeThread::Taken& k : t.taken) {
    SlotMeta& meta = *meta_[k.job.slot];
    if (balancer_ && k.live) {
      // The call's time shared by image, and by the threads that drive the engines together.
      const double share = static_cast<double>(k.gpu_rows) / static_cast<double>(rows) /
                           static_cast<double>(threads_.size());
      balancer_->finished(Decoder::kGpu, k.last - k.first,
                          std::chrono::nanoseconds(static_cast<int64_t>(busy * share)));
    } else if (balancer_) {  // kAuto's chunks are whole: one cut short measures nothing
      balancer_->abandoned(Decoder::kGpu, k.last - k.first);
    }
    if (filler_.finish_job(k.job.slot, meta)) completed_.push(k.job.slot);
  }
}

void GpuDecodeStage::read_images(DecodeThread& t) {
  t.images.clear();
  t.destinations.clear();
  t.of.clear();
  t.cpu.clear();
  std::array<std::byte*, BatchFiller::kMaxFields> fields{};
  for (size_t i = 0; i < t.taken.size(); ++i) {
    DecodeThread::Taken& k = t.taken[i];
    SlotMeta& meta = *meta_[k.job.slot];
    const size_t base = meta.sequence * options_.batch_size;  // the batch's place in order_
    t.hint.clear();
    for (size_t r = k.first; r < k.last; ++r) {
      if (meta.route[r] != Decoder::kGpu) continue;
      meta.device_row[r].reset();
      t.hint.push_back(order_[base + r]);
    }
    // A batch cancelled, or failed at an earlier row, needs none of these rows.
    if (filler_.outdated(meta)) {
      meta.cancelled.store(true);
      k.live = false;
      continue;
    }
    if (meta.failed_row.load(std::memory_order_relaxed) < k.first) {
      k.live = false;
      continue;
    }
    try {  // a hint: the source may start reading the chunk's samples at once
      source_.will_write(t.worker, t.hint.data(), t.hint.size());
    } catch (...) {  // a failed hint costs nothing; each sample's own read reports its errors
    }
    size_t position = k.first;  // the job's next device row
    for (size_t r = k.first; r < k.last; ++r) {
      if (meta.route[r] != Decoder::kGpu) continue;
      const SampleContext context{t.worker, order_[base + r], options_.seed, meta.epoch,
                                  meta.repeats[r]};
      filler_.row_pointers(k.job.slot, r, fields.data());
      try {
        const SampleSource::Encoded encoded =
            source_.read_encoded(context, t.buffers[t.images.size()], fields.data());
        // Only a JPEG goes to the device (nvJPEG): a PNG, a WebP or any other content goes to the
        // CPU's codecs by the codec seam, before it is queued.
        if (detail::detect_format(encoded.data, encoded.size) != detail::ImageFormat::kJpeg) {
          t.cpu.emplace_back(i, r);
          continue;
        }
        t.images.push_back(GpuJpeg{encoded.data, encoded.size, context, {}});
        t.destinations.push_back(device_row_pointer(k.job.slot, position));
        t.of.emplace_back(i, r);
        ++position;
      } catch (...) {  // the CPU path reads it again, and its policy reports or skips it
        t.cpu.emplace_back(i, r);
      }
    }
  }
}

void GpuDecodeStage::decode_images(DecodeThread& t) {
  if (t.images.empty()) return;
  t.images.front().name = filler_.describe(t.images.front().context.index);  // for errors
  GpuDecodeResult result;
  std::exception_ptr failure;
  {
    std::lock_guard<std::mutex> lock(device_mutex_);
    ++calls_started_;
  }
  try {
    result = t.decoder->decode(t.images.data(), t.images.size(), t.destinations.data());
  } catch (...) {
    failure = std::current_exception();
  }
  end_call(failure);
  if (failure) {
    // A CUDA or nvJPEG failure of the call, not of a file: its images are decoded on the CPU (the
    // workers' policy then meets only the files that really fail), their rows from the host.
    failed_batches_.fetch_add(1, std::memory_order_relaxed);
    for (const auto& [i, r] : t.of) t.cpu.emplace_back(i, r);
    return;
  }
  t.refused.assign(t.images.size(), 0);
  for (size_t k : result.to_cpu) t.refused.at(k) = 1;
  for (const GpuDecodeResult::Failure& f : result.failed) t.refused.at(f.position) = 1;
  uint64_t decoded = 0;
  for (size_t k = 0; k < t.images.size(); ++k) {
    const auto [i, r] = t.of[k];
    if (t.refused[k]) {
      t.cpu.emplace_back(i, r);
      continue;
    }
    SlotMeta& meta = *meta_[t.taken[i].job.slot];
    meta.indices[r] = t.images[k].context.index;
    meta.device_row[r] = static_cast<uint32_t>(
        (t.destinations[k] - device_row_pointer(t.taken[i].job.slot, 0)) / row_bytes_);
    ++decoded;
  }
  gpu_images_.fetch_add(decoded, std::memory_order_relaxed);
}

void GpuDecodeStage::decode_on_cpu(DecodeThread& t) {
  refused_count_.fetch_add(t.cpu.size(), std::memory_order_relaxed);
  // In row order, job by job, as a worker would (the lowest failing row's error wins anyway).
  std::sort(t.cpu.begin(), t.cpu.end());
  std::array<std::byte*, BatchFiller::kMaxFields> fields{};
  for (const auto& [i, r] : t.cpu) {
    DecodeThread::Taken& k = t.taken[i];
    if (!k.live) continue;
    SlotMeta& meta = *meta_[k.job.slot];
    if (filler_.outdated(meta)) {
      meta.cancelled.store(true);
      k.live = false;
      continue;
    }
    if (meta.failed_row.load(std::memory_order_relaxed) < r) {
      k.live = false;
      continue;
    }
    filler_.row_pointers(k.job.slot, r, fields.data());
    const size_t index = order_[meta.sequence * options_.batch_size + r];
    if (!filler_.write_with_policy(t.worker, r, index, fields.data(), meta)) {
      k.live = false;
      continue;
    }
    cpu_images_.fetch_add(1, std::memory_order_relaxed);
  }
}

void GpuDecodeStage::fail_jobs(DecodeThread& t, std::exception_ptr error) {
  // Each live job's batch fails at the job's first image (its first GPU row without images).
  for (size_t i = 0; i < t.taken.size(); ++i) {
    DecodeThread::Taken& k = t.taken[i];
    if (!k.live) continue;
    SlotMeta& meta = *meta_[k.job.slot];
    std::optional<size_t> row;
    for (const auto& [taken, r] : t.of) {
      if (taken == i) {
        row = r;
        break;
      }
    }
    if (!row) {
      row = k.first;
      while (*row + 1 < k.last && meta.route[*row] != Decoder::kGpu) ++*row;
    }
    filler_.record_failure(meta, *row, order_[meta.sequence * options_.batch_size + *row], error);
    k.live = false;
  }
}

void GpuDecodeStage::end_call(std::exception_ptr failure) noexcept {
  std::exception_ptr lost;
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const GpuDecodeError& e) {
      if (e.context_lost()) {
        try {
          lost = std::make_exception_ptr(GpuDecodeError(
              "conveyor: GPU decode (" + status_ + ") lost the device: " + e.what() +
                  " (a sticky CUDA error: the device's CUDA context can no longer be used, so "
                  "the loader cannot go on)",
              e.error_name(), true));
        } catch (...) {  // no memory for the message: the decoder's own error says enough
          lost = failure;
        }
      }
    } catch (...) {  // another error: the device is still usable
    }
  }
  {
    std::lock_guard<std::mutex> lock(device_mutex_);
    ++calls_ended_;
    if (lost && !device_lost_) device_lost_ = lost;
  }
  device_changed_.notify_all();
}

void GpuDecodeStage::check() const {
  std::exception_ptr lost;
  {
    std::lock_guard<std::mutex> lock(device_mutex_);
    lost = device_lost_;
  }
  if (lost) std::rethrow_exception(lost);
}

std::exception_ptr GpuDecodeStage::explain(std::exception_ptr failure) const {
  std::exception_ptr lost;
  {
    // A decode call under way may be failing with the error that failed the copy: wait for as
    // many calls to end as had started (a sticky error ends them at once), a few seconds at most.
    std::unique_lock<std::mutex> lock(device_mutex_);
    const uint64_t started = calls_started_;
    device_changed_.wait_for(lock, std::chrono::seconds(5),
                             [&] { return calls_ended_ >= started || device_lost_ != nullptr; });
    lost = device_lost_;
  }
  if (!lost || lost == failure) return failure;
  try {
    std::rethrow_exception(lost);
  } catch (const GpuDecodeError& e) {
    try {
      return std::make_exception_ptr(GpuDecodeError(
          std::string(e.what()) + "; the copy stage failed with it: " + exception_message(failure),
          e.error_name(), true));
    } catch (...) {
      return lost;
    }
  } catch (...) {
    return lost;
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
  // Each decode thread is either on a call or waiting for a job (a call under way counts as
  // idle until it ends).
  const double lifetime = 1e-9 * static_cast<double>(nanoseconds_since(started_));
  s.gpu_idle_seconds =
      std::max(0.0, lifetime * static_cast<double>(threads_.size()) - s.gpu_busy_seconds);
  s.cpu_idle_seconds = 1e-9 * static_cast<double>(cpu_idle_ns_.load(std::memory_order_relaxed));
  if (balancer_) {
    const DecodeBalancer::Snapshot b = balancer_->snapshot();
    s.cpu_ns_per_image = b.cpu_ns_per_image;
    s.gpu_ns_per_image = b.gpu_ns_per_image;
  }
  return s;
}

}  // namespace conveyor::detail
