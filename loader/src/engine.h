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
//   * collected_ <= dispatched_ <= num_batches_, and dispatched_ - next_sequence_ <= slots: a batch
//     is dispatched only into a free slot, and a slot is free again only after its batch was
//     handed out (or cancelled). So the Reorderer never collides.
//   * order_ and the slots' meta are written only by the consumer, and only while no job of that
//     slot (for order_: of any slot) is queued or running.
//   * generation_ changes whenever an epoch starts or is cancelled; a worker that sees a change
//     abandons its chunk at the next sample. cancel_epoch() returns only once every dispatched
//     batch has been collected back, so no worker touches the old epoch's slots afterwards.
// Thread safety: every member function runs on the consumer thread, except worker_loop (workers)
// and stats() (any thread; the consumer-only counters it reads are then approximate).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/serialize/archive.h>

#include "batch_filler.h"
#include "checkpoint.h"
#include "conveyor/loader.h"
#include "device_stager.h"
#include "errors.h"
#include "host_batch.h"
#include "index_queue.h"
#include "options.h"
#include "reorderer.h"

namespace conveyor {

class DataLoader::Impl {
 public:
  Impl(std::shared_ptr<SampleSource> source, const LoaderOptions& options,
       std::unique_ptr<Sampler> sampler, std::unique_ptr<CopyEngine> copy_engine);
  ~Impl();

  void start_epoch();
  std::optional<Batch> next();
  void set_epoch(uint64_t epoch) { next_epoch_ = epoch; }
  void save(torch::serialize::OutputArchive& archive) const;  // checkpoint.cpp
  void load(torch::serialize::InputArchive& archive);
  void join();

  uint64_t epoch() const { return epoch_; }
  size_t batches_per_epoch() const;
  size_t workers() const { return workers_.size(); }
  const LoaderOptions& options() const { return options_; }
  size_t pinned_bytes() const { return shared_->ring.bytes(); }
  bool is_pinned() const { return shared_->ring.is_pinned(); }
  std::string mode() const;
  LoaderStats stats() const;

 private:
  void worker_loop(size_t worker);
  void dispatch(uint32_t slot);
  void top_up();
  void dispatch_blocking();
  size_t wanted() const;
  std::optional<uint32_t> take_next(bool blocking);
  void cancel_epoch();
  void stage_copies(bool need_one);
  [[noreturn]] void raise_failure(const detail::SlotMeta& meta) const;
  // The failure of `slot`'s batch as an exception, and the slot released.
  std::exception_ptr take_failure(uint32_t slot);
  detail::BatchHeader header(uint32_t slot) const;

  // Where an epoch's batches come from, and how far the consumer got: what a checkpoint holds.
  using Position = detail::CheckpointPosition;
  Position position() const;
  detail::OrderShape order_shape() const;
  // The order the next epoch starts with, its epoch, base and first batch; applies and clears a
  // pending resume_. Throws (changing nothing) if the sampler does.
  struct EpochStart {
    uint64_t epoch;
    size_t base;
    size_t first_batch;
    std::vector<size_t> order;
  };
  EpochStart next_epoch_start() const;

  std::shared_ptr<SampleSource> source_;
  std::vector<FieldSpec> fields_;
  detail::ResolvedOptions options_;
  std::unique_ptr<Sampler> sampler_;
  std::shared_ptr<detail::SharedRing> shared_;    // outlives the loader while batches view it
  std::unique_ptr<detail::DeviceStager> stager_;  // null on the CPU path; before shared_ dies
  std::optional<detail::HostBatches> host_;       // the CPU path
  std::vector<std::unique_ptr<detail::SlotMeta>> meta_;

  // Stage to stage.
  detail::JobQueue jobs_;
  detail::IndexQueue completed_;         // slots whose batch's last chunk is done
  std::atomic<uint64_t> generation_{0};  // changes when an epoch starts or is cancelled
  std::vector<size_t> order_;            // the epoch's sampler order
  std::unique_ptr<detail::BatchFiller> filler_;

  // Consumer-only state.
  uint64_t epoch_ = 0;
  bool started_ = false;
  size_t num_batches_ = 0;
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

  // Statistics (consumer-only).
  uint64_t batches_ = 0, samples_ = 0;
  double wait_seconds_ = 0, copy_issue_seconds_ = 0;

  std::vector<std::jthread> workers_;  // last: joined first on destruction (join() stops them)
};

}  // namespace conveyor
