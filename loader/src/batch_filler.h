// loader/src/batch_filler.h (detail): the worker side of the engine: writing samples into a slot.
//
// SlotMeta: what one batch slot is carrying: written by the consumer before it queues the batch's
// jobs (sequence, generation, epoch, the number of rows, `remaining`, and with GPU decode each
// row's decoder), then by the threads that fill its chunks (their own rows of `indices` and
// `device_row`, and the failure fields).
// BatchFiller: fills one chunk (a run of rows) of a slot's batch, under the ErrorPolicy: the rows
// routed to the CPU; the GPU decode thread (gpu_decode_stage.h) fills the others with
// write_with_policy() and finish_chunk(), so the policy and the end of a batch are written once.
//
// Invariants:
//   * A job writes only its rows: those of its chunk routed to its decoder (every row of the
//     chunk without GPU decode). A chunk has one job per decoder it has rows for, and `remaining`
//     counts jobs. The consumer does not touch a slot's meta or rows between queuing its jobs and
//     getting the slot back (from the completed queue, or by taking back its last unstarted job
//     when cancelling). `route` is not changed while jobs run.
//   * `remaining` counts unfinished jobs; the thread whose fetch_sub (acq_rel) takes it to zero
//     has seen every other chunk's writes, and owns the slot from then on: it marks the slot kReady
//     (a whole, unfailed, uncancelled batch) and hands it back to the consumer.
//   * The batch's error is the one of its lowest failing row (failed_row), whichever chunk failed
//     first, so a batch fails the same way with any number of workers and chunks. Rows after a
//     known failure are not written; rows before it still are, as one of them may fail first.
//   * A chunk stops at the next sample once the loader's generation differs from the batch's (an
//     epoch cancelled or the loader joined), and marks the batch cancelled.
// Thread safety: fill() runs on many workers at once, each on different chunks; errors(),
// fill_seconds() and skipped() may be read from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "conveyor/datasets.h"
#include "conveyor/decode_balance.h"
#include "conveyor/loader.h"
#include "conveyor/pinned.h"
#include "errors.h"
#include "options.h"

namespace conveyor::detail {

struct SlotMeta {
  static constexpr size_t kNoFailure = SIZE_MAX;

  size_t sequence = 0;
  uint64_t generation = 0;
  uint64_t epoch = 0;
  std::vector<size_t> indices;  // one per row; reserved to batch_size once: never reallocates
  // Each row's repeat number (Sampler::remaining_draws), consumer-written at dispatch; reserved
  // to batch_size once like `indices`. `repeated` is false when every row is repeat 0.
  std::vector<uint32_t> repeats;
  bool repeated = false;
  std::atomic<size_t> remaining{0};  // jobs not finished
  // GPU decode: whether the rows were routed (false: every row is the CPU's, `route` unused), each
  // row's decoder (consumer-written), and for a row routed to the GPU the row of the slot's device
  // rows that holds its image, or nullopt when it was decoded on the CPU after all (refused,
  // unreadable there, a substitute) into its host row (written by the decode thread). Both are
  // reserved to batch_size once (GpuDecodeStage), like `indices`.
  bool hybrid = false;
  std::vector<Decoder> route;
  std::vector<std::optional<uint32_t>> device_row;
  std::atomic<bool> cancelled{false};
  std::atomic<size_t> failed_row{kNoFailure};  // the lowest failing row
  std::mutex error_mutex;                      // taken only when a sample fails for good
  std::exception_ptr error;
  size_t error_index = 0;
  std::string error_path;
  std::string error_message;
  // The batch stage on the CPU path (batch_stage.h), written by the worker that finished the
  // batch: the tensors that replace the slot's views (undefined for a field the ops left in
  // place), or the stage's failure.
  std::vector<at::Tensor> transformed;
  std::exception_ptr stage_error;
  std::shared_ptr<const AugmentRecord> augment_params;  // the stage's record, when recording

  bool failed() const { return failed_row.load() != kNoFailure; }
  // Prepares the meta for a new batch of `rows` rows in `jobs` jobs (consumer, before queuing;
  // with GPU decode, after writing `route`). `repeats`: the rows' repeat numbers, or null when
  // every row is repeat 0.
  void reset(size_t sequence, uint64_t generation, uint64_t epoch, size_t rows, size_t jobs,
             const uint32_t* repeats);
};

// The samples skipped under ErrorPolicy::kSkip: a count and the first kMaxRecords records.
class SkipLog {
 public:
  static constexpr size_t kMaxRecords = 1000;
  void add(SkippedSample record);
  uint64_t count() const;
  std::vector<SkippedSample> records() const;

 private:
  mutable std::mutex mutex_;
  uint64_t count_ = 0;
  std::vector<SkippedSample> records_;
};

class BatchFiller {
 public:
  static constexpr size_t kMaxFields = 16;  // fields per sample

  // `order`: the epoch's sampler order, batch s holding order[s * batch_size, ...); `generation`:
  // the loader's current generation. Both are owned by the engine and outlive the filler; order is
  // rewritten only while no batch is dispatched.
  BatchFiller(SampleSource& source, SlotRing& ring, const ResolvedOptions& options,
              const std::vector<size_t>& order, const std::atomic<uint64_t>& generation);

  // Writes the CPU's rows of chunk `chunk` of the batch in `slot` (described by `meta`): every
  // row, unless the batch is hybrid. Returns true when this was the batch's last unfinished job:
  // the caller then owns the slot and hands it to the consumer (the slot is kReady if the batch
  // can be delivered, still kFilling if it failed or was cancelled).
  bool fill(size_t worker, uint32_t slot, size_t chunk, SlotMeta& meta);
  // Counts one finished job that was never run (taken back when cancelling). Returns true when it
  // was the batch's last: the caller owns the slot.
  static bool abandon(SlotMeta& meta);
  // Ends one job of `slot`'s batch (fill()'s end, and the decode thread's): returns true when it
  // was the batch's last, and then marks the slot kReady if the batch is whole, not failed and not
  // cancelled.
  bool finish_job(uint32_t slot, SlotMeta& meta);

  // Row `row` of the batch: sample `index` written into `rows` (one pointer per field), under the
  // ErrorPolicy (substitutes, the skip log, the lowest failing row). False when the row failed
  // for good (recorded in `meta`). For the decode thread too.
  bool write_with_policy(size_t worker, size_t row, size_t index, std::byte* const* rows,
                         SlotMeta& meta);
  // Records `error` as row `row`'s (sample `index`) failure unless a lower row failed already.
  void record_failure(SlotMeta& meta, size_t row, size_t index, std::exception_ptr error);
  // Points `rows` at row `row` of each field of `slot`.
  void row_pointers(uint32_t slot, size_t row, std::byte** rows) const;
  // True when the batch's epoch was cancelled (or the loader joined) since it was dispatched.
  bool outdated(const SlotMeta& meta) const {
    return generation_.load(std::memory_order_relaxed) != meta.generation;
  }
  // GPU decode, kAuto: the CPU's chunks are reported to `balancer` (set before any worker runs).
  void report_to(DecodeBalancer* balancer) { balancer_ = balancer; }

  uint64_t errors() const { return errors_.load(); }
  double fill_seconds() const { return static_cast<double>(fill_ns_.load()) * 1e-9; }
  // Rows of hybrid batches the workers wrote (GPU decode's CPU share, without the decode
  // thread's own CPU decodes).
  uint64_t hybrid_cpu_rows() const { return hybrid_cpu_rows_.load(std::memory_order_relaxed); }
  const SkipLog& skipped() const { return skipped_; }
  // The source's name for a sample (its file, for images); never throws.
  std::string describe(size_t index) const;

 private:
  SampleSource& source_;
  SlotRing& ring_;
  const ResolvedOptions& options_;
  const std::vector<size_t>& order_;
  const std::atomic<uint64_t>& generation_;
  std::vector<size_t> field_bytes_;  // bytes of one sample of each field
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> fill_ns_{0};
  std::atomic<uint64_t> hybrid_cpu_rows_{0};
  DecodeBalancer* balancer_ = nullptr;
  SkipLog skipped_;
};

}  // namespace conveyor::detail
