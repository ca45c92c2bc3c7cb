#include "conveyor/loader.h"

#include <algorithm>
#include <array>
#include <numeric>

#include <ATen/ATen.h>

#include "conveyor/random.h"
#include "options.h"

namespace conveyor {
namespace {

constexpr size_t kMaxFields = 16;
constexpr size_t kMaxSkipRecords = 1000;

using Clock = std::chrono::steady_clock;

// The queues are sized for every job and every slot, so a failed push or pop is a bookkeeping
// bug; acting on a made-up index would corrupt a batch, so stop instead.
template <typename Queue>
uint32_t pop_or_die(Queue& queue) {
  uint32_t value = 0;
  if (!queue.pop(value)) std::terminate();
  return value;
}
template <typename Queue>
void push_or_die(Queue& queue, uint32_t value) {
  if (!queue.bounded_push(value)) std::terminate();
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string exception_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception (not derived from std::exception)";
  }
}

void permutation(size_t n, uint64_t seed, uint64_t epoch, std::vector<size_t>& out) {
  out.resize(n);
  std::iota(out.begin(), out.end(), size_t{0});
  SampleRng rng(seed, epoch, 0x5a3d1e);
  for (size_t i = n; i > 1; --i) {  // Fisher-Yates
    size_t j = static_cast<size_t>(rng.next() % i);
    std::swap(out[i - 1], out[j]);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Samplers

void SequentialSampler::indices(size_t n, uint64_t, std::vector<size_t>& out) const {
  out.resize(n);
  std::iota(out.begin(), out.end(), size_t{0});
}

void RandomSampler::indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const {
  permutation(n, seed_, epoch, out);
}

DistributedSampler::DistributedSampler(size_t rank, size_t world_size, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (world_size == 0 || rank >= world_size) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) +
                                " is not in [0, " + std::to_string(world_size) + ")");
  }
}

size_t DistributedSampler::per_rank(size_t n) const {
  return drop_last_ ? n / world_size_ : (n + world_size_ - 1) / world_size_;
}

void DistributedSampler::indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const {
  std::vector<size_t> all;
  if (shuffle_) {
    permutation(n, seed_, epoch, all);
  } else {
    all.resize(n);
    std::iota(all.begin(), all.end(), size_t{0});
  }
  const size_t total = per_rank(n) * world_size_;
  if (total > all.size() && !all.empty()) {  // pad by repeating the head, as PyTorch does
    const size_t original = all.size();
    for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i % original]);
  }
  all.resize(total);
  out.clear();
  for (size_t i = rank_; i < total; i += world_size_) out.push_back(all[i]);
}

// ---------------------------------------------------------------------------------------------
// Errors and batches

SampleError::SampleError(const std::string& message, size_t index, std::string path,
                         std::exception_ptr original)
    : std::runtime_error(message), index_(index), path_(std::move(path)), original_(original) {}

const at::Tensor& Batch::field(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return fields[i];
  }
  throw std::out_of_range("Batch has no field '" + name + "'");
}

// ---------------------------------------------------------------------------------------------
// DataLoader internals

struct DataLoader::Shared {
  SlotRing ring;
  std::atomic<size_t> held{0};  // slots viewed by batches the user still holds (CPU path)
  explicit Shared(SlotRing::Options o) : ring(std::move(o)) {}
};

// Written by the consumer before it queues the batch's jobs; then the chunks' workers write their
// own rows of `indices`, and the flags below say how the batch ended. The worker (or the
// cancelling consumer) that takes `remaining` to zero owns the slot from then on.
struct DataLoader::SlotMeta {
  size_t sequence = 0;
  uint64_t generation = 0;
  uint64_t epoch = 0;
  std::vector<size_t> indices;       // one per row; reserved to batch_size once: never reallocates
  std::atomic<size_t> remaining{0};  // chunks not finished
  std::atomic<bool> cancelled{false};
  // The lowest failing row (SIZE_MAX: none, the batch can be delivered); its error is the
  // batch's, whichever chunk finished first.
  std::atomic<size_t> failed_row{SIZE_MAX};
  std::mutex error_mutex;  // taken only when a sample fails for good
  std::exception_ptr error;
  size_t error_index = 0;
  std::string error_path;
  std::string error_message;
};

struct DataLoader::Staged {
  Batch batch;
  CudaEvent* event = nullptr;
  std::exception_ptr failure;
};

DataLoader::DataLoader(std::shared_ptr<SampleSource> source, LoaderOptions options,
                       std::unique_ptr<Sampler> sampler, std::unique_ptr<CopyEngine> copy_engine)
    : source_(std::move(source)),
      options_(detail::resolve_options(options, /*check_device=*/!copy_engine)),
      sampler_(sampler ? std::move(sampler) : SequentialSampler::make()),
      chunks_((options_.batch_size + options_.chunk_size - 1) / options_.chunk_size),
      jobs_(options_.slots * chunks_),
      completed_(options_.slots) {
  if (!source_) throw std::invalid_argument("conveyor: DataLoader needs a SampleSource");
  fields_ = source_->fields();
  if (fields_.empty() || fields_.size() > kMaxFields) {
    throw std::invalid_argument("conveyor: a source must have 1 to 16 fields");
  }
  if (copy_engine) {
    engine_ = std::move(copy_engine);
  } else if (options_.device.is_cuda()) {
    engine_ = make_cuda_copy_engine(options_.device);  // throws when no GPU is usable
  } else if (!options_.device.is_cpu()) {
    throw std::invalid_argument("conveyor: unsupported device " + options_.device.str());
  }
  SlotRing::Options ring;
  ring.slots = options_.slots;
  for (const auto& f : fields_) {
    field_bytes_.push_back(f.sample_bytes());
    ring.layout.field_bytes.push_back(f.sample_bytes() * options_.batch_size);
  }
  // The ring is pinned when batches are copied to a CUDA device (required for asynchronous
  // copies), on that device. CPU batches view pageable slots; pin_memory then hands them out as
  // copies in LibTorch's pinned host memory, whose non_blocking copies LibTorch tracks.
  const bool to_cuda = engine_ && engine_->device().is_cuda();
  ring.memory = to_cuda ? HostBuffer::Kind::kAuto : HostBuffer::Kind::kPageable;
  if (to_cuda) ring.cuda_device = engine_->device().has_index() ? engine_->device().index() : 0;
  shared_ = std::make_shared<Shared>(std::move(ring));
  for (size_t i = 0; i < options_.slots; ++i) {
    meta_.push_back(std::make_unique<SlotMeta>());
    meta_.back()->indices.reserve(options_.batch_size);
  }
  reorder_.assign(options_.slots, -1);
  source_->prepare(options_.workers);
  try {
    for (size_t w = 0; w < options_.workers; ++w) {
      workers_.emplace_back([this, w] { worker_loop(w); });
    }
  } catch (...) {  // no destructor will run: stop the workers already started
    stop_.store(true);
    jobs_count_.release(static_cast<std::ptrdiff_t>(workers_.size()));
    workers_.clear();
    throw;
  }
}

DataLoader::~DataLoader() { join(); }

void DataLoader::join() {
  if (joined_) return;
  joined_ = true;
  stop_.store(true);
  generation_.fetch_add(1);  // workers abandon their batch at the next sample
  jobs_count_.release(static_cast<std::ptrdiff_t>(workers_.size()));  // wake every worker
  shared_->ring.close();
  workers_.clear();  // joins
  staged_.clear();
  engine_.reset();  // waits for outstanding copies and their callbacks
}

size_t DataLoader::batches_per_epoch() const {
  std::vector<size_t> order;
  sampler_->indices(source_->size(), epoch_, order);
  const size_t b = options_.batch_size;
  return options_.drop_last ? order.size() / b : (order.size() + b - 1) / b;
}

size_t DataLoader::pinned_bytes() const { return shared_->ring.bytes(); }
bool DataLoader::is_pinned() const { return shared_->ring.is_pinned(); }

std::string DataLoader::mode() const {
  if (engine_) {
    return std::string(is_pinned() ? "pinned" : "pageable") + " host ring of " +
           std::to_string(shared_->ring.slots()) + " slots, side-stream copies to " +
           engine_->device().str();
  }
  std::string why = cuda_available() ? "device is cpu" : "no CUDA device is usable";
  return "CPU only (" + why + "): " + (is_pinned() ? "pinned" : "pageable") + " host ring of " +
         std::to_string(shared_->ring.slots()) + " slots, no copy stage";
}

LoaderStats DataLoader::stats() const {
  LoaderStats s;
  s.batches = batches_;
  s.samples = samples_;
  s.errors = errors_.load();
  s.fill_seconds = static_cast<double>(fill_ns_.load()) * 1e-9;
  s.wait_seconds = wait_seconds_;
  s.copy_issue_seconds = copy_issue_seconds_;
  s.copies_to_host = copies_to_host_;
  s.slot_states = shared_->ring.count_states();
  {
    std::lock_guard<std::mutex> lock(skipped_mutex_);
    s.skipped = skipped_;
    s.skipped_samples = skipped_samples_;
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Workers

void DataLoader::worker_loop(size_t worker) {
  for (;;) {
    jobs_count_.acquire();
    if (stop_.load()) return;
    fill(worker, pop_or_die(jobs_));  // a permit always matches a queued job (push, then release)
  }
}

void DataLoader::fill(size_t worker, uint32_t job) {
  const auto t0 = Clock::now();
  const uint32_t slot = static_cast<uint32_t>(job / chunks_);
  SlotMeta& meta = *meta_[slot];  // written by the consumer before it queued the job
  const size_t first = (job % chunks_) * options_.chunk_size;
  const size_t last = std::min(meta.indices.size(), first + options_.chunk_size);
  const size_t base = meta.sequence * options_.batch_size;  // the batch's first place in order_
  std::array<std::byte*, kMaxFields> rows{};
  for (size_t r = first; r < last; ++r) {
    if (generation_.load(std::memory_order_relaxed) != meta.generation) {
      meta.cancelled.store(true);
      break;
    }
    // Rows after a known failure cannot change the batch's error; rows before it still can.
    if (meta.failed_row.load(std::memory_order_relaxed) < r) break;
    for (size_t f = 0; f < fields_.size(); ++f)
      rows[f] = shared_->ring.field(slot, f) + r * field_bytes_[f];
    if (!write_with_policy(worker, r, order_[base + r], rows.data(), meta)) break;
  }
  fill_ns_.fetch_add(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
  if (meta.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The batch's last chunk: hand the slot on.
  if (meta.failed_row.load() == SIZE_MAX && !meta.cancelled.load()) shared_->ring.mark_ready(slot);
  push_or_die(completed_, slot);
  completed_count_.release();
}

std::string DataLoader::describe(size_t index) const {
  try {
    return source_->describe(index);
  } catch (...) {
    return "sample " + std::to_string(index);
  }
}

void DataLoader::record_failure(SlotMeta& meta, size_t row, size_t index,
                                std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(meta.error_mutex);
  if (row >= meta.failed_row.load()) return;  // a chunk failed at an earlier row: its error wins
  meta.failed_row.store(row);
  meta.error = error;
  meta.error_index = index;
  try {
    meta.error_path = describe(index);
    meta.error_message = exception_message(error);
  } catch (...) {
    meta.error_message = "(the error could not be described)";
  }
}

bool DataLoader::write_with_policy(size_t worker, size_t row, size_t index, std::byte* const* rows,
                                   SlotMeta& meta) {
  SampleContext ctx{worker, index, options_.seed, meta.epoch};
  try {
    source_->write_sample(ctx, rows);
    meta.indices[row] = index;
    return true;
  } catch (...) {
    errors_.fetch_add(1);
    std::exception_ptr error = std::current_exception();
    if (options_.on_error == ErrorPolicy::kSkip) {
      {
        std::lock_guard<std::mutex> lock(skipped_mutex_);
        ++skipped_;
        if (skipped_samples_.size() < kMaxSkipRecords) {
          try {
            skipped_samples_.push_back(
                {index, describe(index), exception_message(error), meta.epoch});
          } catch (...) {  // out of memory for the record: the count above still holds
          }
        }
      }
      const size_t n = source_->size();
      for (size_t k = 1; k <= options_.max_substitutes && k < n; ++k) {
        ctx.index = (index + k) % n;
        try {
          source_->write_sample(ctx, rows);
          meta.indices[row] = ctx.index;
          return true;
        } catch (...) {
          errors_.fetch_add(1);
        }
      }
      error = std::make_exception_ptr(std::runtime_error(
          exception_message(error) + "; and none of the next " +
          std::to_string(options_.max_substitutes) + " samples loaded as a substitute"));
    }
    record_failure(meta, row, index, error);
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Consumer

void DataLoader::start_epoch() {
  if (joined_) throw std::logic_error("conveyor: the DataLoader was joined; it yields no batches");
  // The new order is made and checked before anything changes, so a throwing sampler leaves the
  // current epoch as it was.
  const uint64_t epoch = next_epoch_ ? *next_epoch_ : started_ ? epoch_ + 1 : epoch_;
  std::vector<size_t> order;
  sampler_->indices(source_->size(), epoch, order);
  for (size_t index : order) {
    if (index >= source_->size()) {
      throw std::out_of_range("conveyor: the sampler yielded index " + std::to_string(index) +
                              " but the dataset has " + std::to_string(source_->size()) +
                              " samples");
    }
  }
  if (started_) cancel_epoch();
  next_epoch_.reset();
  epoch_ = epoch;
  started_ = true;
  order_.swap(order);  // no batch is dispatched now, so no worker reads order_
  const size_t b = options_.batch_size;
  num_batches_ = options_.drop_last ? order_.size() / b : (order_.size() + b - 1) / b;
  generation_.fetch_add(1);
  dispatched_ = 0;
  collected_ = 0;
  next_sequence_ = 0;
  next_stage_ = 0;
  deferred_failure_ = nullptr;
  std::fill(reorder_.begin(), reorder_.end(), -1);
  top_up();
}

void DataLoader::dispatch(uint32_t slot) {
  SlotMeta& meta = *meta_[slot];
  meta.sequence = dispatched_++;
  meta.generation = generation_.load();
  meta.epoch = epoch_;
  const size_t first = meta.sequence * options_.batch_size;
  const size_t rows = std::min(order_.size() - first, options_.batch_size);
  meta.indices.resize(rows);  // within the reserved capacity
  meta.cancelled.store(false);
  meta.failed_row.store(SIZE_MAX);
  meta.error = nullptr;
  const size_t chunks = (rows + options_.chunk_size - 1) / options_.chunk_size;
  meta.remaining.store(chunks, std::memory_order_release);
  for (size_t c = 0; c < chunks; ++c) {
    push_or_die(jobs_, static_cast<uint32_t>(slot * chunks_ + c));
  }
  jobs_count_.release(static_cast<std::ptrdiff_t>(chunks));
}

// Hands every free slot a batch, in order, without blocking.
void DataLoader::top_up() {
  while (dispatched_ < num_batches_) {
    std::optional<uint32_t> slot = shared_->ring.try_acquire();
    if (!slot) return;
    dispatch(*slot);
  }
}

// Waits for a free slot and dispatches the next batch. A slot always comes: the user never holds
// every slot (see next()) and copies finish on their own.
void DataLoader::dispatch_blocking() {
  // Wait in short steps so that a copy stage that can no longer finish (a sticky CUDA error)
  // becomes an exception instead of a hang.
  const auto deadline =
      options_.timeout ? Clock::now() + *options_.timeout : Clock::time_point::max();
  for (;;) {
    auto step = std::chrono::milliseconds(200);
    if (options_.timeout) {
      step = std::min(step, std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::max(deadline - Clock::now(), Clock::duration::zero())));
    }
    std::optional<uint32_t> slot = shared_->ring.try_acquire_for(step);
    if (slot) {
      dispatch(*slot);
      return;
    }
    if (shared_->ring.closed()) throw std::logic_error("conveyor: the DataLoader was joined");
    if (engine_) engine_->check();
    if (Clock::now() >= deadline) {
      throw TimeoutError("conveyor: no batch slot came free within " +
                         std::to_string(options_.timeout->count()) + " ms (batch " +
                         std::to_string(dispatched_) + " of epoch " + std::to_string(epoch_) + ")");
    }
  }
}

void DataLoader::cancel_epoch() {
  generation_.fetch_add(1);  // workers abandon their batch at the next sample
  // Take back the jobs no worker started, then wait for the batches still being filled. A batch
  // whose last chunk is taken back here is collected here; otherwise the worker filling its last
  // chunk pushes it to completed_.
  while (jobs_count_.try_acquire()) {
    const uint32_t job = pop_or_die(jobs_);
    const auto slot = static_cast<uint32_t>(job / chunks_);
    SlotMeta& meta = *meta_[slot];
    meta.cancelled.store(true);
    if (meta.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      ++collected_;
      shared_->ring.release(slot);
    }
  }
  while (collected_ < dispatched_) {
    completed_count_.acquire();
    const uint32_t slot = pop_or_die(completed_);
    ++collected_;
    shared_->ring.release(slot);
  }
  for (auto& r : reorder_) {
    if (r >= 0) shared_->ring.release(static_cast<uint32_t>(r));
    r = -1;
  }
  staged_.clear();  // their slots come back through the copy callbacks
}

size_t DataLoader::wanted() const { return engine_ ? next_stage_ : next_sequence_; }

bool DataLoader::take_ready(uint32_t& slot) {
  // Ordered: the wanted sequence may already be waiting in the reorder buffer.
  if (options_.enforce_ordering) {
    int64_t& r = reorder_[wanted() % reorder_.size()];
    if (r >= 0) {
      slot = static_cast<uint32_t>(r);
      r = -1;
      return true;
    }
  }
  return false;
}

uint32_t DataLoader::take_next(bool blocking) {
  for (;;) {
    uint32_t slot = 0;
    if (take_ready(slot)) return slot;
    top_up();
    // Nothing that could deliver the wanted batch is in flight: dispatch it.
    const bool in_flight =
        options_.enforce_ordering ? wanted() < dispatched_ : collected_ < dispatched_;
    if (!in_flight) {
      if (!blocking) return UINT32_MAX;
      dispatch_blocking();
      continue;
    }
    if (blocking) {
      if (options_.timeout) {
        if (!completed_count_.try_acquire_for(*options_.timeout)) {
          throw TimeoutError("conveyor: no batch arrived within " +
                             std::to_string(options_.timeout->count()) + " ms (waiting for batch " +
                             std::to_string(wanted()) + " of epoch " + std::to_string(epoch_) +
                             ", " + std::to_string(workers_.size()) + " workers)");
        }
      } else {
        completed_count_.acquire();
      }
    } else if (!completed_count_.try_acquire()) {
      return UINT32_MAX;
    }
    const uint32_t popped = pop_or_die(completed_);
    ++collected_;
    if (!options_.enforce_ordering) return popped;
    reorder_[meta_[popped]->sequence % reorder_.size()] = static_cast<int64_t>(popped);
  }
}

void DataLoader::raise_failure(const SlotMeta& meta) {
  if (meta.cancelled) {
    throw std::logic_error("conveyor: internal error: a cancelled batch reached the consumer");
  }
  throw SampleError("conveyor: sample " + std::to_string(meta.error_index) + " (" +
                        meta.error_path + ") failed in batch " + std::to_string(meta.sequence) +
                        " of epoch " + std::to_string(meta.epoch) + ": " + meta.error_message,
                    meta.error_index, meta.error_path, meta.error);
}

std::vector<at::Tensor> DataLoader::slot_views(uint32_t slot, size_t rows) const {
  std::vector<at::Tensor> views;
  views.reserve(fields_.size());
  for (size_t f = 0; f < fields_.size(); ++f) {
    std::vector<int64_t> shape{static_cast<int64_t>(rows)};
    shape.insert(shape.end(), fields_[f].sample_shape.begin(), fields_[f].sample_shape.end());
    views.push_back(at::from_blob(shared_->ring.field(slot, f), shape,
                                  at::TensorOptions().dtype(fields_[f].dtype)));
  }
  return views;
}

Batch DataLoader::host_batch(uint32_t slot, bool zero_copy) {
  const SlotMeta& meta = *meta_[slot];
  Batch batch;
  batch.indices = meta.indices;
  batch.epoch = meta.epoch;
  batch.sequence = meta.sequence;
  for (const auto& f : fields_) batch.names.push_back(f.name);
  std::vector<at::Tensor> views = slot_views(slot, meta.indices.size());
  const bool pinned_copy = options_.pin_memory && cuda_available();
  if (!zero_copy || pinned_copy) {
    for (auto& v : views) {
      batch.fields.push_back(
          pinned_copy ? at::empty(v.sizes(), v.options().pinned_memory(true)).copy_(v) : v.clone());
    }
    shared_->ring.release(slot);
    if (!zero_copy) ++copies_to_host_;
    return batch;
  }
  // The slot returns to the ring when the last tensor viewing it is released.
  shared_->held.fetch_add(1);
  std::shared_ptr<void> lease(nullptr, [shared = shared_, slot](void*) {
    shared->held.fetch_sub(1);
    shared->ring.release(slot);
  });
  for (size_t f = 0; f < views.size(); ++f) {
    batch.fields.push_back(at::from_blob(
        shared_->ring.field(slot, f), views[f].sizes(), [lease](void*) {},
        at::TensorOptions().dtype(fields_[f].dtype).pinned_memory(false)));
  }
  return batch;
}

void DataLoader::stage_copies(bool need_one) {
  while (staged_.size() < options_.prefetch_factor && next_stage_ < num_batches_) {
    const bool block = need_one && staged_.empty();
    uint32_t slot = 0;
    const auto t_wait = Clock::now();
    slot = take_next(block);
    if (block) wait_seconds_ += seconds_since(t_wait);
    if (slot == UINT32_MAX) return;
    ++next_stage_;
    const auto t0 = Clock::now();
    const SlotMeta& meta = *meta_[slot];
    auto staged = std::make_unique<Staged>();
    if (meta.error || meta.cancelled) {
      try {
        raise_failure(meta);
      } catch (...) {
        staged->failure = std::current_exception();
      }
      shared_->ring.release(slot);
    } else {
      staged->batch.indices = meta.indices;
      staged->batch.epoch = meta.epoch;
      staged->batch.sequence = meta.sequence;
      for (const auto& f : fields_) staged->batch.names.push_back(f.name);
      std::vector<at::Tensor> views = slot_views(slot, meta.indices.size());
      staged->event = shared_->ring.begin_copy(slot);
      try {
        staged->batch.fields = engine_->start(
            views, staged->event, [shared = shared_, slot] { shared->ring.copy_finished(slot); });
      } catch (...) {  // the engine has handed the slot back through on_finished
        staged->failure = std::current_exception();
        staged->batch.fields.clear();
      }
    }
    staged_.push_back(std::move(staged));
    copy_issue_seconds_ += seconds_since(t0);
  }
}

std::optional<Batch> DataLoader::next() {
  if (joined_) throw std::logic_error("conveyor: the DataLoader was joined; it yields no batches");
  if (!started_) start_epoch();
  if (next_sequence_ >= num_batches_) return std::nullopt;
  if (engine_) {
    if (deferred_failure_) std::rethrow_exception(std::exchange(deferred_failure_, nullptr));
    stage_copies(/*need_one=*/true);
    std::unique_ptr<Staged> staged = std::move(staged_.front());
    staged_.pop_front();
    ++next_sequence_;
    if (staged->failure) std::rethrow_exception(staged->failure);
    // Order the caller after this batch's copy before the slot's event can be re-recorded.
    engine_->make_visible(staged->batch.fields, staged->event);
    try {
      stage_copies(/*need_one=*/false);  // keep the device prefetch_factor batches ahead
    } catch (...) {
      deferred_failure_ = std::current_exception();  // this batch is good: report it next time
    }
    ++batches_;
    samples_ += staged->batch.size();
    return std::move(staged->batch);
  }
  const auto t_wait = Clock::now();
  uint32_t slot = take_next(/*blocking=*/true);
  wait_seconds_ += seconds_since(t_wait);
  ++next_sequence_;
  const SlotMeta& meta = *meta_[slot];
  if (meta.error || meta.cancelled) {
    std::exception_ptr failure;
    try {
      raise_failure(meta);
    } catch (...) {
      failure = std::current_exception();
    }
    shared_->ring.release(slot);
    std::rethrow_exception(failure);
  }
  // Zero copy unless that would leave the pipeline without a slot (the user holding every
  // other batch): then this batch is handed out as a copy so iteration can go on.
  const bool zero_copy = shared_->held.load() + 2 <= shared_->ring.slots();
  Batch batch = host_batch(slot, zero_copy);
  ++batches_;
  samples_ += batch.size();
  return batch;
}

DataLoader::Iterator DataLoader::begin() {
  start_epoch();
  return Iterator(this, epoch_);
}

// ---------------------------------------------------------------------------------------------
// Iterator

DataLoader::Iterator::Iterator(DataLoader* loader, uint64_t epoch)
    : loader_(loader), epoch_(epoch), batch_(loader->next()) {}

void DataLoader::Iterator::check_current() const {
  if (loader_->epoch_ != epoch_) {
    throw std::logic_error("conveyor: this iterator belongs to epoch " + std::to_string(epoch_) +
                           ", which a later begin() replaced");
  }
}

Batch& DataLoader::Iterator::operator*() {
  check_current();
  if (!batch_) throw std::out_of_range("conveyor: dereferenced the end of a DataLoader epoch");
  return *batch_;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  check_current();
  if (!batch_) throw std::out_of_range("conveyor: incremented past the end of a DataLoader epoch");
  batch_.reset();  // release this batch's slot before waiting for the next
  batch_ = loader_->next();
  return *this;
}

std::unique_ptr<DataLoader> make_image_folder_loader(const std::string& root,
                                                     const ImageTransform& transform,
                                                     const LoaderOptions& options, bool shuffle) {
  std::shared_ptr<SampleSource> source = ImageSource::image_folder(root, transform);
  std::unique_ptr<Sampler> sampler =
      shuffle ? RandomSampler::make(options.seed) : SequentialSampler::make();
  return std::make_unique<DataLoader>(std::move(source), options, std::move(sampler));
}

}  // namespace conveyor
