// The engine: construction, the workers, and the consumer's dispatch, collection and
// cancelling (hand-out: hand_out.cpp; checkpoints: checkpoint.cpp).
#include "engine.h"

#include <algorithm>
#include <chrono>

#include "conveyor/internal/invariant.h"
#include "conveyor/internal/trace.h"
#include "ragged.h"

namespace conveyor {

DataLoader::Impl::Impl(std::shared_ptr<SampleSource> source, detail::ResolvedOptions options,
                       std::unique_ptr<Sampler> sampler, std::unique_ptr<CopyEngine> copy_engine)
    : source_(std::move(source)),
      copy_engine_(std::move(copy_engine)),
      options_(std::move(options)),
      sampler_(sampler ? std::move(sampler) : SequentialSampler::make()),
      jobs_(options_.slots, options_.chunks_per_batch),
      completed_(options_.slots),
      gate_(options_.workers),
      reorder_(options_.slots) {
  if (!source_) throw std::invalid_argument("conveyor: DataLoader needs a SampleSource");
  if (source_->learns_fields() && source_->fields().empty()) {
    mode_ =
        "not started (the engine starts on the first batch, once a background thread has "
        "read one sample to learn the shapes of the batch's tensors)";
    return;
  }
  build();
}

void DataLoader::Impl::build() {
  if (built()) return;
  if (joined_) detail::throw_joined();
  fields_ = source_->fields();
  if (fields_.empty() || fields_.size() > detail::BatchFiller::kMaxFields) {
    throw std::invalid_argument("conveyor: a source must have 1 to " +
                                std::to_string(detail::BatchFiller::kMaxFields) + " fields");
  }
  SlotRing::Options ring;
  ring.slots = options_.slots;
  for (const auto& f : fields_) {  // throws for a ragged field the slot cannot hold
    ring.layout.field_bytes.push_back(detail::field_region_bytes(f, options_.batch_size));
  }
  std::unique_ptr<CopyEngine> copy_engine = std::move(copy_engine_);
  if (!copy_engine && options_.device.is_cuda()) {
    copy_engine = make_cuda_copy_engine(options_.device);
  }
  // The ring is pinned when batches are copied to a CUDA device (required for asynchronous
  // copies), on that device. CPU batches view pageable slots; pin_memory then hands them out as
  // copies in LibTorch's pinned host memory, whose non_blocking copies LibTorch tracks.
  const bool to_cuda = copy_engine && copy_engine->device().is_cuda();
  ring.memory = to_cuda ? HostBuffer::Kind::kAuto : HostBuffer::Kind::kPageable;
  if (to_cuda && copy_engine->device().has_index()) {
    ring.cuda_device = copy_engine->device().index();
  }
  if (options_.batch_transform) {  // throws for a pipeline that cannot take the fields
    batch_stage_ = std::make_shared<const detail::BatchStage>(
        options_.batch_transform, fields_, options_.seed, options_.record_augment_params);
  }
  shared_ = std::make_shared<detail::SharedRing>(std::move(ring));
  const std::string ring_mode = std::string(shared_->ring.is_pinned() ? "pinned" : "pageable") +
                                " host ring of " + std::to_string(shared_->ring.slots()) + " slots";
  if (copy_engine) {
    mode_ = ring_mode + ", side-stream copies to " + copy_engine->device().str();
    stager_ = std::make_unique<detail::DeviceStager>(std::move(copy_engine),
                                                     options_.prefetch_factor, batch_stage_);
  } else {
    const CudaStatus cuda = cuda_status();
    mode_ = "CPU only (" +
            (cuda.usable() ? std::string("device is cpu")
                           : "no CUDA device is usable: " + cuda.reason) +
            "): " + ring_mode + ", no copy stage";
    host_.emplace(shared_, fields_, options_.batch_size, options_.pin_memory);
  }
  meta_.clear();  // a build() that threw may have made some
  for (size_t i = 0; i < options_.slots; ++i) {
    meta_.push_back(std::make_unique<detail::SlotMeta>());
    meta_.back()->indices.reserve(options_.batch_size);
    meta_.back()->repeats.reserve(options_.batch_size);
  }
  // GPU decode's threads read samples as more workers.
  const bool gpu_wanted = options_.gpu_decode.mode != GpuDecode::Mode::kOff;
  source_->prepare(options_.workers + (gpu_wanted ? options_.gpu_decode.threads : 0));
  filler_ =  // last but the threads: built() from here on
      std::make_unique<detail::BatchFiller>(*source_, shared_->ring, options_, order_, generation_);
  if (gpu_wanted) {
    std::optional<c10::Device> device;
    if (stager_) device = stager_->engine().device();
    detail::GpuDecodeStage::Plan plan = detail::GpuDecodeStage::make(
        {*source_, *filler_, meta_, completed_, options_, order_}, device);
    gpu_ = std::move(plan.stage);
    gpu_status_ = std::move(plan.status);
    mode_ += gpu_ ? ", GPU decode: " + gpu_status_ : "; " + gpu_status_;
    if (gpu_) filler_->report_to(gpu_->balancer());
  }
  depth_ = options_.slots;
  if (options_.auto_workers) {
    detail::WorkerTuner::Options tuning;
    tuning.max_workers = options_.workers;
    tuning.initial_workers = options_.workers;  // the whole budget, lowered once measured
    tuning.slots = options_.slots;
    tuning.prefetch_factor = options_.prefetch_factor;
    tuner_.emplace(tuning);
    gate_.set_active(tuner_->active());
    depth_ = tuner_->depth();
  }
  try {
    for (size_t w = 0; w < options_.workers; ++w) {
      workers_.emplace_back([this, w] { worker_loop(w); });
    }
  } catch (...) {  // no destructor will run: stop the threads already started
    gate_.stop();
    jobs_.stop();
    if (gpu_) gpu_->stop();
    workers_.clear();
    throw;
  }
}

DataLoader::Impl::~Impl() { join(); }

void DataLoader::Impl::join() {
  if (joined_) return;
  joined_ = true;
  generation_.fetch_add(1);  // workers abandon their batch at the next sample
  gate_.stop();              // parked workers wake and return
  jobs_.stop();
  if (gpu_) gpu_->stop();  // joins the decode thread
  if (shared_) shared_->ring.close();
  workers_.clear();  // joins
  stager_.reset();   // drops staged batches, then waits for outstanding copies and callbacks
}

size_t DataLoader::Impl::batches_of(size_t samples) const {
  const size_t b = options_.batch_size;
  return options_.drop_last ? samples / b : (samples + b - 1) / b;
}

size_t DataLoader::Impl::batches_per_epoch() const {
  // The whole order of the epoch, counted once per epoch (start_epoch() counts a whole order it
  // made; a resumed one is a remainder, so the count is made here).
  if (!epoch_batches_ || epoch_batches_->first != epoch_) {
    std::vector<size_t> order;
    sampler_->indices(source_->size(), epoch_, order);
    epoch_batches_.emplace(epoch_, batches_of(order.size()));
  }
  return epoch_batches_->second;
}

LoaderStats DataLoader::Impl::stats() const {
  LoaderStats s;
  s.batches = batches_;
  s.samples = samples_;
  if (!built()) return s;
  s.errors = filler_->errors();
  s.fill_seconds = filler_->fill_seconds();
  s.wait_seconds = wait_seconds_;
  s.copy_issue_seconds = copy_issue_seconds_;
  s.transform_seconds = static_cast<double>(transform_ns_.load()) * 1e-9 +
                        (stager_ ? stager_->transform_seconds() : 0.0);
  s.copies_to_host = host_ ? host_->copies_to_host() : 0;
  s.slot_states = shared_->ring.count_states();
  s.skipped = filler_->skipped().count();
  s.skipped_samples = filler_->skipped().records();
  s.active_workers = gate_.active();
  if (tuner_) s.active_workers_history = tuner_->history();
  if (gpu_) {
    s.gpu_decode = gpu_->stats();
    s.gpu_decode.cpu_images += filler_->hybrid_cpu_rows();
  } else {
    s.gpu_decode.status = gpu_status_;
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Workers

void DataLoader::Impl::worker_loop(size_t worker) {
  const std::string number = std::to_string(worker);
  trace::name_this_thread("Conveyor worker " + number, "conveyor-w" + number);
  while (gate_.wait_turn(worker)) {  // parked while above the active count (kAutoWorkers)
    const auto waiting = gpu_ ? Clock::now() : Clock::time_point();  // idle time: GPU decode's
    std::optional<detail::Job> job = jobs_.wait();
    if (gpu_) gpu_->add_cpu_idle(Clock::now() - waiting);
    if (!job) return;
    // The slot's meta was written before its jobs were queued.
    detail::SlotMeta& meta = *meta_[job->slot];
    bool last = false;
    {
      const trace::Range chunk(trace::Name::kChunk, meta.sequence);
      last = filler_->fill(worker, job->slot, job->chunk, meta);
    }
    if (last && batch_stage_ && !stager_ && !meta.failed() && !meta.cancelled.load()) {
      transform_on_worker(job->slot, meta);
    }
    if (last) completed_.push(job->slot);
  }
}

void DataLoader::Impl::transform_on_worker(uint32_t slot, detail::SlotMeta& meta) noexcept {
  const auto t0 = Clock::now();
  try {
    const size_t rows = meta.indices.size();
    const detail::SlotTensors views =
        detail::slot_views(shared_->ring, slot, fields_, rows, options_.batch_size);
    std::vector<at::Tensor> tensors = views.fields;
    meta.augment_params =
        batch_stage_->run(tensors, meta.indices, meta.repeats, meta.epoch, meta.sequence);
    meta.transformed.resize(fields_.size());
    for (size_t f = 0; f < fields_.size(); ++f) {
      if (batch_stage_->sees(f) && !tensors[f].is_same(views.fields[f])) {
        meta.transformed[f] = std::move(tensors[f]);
      }
    }
  } catch (...) {  // BatchTransformError, or an allocation that failed around it
    meta.transformed.clear();
    meta.augment_params.reset();
    meta.stage_error = std::current_exception();
  }
  transform_ns_.fetch_add(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
}

// ---------------------------------------------------------------------------------------------
// Consumer: dispatch, collect, cancel

DataLoader::Impl::EpochStart DataLoader::Impl::next_epoch_start() const {
  EpochStart start{next_epoch_ ? *next_epoch_ : started_ ? epoch_ + 1 : epoch_, 0, 0, {}, {}};
  const size_t n = source_->size();
  if (resume_) {
    const Position& r = *resume_;
    const uint64_t target = r.complete ? r.epoch + 1 : r.epoch;
    // A set_epoch() to another epoch after load() wins over the checkpoint.
    if (!next_epoch_ || *next_epoch_ == target) {
      start.epoch = target;
      if (!r.complete && r.world == sampler_->world_size()) {  // continue this rank's own order
        start.base = r.base;
        start.first_batch = r.received;
      } else if (!r.complete) {  // elastic: share out what the saved job had not consumed
        start.base = detail::elastic_base(r, options_.batch_size, n);
      }
    }
  }
  sampler_->remaining_draws(n, start.epoch, start.base, start.order, start.repeats);
  if (!start.repeats.empty() && start.repeats.size() != start.order.size()) {
    throw std::logic_error("conveyor: the sampler gave " + std::to_string(start.repeats.size()) +
                           " repeat numbers for " + std::to_string(start.order.size()) +
                           " indices");
  }
  return start;
}

void DataLoader::Impl::start_epoch() {
  if (joined_) detail::throw_joined();
  // The new order is made and checked before anything changes, so a throwing sampler leaves the
  // current epoch as it was.
  EpochStart start = next_epoch_start();
  const uint64_t epoch = start.epoch;
  std::vector<size_t>& order = start.order;
  for (size_t index : order) {
    if (index >= source_->size()) {
      throw std::out_of_range("conveyor: the sampler yielded index " + std::to_string(index) +
                              " but the dataset has " + std::to_string(source_->size()) +
                              " samples");
    }
  }
  // Continuing its own order from a checkpoint: it must hold the batches received.
  if (start.first_batch > 0) detail::check_received(*resume_, batches_of(order.size()));
  if (started_) cancel_epoch();
  next_epoch_.reset();
  resume_.reset();
  epoch_ = epoch;
  started_ = true;
  order_base_ = start.base;
  order_.swap(order);  // no batch is dispatched now, so no worker reads order_
  order_repeats_.swap(start.repeats);
  num_batches_ = batches_of(order_.size());
  if (start.base == 0) epoch_batches_.emplace(epoch, num_batches_);
  ++runs_;
  generation_.fetch_add(1);
  // A resumed epoch starts at its first batch not yet received: nothing before it is read.
  const size_t first = std::min(start.first_batch, num_batches_);
  dispatched_ = first;
  collected_ = first;
  next_sequence_ = first;
  next_stage_ = first;
  deferred_failure_ = nullptr;
  if (tuner_) tuner_->restart();
  top_up();
  // The fields are learnt while the consumer is still busy: the probe reads the first sample now
  // (one still reading a replaced epoch's sample goes on; any sample tells the fields).
  if (!built() && !probe_.valid() && next_sequence_ < num_batches_) start_probe();
}

void DataLoader::Impl::ensure_started() {
  if (!started_ || resume_) start_epoch();
}

void DataLoader::Impl::dispatch(uint32_t slot) {
  CONVEYOR_DEBUG_CHECK(dispatched_ - wanted() < options_.slots,
                       "at most `slots` batches are dispatched and not yet taken for hand-out");
  const size_t sequence = dispatched_++;
  const size_t first = sequence * options_.batch_size;
  const size_t rows = std::min(order_.size() - first, options_.batch_size);
  const size_t chunks = (rows + options_.chunk_size - 1) / options_.chunk_size;
  detail::SlotMeta& meta = *meta_[slot];
  const uint32_t* repeats = order_repeats_.empty() ? nullptr : &order_repeats_[first];
  if (!gpu_) {
    meta.reset(sequence, generation_.load(), epoch_, rows, chunks, repeats);
    jobs_.push_batch(slot, chunks);  // after the meta: a worker that pops a job sees it
    return;
  }
  // GPU decode: each chunk has a job for each decoder it has rows for.
  const size_t jobs = gpu_->route(meta, &order_[first], rows, epoch_);
  meta.reset(sequence, generation_.load(), epoch_, rows, jobs, repeats);
  jobs_.push_some(slot, chunks, [this](size_t c) { return gpu_->has_cpu_rows(c); });
  gpu_->jobs().push_some(slot, chunks, [this](size_t c) { return gpu_->has_gpu_rows(c); });
}

// Hands every free slot a batch, in order, without blocking (none before build()).
void DataLoader::Impl::top_up() {
  if (!built()) return;
  while (dispatched_ < num_batches_ && dispatched_ - wanted() < depth_) {
    std::optional<uint32_t> slot = shared_->ring.try_acquire();
    if (!slot) return;
    dispatch(*slot);
  }
}

bool DataLoader::Impl::dispatch_until(Clock::time_point deadline) {
  // Wait in short steps so that a copy stage that can no longer hand slots back (a sticky CUDA
  // error, a hand-back that threw) becomes an exception instead of a hang.
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(deadline - std::min(deadline, Clock::now()), Clock::duration::zero()));
    const auto step = std::min<std::chrono::milliseconds>(left, std::chrono::milliseconds(200));
    std::optional<uint32_t> slot;
    {
      const trace::Range waiting(trace::Name::kWaitForSlot, dispatched_);
      slot = shared_->ring.try_acquire_for(step);
    }
    if (slot) {
      dispatch(*slot);
      return true;
    }
    if (shared_->ring.closed()) detail::throw_joined();
    if (stager_) stager_->engine().check();
    if (Clock::now() >= deadline) {
      awaited_ = Awaited::kSlot;
      return false;
    }
  }
}

void DataLoader::Impl::cancel_epoch() {
  generation_.fetch_add(1);  // workers abandon their batch at the next sample
  if (held_back_) shared_->ring.release(*std::exchange(held_back_, std::nullopt));
  // Take back the jobs no worker started, then wait for the batches still being filled. A batch
  // whose last chunk is taken back here is collected here; otherwise the worker filling its last
  // chunk pushes it to completed_.
  for (const Decoder decoder : {Decoder::kCpu, Decoder::kGpu}) {
    detail::JobQueue* queue = decoder == Decoder::kCpu ? &jobs_ : gpu_ ? &gpu_->jobs() : nullptr;
    while (queue != nullptr) {
      const std::optional<detail::Job> job = queue->try_take_back();
      if (!job) break;
      if (gpu_) gpu_->taken_back(*job, *meta_[job->slot], decoder);
      if (detail::BatchFiller::abandon(*meta_[job->slot])) {
        ++collected_;
        shared_->ring.release(job->slot);
      }
    }
  }
  while (collected_ < dispatched_) {
    const uint32_t slot = completed_.pop();
    ++collected_;
    shared_->ring.release(slot);
  }
  reorder_.clear([this](uint32_t slot) { shared_->ring.release(slot); });
  if (stager_) stager_->clear();  // their slots come back through the copy callbacks
  waiting_since_.reset();
}

size_t DataLoader::Impl::wanted() const { return stager_ ? next_stage_ : next_sequence_; }

std::optional<uint32_t> DataLoader::Impl::take_next(Clock::time_point deadline) {
  if (held_back_) return std::exchange(held_back_, std::nullopt);
  for (;;) {
    if (options_.enforce_ordering) {
      if (std::optional<uint32_t> slot = reorder_.take(wanted())) return slot;
    }
    top_up();
    // Nothing that could deliver the wanted batch is in flight: dispatch it.
    const bool in_flight =
        options_.enforce_ordering ? wanted() < dispatched_ : collected_ < dispatched_;
    if (!in_flight) {
      if (!dispatch_until(deadline)) return std::nullopt;
      continue;
    }
    std::optional<uint32_t> popped = completed_.try_pop();
    if (!popped) {
      const auto now = Clock::now();
      if (now >= deadline) {
        awaited_ = Awaited::kBatch;
        return std::nullopt;
      }
      const auto t_wait = now;
      const trace::Range waiting(trace::Name::kWaitForBatch, wanted());
      if (deadline == Clock::time_point::max()) {
        popped = completed_.pop();
      } else {
        popped = completed_.pop_for(std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
      }
      wait_seconds_ += detail::seconds_since(t_wait);
      if (!popped) {
        awaited_ = Awaited::kBatch;
        return std::nullopt;
      }
    }
    ++collected_;
    if (!options_.enforce_ordering) return popped;
    reorder_.put(meta_[*popped]->sequence, *popped);
  }
}

void DataLoader::Impl::tune() {
  if (!tuner_) return;
  const size_t active = tuner_->observe(
      {detail::seconds_since(created_), wait_seconds_,
       filler_->fill_seconds() + static_cast<double>(transform_ns_.load()) * 1e-9, samples_});
  if (active != gate_.active()) {
    gate_.set_active(active);
    depth_ = tuner_->depth();
  }
}

}  // namespace conveyor
