// loader/src/engine.h (detail): DataLoader::Impl, the engine behind conveyor::DataLoader.
//
// The consumer thread (the one iterating the loader) dispatches batches: it acquires a free slot,
// writes the slot's SlotMeta and queues one job per chunk (JobQueue). Workers fill the chunks
// (BatchFiller); the worker that finishes a batch's last chunk pushes the slot to `completed_`.
// The consumer collects completed slots, puts them in sampler order (Reorderer), and hands them
// out: on the CPU as tensors viewing the slot (HostBatches), or through the copy stage
// (DeviceStager) to a CUDA device. docs/design.md has the picture.
//
// Invariants:
//   * collected_ <= dispatched_ <= num_batches_, and dispatched_ - wanted() <= slots, where
//     wanted() is the next batch to take from the Reorderer (next_sequence_ on the CPU path,
//     next_stage_ on the CUDA path): a batch is dispatched only into a free slot, and a slot is
//     free again only after its batch was taken (handed out, staged for its copy, or cancelled).
//     So the Reorderer never collides. On the CUDA path a slot comes back when its copy has
//     finished, which can be before its batch is handed out, so dispatched_ - next_sequence_ may
//     reach slots + prefetch_factor.
//   * A slot taken for hand-out but not handed out (an allocation failed while its batch was
//     made) is held in held_back_ and taken first next time: no batch is lost or doubled.
//   * order_ and the slots' meta are written only by the consumer, and only while no job of that
//     slot (for order_: of any slot) is queued or running.
//   * generation_ changes whenever an epoch starts or is cancelled; a worker that sees a change
//     abandons its chunk at the next sample. cancel_epoch() returns only once every dispatched
//     batch has been collected back, so no worker touches the old epoch's slots afterwards.
//   * Before build() (a source that learns its fields, until it has: the drop-in's collated path)
//     there is no ring and no worker: nothing is dispatched, so dispatched_ == collected_ ==
//     next_sequence_, and only epochs, their order and positions change. At most one probe runs,
//     and only then; it touches only the source (learn_fields) and what it was given.
// Thread safety: every member function runs on the consumer thread, except worker_loop (workers)
// and stats() (any thread; the consumer-only counters it reads are then approximate).
// Waiting: every wait of the consumer ends by a deadline (the caller's, for poll(), and the
// loader's timeout from the first wait for the batch); a wait for a free slot checks the copy
// stage every 200 ms, so a lost slot or a sticky CUDA error becomes an exception, not a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <torch/serialize/archive.h>

#include "batch_filler.h"
#include "batch_stage.h"
#include "checkpoint.h"
#include "conveyor/loader.h"
#include "device_stager.h"
#include "errors.h"
#include "gpu_decode_stage.h"
#include "host_batch.h"
#include "job_queue.h"
#include "options.h"
#include "reorderer.h"
#include "worker_tuner.h"

namespace conveyor {
namespace detail {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

class DataLoader::Impl {
 public:
  // `options` were resolved by resolve_options() (DataLoader's constructor, or the drop-in). A
  // source that learns_fields() and has no fields yet is read for them when the first epoch
  // starts (field_probe.cpp); until they are known, epochs, their order and checkpoints work,
  // and nothing is dispatched.
  Impl(std::shared_ptr<SampleSource> source, detail::ResolvedOptions options,
       std::unique_ptr<Sampler> sampler, std::unique_ptr<CopyEngine> copy_engine);
  ~Impl();

  // Starts an epoch unless one is under way (nothing started yet, or load() since): what next()
  // and poll() do first.
  void ensure_started();
  void start_epoch();
  std::optional<Batch> next();
  DataLoader::Poll poll(std::chrono::milliseconds wait);
  void set_epoch(uint64_t epoch) { next_epoch_ = epoch; }
  LoaderState state() const;  // checkpoint.cpp
  void load_state(const LoaderState& state);
  void join();

  uint64_t epoch() const { return epoch_; }
  // Epoch starts and load() calls so far: an iterator is current while this is unchanged.
  uint64_t runs() const { return runs_; }
  size_t batches_per_epoch() const;
  size_t workers() const { return workers_.size(); }
  const LoaderOptions& options() const { return options_; }
  size_t pinned_bytes() const { return shared_ ? shared_->ring.bytes() : 0; }
  bool is_pinned() const { return shared_ && shared_->ring.is_pinned(); }
  const std::string& mode() const { return mode_; }
  LoaderStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  // What a wait that ended without a batch was waiting for (the TimeoutError says which).
  enum class Awaited { kBatch, kSlot };

  // Reads the source's fields and builds the ring, the copy stage and the workers (once).
  void build();
  bool built() const { return filler_ != nullptr; }

  // --- Before build(), for a source that learns_fields() (field_probe.cpp).
  // What the probe read: the fields (empty when every sample it tried failed), the sample that
  // told them or the first that failed, that sample's batch and epoch, and the runs() it began in.
  struct ProbeOutcome {
    std::vector<FieldSpec> fields;
    size_t index = 0;
    size_t batch = 0;
    uint64_t epoch = 0;
    uint64_t run = 0;
    std::exception_ptr error;  // the first failure
  };
  // Starts the probe on the first sample of the batch the consumer waits for (with kSkip, the
  // following ones of the order too, as many as substitutes may be).
  void start_probe();
  // Waits for the probe (starting one when none runs) until `deadline`, and at most the loader's
  // timeout from the first wait for the batch (across polls), then builds the engine: true once
  // built; false when `deadline` passed first or the epoch has no batch left. The failure of the
  // sample it read throws SampleError, and that batch is passed over; a probe that outlasts the
  // timeout throws TimeoutError naming its sample.
  bool learn_fields(Clock::time_point deadline);
  // The batch the consumer waits for failed outside the engine and was reported; the epoch goes
  // on with the batch after it (save() counts it as received, as a batch whose worker failed).
  void pass_over(size_t sequence);

  void worker_loop(size_t worker);
  // The batch stage on the CPU path: runs the pipeline on the ready batch in `slot` (the calling
  // worker finished it and owns it), keeping its result or failure in `meta`. Never throws.
  void transform_on_worker(uint32_t slot, detail::SlotMeta& meta) noexcept;
  // Under kAutoWorkers, after each batch handed out: the tuner's choice of active workers and
  // dispatch depth applied.
  void tune();
  void dispatch(uint32_t slot);
  void top_up();
  // Waits until `deadline` at most for a free slot and dispatches the next batch into it.
  bool dispatch_until(Clock::time_point deadline);
  size_t wanted() const;
  // Batches in an epoch of `samples` samples (drop_last or not): the one place for the count.
  size_t batches_of(size_t samples) const;
  // The slot of the next batch to hand out (ordered: the wanted sequence; unordered: whichever
  // completes), dispatching as needed; nullopt when none is ready by `deadline` (min(): now).
  std::optional<uint32_t> take_next(Clock::time_point deadline);
  void cancel_epoch();
  // Stages copies until the stager is full or the epoch is staged, waiting until `deadline` at
  // most for the first one while the stager is empty.
  void stage_copies(Clock::time_point deadline);
  // One batch, or the end, or nothing by `deadline` (next() passes time_point::max()).
  DataLoader::Poll poll_until(Clock::time_point deadline);
  [[noreturn]] void throw_timeout() const;
  [[noreturn]] void raise_failure(const detail::SlotMeta& meta) const;
  // The failure of `slot`'s batch as an exception, and the slot released.
  std::exception_ptr take_failure(uint32_t slot);
  detail::BatchHeader header(uint32_t slot) const;

  // Where an epoch's batches come from, and how far the consumer got: what a checkpoint holds.
  using Position = detail::CheckpointPosition;
  Position position() const;
  // The next start_epoch() continues at `position` (what load() read): the iterators of the epoch
  // in progress are replaced.
  void resume(const Position& position);
  detail::OrderShape order_shape() const;
  // The order the next epoch starts with, its epoch, base and first batch; applies and clears a
  // pending resume_. Throws (changing nothing) if the sampler does.
  struct EpochStart {
    uint64_t epoch;
    size_t base;
    size_t first_batch;
    std::vector<size_t> order;
    std::vector<uint32_t> repeats;  // order's repeat numbers; empty: all 0
  };
  EpochStart next_epoch_start() const;

  std::shared_ptr<SampleSource> source_;
  std::unique_ptr<CopyEngine> copy_engine_;  // given to the copy stage by build()
  std::vector<FieldSpec> fields_;
  detail::ResolvedOptions options_;
  std::string mode_;  // mode(), fixed by build()
  std::unique_ptr<Sampler> sampler_;
  std::shared_ptr<detail::SharedRing> shared_;  // outlives the loader while batches view it
  // GPU decode (null unless it runs; its thread stopped by join()): destroyed after the stager,
  // whose copies read its device rows.
  std::unique_ptr<detail::GpuDecodeStage> gpu_;
  std::string gpu_status_ = "off";  // stats().gpu_decode.status without gpu_
  // LoaderOptions::batch_transform, checked against the fields (null without one); built by
  // build() before the stager and the workers that run it.
  std::shared_ptr<const detail::BatchStage> batch_stage_;
  std::unique_ptr<detail::DeviceStager> stager_;  // null on the CPU path; before shared_ dies
  std::optional<detail::HostBatches> host_;       // the CPU path
  std::vector<std::unique_ptr<detail::SlotMeta>> meta_;
  std::atomic<uint64_t> transform_ns_{0};  // the workers' time in the batch stage (CPU path)

  // Stage to stage.
  detail::JobQueue jobs_;
  detail::IndexQueue completed_;         // slots whose batch's last chunk is done
  std::atomic<uint64_t> generation_{0};  // changes when an epoch starts or is cancelled
  std::vector<size_t> order_;            // the epoch's sampler order
  std::vector<uint32_t> order_repeats_;  // its entries' repeat numbers; empty: all 0
  std::unique_ptr<detail::BatchFiller> filler_;
  detail::WorkerGate gate_;  // parks the workers above the active count (kAutoWorkers)

  // Consumer-only state.
  uint64_t epoch_ = 0;
  uint64_t runs_ = 0;  // runs()
  bool started_ = false;
  size_t num_batches_ = 0;
  // batches_per_epoch() of one epoch, counted once: (epoch, batches of its whole order).
  mutable std::optional<std::pair<uint64_t, size_t>> epoch_batches_;
  size_t dispatched_ = 0;     // batches handed to workers this epoch
  size_t collected_ = 0;      // of those, taken back (completed_ or cancelled) by the consumer
  size_t next_sequence_ = 0;  // next batch to hand out (ordered) / count handed out (unordered)
  size_t next_stage_ = 0;     // next batch to stage on the device
  detail::Reorderer reorder_;
  bool joined_ = false;
  std::exception_ptr deferred_failure_;  // a prefetch failure, reported by the next next()
  std::optional<uint64_t> next_epoch_;   // set by set_epoch()
  std::optional<Position> resume_;       // set by load(), applied by the next start_epoch()
  size_t order_base_ = 0;                // the current order's Position::base
  std::optional<uint32_t> held_back_;    // a slot taken but not handed out (see the invariants)
  std::optional<Clock::time_point> waiting_since_;  // the first wait for the wanted batch
  Awaited awaited_ = Awaited::kBatch;
  std::optional<detail::WorkerTuner> tuner_;  // kAutoWorkers only
  size_t depth_ = 0;  // batches dispatched and not yet taken, at most (the slots, unless tuned)
  Clock::time_point created_ = Clock::now();

  // Statistics (consumer-only).
  uint64_t batches_ = 0, samples_ = 0;
  double wait_seconds_ = 0, copy_issue_seconds_ = 0;

  ProbeOutcome probing_;             // what the probe in flight reads (its timeout names it)
  std::future<ProbeOutcome> probe_;  // before build() only; its destructor waits for it

  std::vector<std::jthread> workers_;  // last: joined first on destruction (join() stops them)
};

}  // namespace conveyor
