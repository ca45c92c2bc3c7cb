// loader/src/gpu_decode_stage.h (detail): GPU decode in the engine (LoaderOptions::gpu_decode).
//
// What it is for: a second decoder beside the workers. When the consumer dispatches a batch it
// routes each row (route()): kShare by fixed_share_decoder() of the row's sample, kAuto a whole
// chunk at a time by the DecodeBalancer. A chunk with rows for the CPU gets a worker's job (the
// engine's JobQueue), a chunk with rows for the GPU a job in this stage's queue, and
// SlotMeta::remaining counts both. The stage's decode thread takes a GPU job, reads its samples
// (ImageSource::read_encoded, as worker number `workers`: the source is prepared for one more
// worker), decodes them in one batched call of its DeviceImageDecoder into the slot's device
// rows, and decodes on the CPU (BatchFiller::write_with_policy: the workers' ErrorPolicy,
// substitutes and messages) whatever the device decoder refused or could not read. When the
// consumer stages the batch's copy, device_rows() names the runs of rows already on the device,
// which the copy engine copies over the host rows.
//
// Invariants:
//   * The device rows of slot s ([s * batch_size, (s + 1) * batch_size) of one tensor on the copy
//     stage's device, allocated once) are written only by the decode thread, for a GPU job of s,
//     and read only by the copy of s's batch. A slot is dispatched again only once its copy has
//     handed it back, so the two never overlap, and the decode is complete (the decoder returns
//     once its rows are written) before the job ends.
//   * The GPU job of chunk c writes device rows from the chunk's first row on: its j-th decoded
//     image (in row order) at first + j, never past the chunk's last row; SlotMeta::device_row
//     says which, for each of its rows, and is nullopt for a row it left to the CPU.
//   * Every GPU job ends through BatchFiller::finish_job exactly once: decoded, cancelled,
//     failed, or when the device decode threw (the batch then fails, named by its first row).
//   * stop() joins the decode thread before the engine's filler, metas, ring and source go; the
//     stage (and its device rows) is destroyed after the copy stage, whose destruction waits for
//     every copy that reads them.
// Thread safety: route(), jobs(), device_rows() and stop() on the consumer thread; the decode
// thread runs the jobs; add_cpu_idle() on the workers; stats() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

#include "batch_filler.h"
#include "conveyor/datasets.h"
#include "conveyor/decode_balance.h"
#include "conveyor/gpu_decode.h"
#include "conveyor/internal/index_queue.h"
#include "conveyor/loader.h"
#include "conveyor/prefetch.h"
#include "job_queue.h"
#include "options.h"

namespace conveyor::detail {

class GpuDecodeStage {
 public:
  // What the stage works with, owned by the engine and outliving the stage.
  struct Parts {
    SampleSource& source;  // an ImageSource (make() checks), prepared for workers + 1
    BatchFiller& filler;
    std::vector<std::unique_ptr<SlotMeta>>& meta;
    IndexQueue& completed;  // where the job that ends a batch pushes its slot
    const ResolvedOptions& options;
    const std::vector<size_t>& order;
  };

  // Whether GPU decode runs for a loader: the stage, or nullptr and why not (status), from the
  // options, the source and the copy stage's device (none: the CPU path). A decoder that cannot
  // be made is a reason to decode on the CPU, not an error: make() throws only what allocating
  // the stage throws.
  struct Plan {
    std::unique_ptr<GpuDecodeStage> stage;
    std::string status = "off";  // stats().gpu_decode.status
  };
  static Plan make(const Parts& parts, const std::optional<c10::Device>& device);

  // `decoder` decodes into memory of `device`. Throws std::bad_cast for a source that is not an
  // ImageSource.
  GpuDecodeStage(const Parts& parts, std::unique_ptr<DeviceImageDecoder> decoder,
                 c10::Device device, std::string status);
  ~GpuDecodeStage();  // stop()
  GpuDecodeStage(const GpuDecodeStage&) = delete;
  GpuDecodeStage& operator=(const GpuDecodeStage&) = delete;

  // The consumer routes the batch about to be dispatched into `meta` (rows `rows`, samples
  // `indices[0 .. rows)` of `epoch`): writes meta.route and meta.hybrid, and returns the number of
  // jobs (at most 2 per chunk). Then has_cpu_rows()/has_gpu_rows() say which jobs each chunk has.
  size_t route(SlotMeta& meta, const size_t* indices, size_t rows, uint64_t epoch);
  bool has_cpu_rows(size_t chunk) const { return (chunk_decoders_[chunk] & kCpuBit) != 0; }
  bool has_gpu_rows(size_t chunk) const { return (chunk_decoders_[chunk] & kGpuBit) != 0; }
  // The GPU jobs' queue: the consumer pushes and takes back, the decode thread waits.
  JobQueue& jobs() { return jobs_; }
  // The rows of `slot`'s batch (described by `meta`) whose images are on the device, as runs for
  // CopyEngine::start.
  std::vector<DeviceRows> device_rows(uint32_t slot, const SlotMeta& meta) const;
  // Stops the decode thread (its queue closed; a job under way finishes first). Idempotent.
  void stop();

  // A worker waited `idle` for a job (GpuDecodeStats::cpu_idle_seconds).
  void add_cpu_idle(std::chrono::nanoseconds idle) {
    cpu_idle_ns_.fetch_add(static_cast<uint64_t>(idle.count()), std::memory_order_relaxed);
  }
  // Everything but the workers' CPU rows, which the filler counts.
  GpuDecodeStats stats() const;
  // kAuto's balancer (the filler reports the CPU's chunks to it); null otherwise.
  DecodeBalancer* balancer() { return balancer_ ? &*balancer_ : nullptr; }

 private:
  static constexpr uint8_t kCpuBit = 1, kGpuBit = 2;

  void run();
  // One GPU job; true when it was its batch's last.
  bool run_job(const Job& job) noexcept;
  // The job's rows routed to the GPU, decoded (the rest of run_job, which ends the job).
  void decode_rows(uint32_t slot, SlotMeta& meta, size_t first, size_t last);
  uint8_t* device_row_pointer(uint32_t slot, size_t row) const;

  ImageSource& source_;
  BatchFiller& filler_;
  std::vector<std::unique_ptr<SlotMeta>>& meta_;
  IndexQueue& completed_;
  const ResolvedOptions& options_;
  const std::vector<size_t>& order_;
  const size_t image_field_;  // the source's "image" field
  const size_t worker_;       // the decode thread's worker number for the source
  const std::string status_;
  std::unique_ptr<DeviceImageDecoder> decoder_;
  at::Tensor device_rows_;  // [slots * batch_size, ...image shape] on the copy stage's device
  size_t row_bytes_ = 0;
  std::optional<DecodeBalancer> balancer_;  // kAuto
  JobQueue jobs_;
  std::vector<uint8_t> chunk_decoders_;  // consumer: route()'s kCpuBit | kGpuBit per chunk

  // The decode thread's own, reserved once (chunk_size entries): nothing allocated per job.
  std::vector<size_t> rows_;                   // the job's rows routed to the GPU
  std::vector<size_t> hint_;                   // their samples, for will_write
  std::vector<GpuJpeg> images_;                // read, for the decoder
  std::vector<size_t> image_rows_;             // the row of each image
  std::vector<uint8_t> refused_;               // per image: left to the CPU
  std::vector<size_t> on_cpu_;                 // rows to decode on the CPU
  std::vector<std::vector<uint8_t>> buffers_;  // one per image: its encoded bytes

  std::atomic<uint64_t> gpu_images_{0}, refused_count_{0}, cpu_images_{0}, failed_batches_{0};
  std::atomic<uint64_t> busy_ns_{0}, cpu_idle_ns_{0};
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  std::jthread thread_;  // last: started once everything above exists
};

}  // namespace conveyor::detail
