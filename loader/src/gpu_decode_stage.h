// loader/src/gpu_decode_stage.h (detail): GPU decode in the engine (LoaderOptions::gpu_decode).
//
// What it is for: a second decoder beside the workers. When the consumer dispatches a batch it
// routes each row (route()): kShare by fixed_share_decoder() of the row's sample, kAuto a whole
// chunk at a time by the DecodeBalancer. A chunk with rows for the CPU gets a worker's job (the
// engine's JobQueue), a chunk with rows for the GPU a job in this stage's queue, and
// SlotMeta::remaining counts both. Each of the stage's decode threads waits for a GPU job, takes
// whatever other GPU jobs are queued (up to gpu_decode.max_batch images), reads their samples
// (SampleSource::read_encoded, as worker number workers + its own number: the source is prepared
// for that many more workers), decodes them in one batched call of its own DeviceImageDecoder,
// each image into its slot's device rows, and decodes on the CPU (BatchFiller::write_with_policy:
// the workers' ErrorPolicy, substitutes and messages) whatever the device decoder refused or could
// not read, and every image of a call that failed as a whole (a CUDA or nvJPEG error). When the
// consumer stages a batch's copy, device_rows() names the runs of rows already on the device,
// which the copy engine copies instead of those host rows.
//
// The field it writes is the one the source names through its capability
// (SampleSource::encoded_image_field), whose bytes it reads with read_encoded(); a source without
// one, or whose field does not fit its transform, gets no stage (make() says why).
//
// A decode call that fails with a sticky CUDA error (GpuDecodeError::context_lost) leaves the
// device unusable: check() raises it from then on, and explain() turns the copy stage's own
// failure that follows (the copy stream fails with the same error) into that error, so the user
// learns that GPU decode lost the device, not only that the copy stream failed.
//
// Invariants:
//   * The device rows of slot s ([s * batch_size, (s + 1) * batch_size) of one tensor on the copy
//     stage's device, allocated once) are written only by a decode thread, for a GPU job of s, and
//     read only by the copy of s's batch. A slot is dispatched again only once its copy has handed
//     it back, so the two never overlap, and a decode is complete (the decoder returns once its
//     rows are written) before its jobs end.
//   * The GPU job of chunk c writes device rows from the chunk's first row on: its j-th image (in
//     row order) at first + j, never past the chunk's last row; SlotMeta::device_row says which,
//     for each of its rows, and is nullopt for a row it left to the CPU.
//   * Every GPU job ends through BatchFiller::finish_job exactly once: decoded (on the device, or
//     on the CPU when the device refused, could not read or failed the whole call), cancelled, or
//     failed (a file that fails on the CPU too, under the policy; an error outside the decode,
//     which fails its batch at the job's first image). Under kAuto each is reported to the
//     balancer once, as finished (decoded whole) or abandoned; a job taken back unstarted is
//     reported by taken_back().
//   * stop() joins the decode threads before the engine's filler, metas, ring and source go; the
//     stage (and its device rows) is destroyed after the copy stage, whose destruction waits for
//     every copy that reads them.
// Thread safety: route(), jobs(), taken_back(), device_rows(), check(), explain() and stop() on
// the consumer thread; the decode threads run the jobs; add_cpu_idle() on the workers; stats()
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
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
    SampleSource& source;  // prepared for workers + threads
    BatchFiller& filler;
    std::vector<std::unique_ptr<SlotMeta>>& meta;
    IndexQueue& completed;  // where the job that ends a batch pushes its slot
    const ResolvedOptions& options;
    const std::vector<size_t>& order;
  };

  // Whether GPU decode runs for a loader: the stage, or nullptr and why not (status), from the
  // options, the source's capability and the copy stage's device (none: the CPU path). A source
  // without a fitting encoded image field, a decoder or device rows that cannot be made are a
  // reason to decode on the CPU (and say so), not an error.
  struct Plan {
    std::unique_ptr<GpuDecodeStage> stage;
    std::string status = "off";  // stats().gpu_decode.status
  };
  static Plan make(const Parts& parts, const std::optional<c10::Device>& device);

  // One decoder per decode thread (gpu_decode.threads), each decoding field `image_field` (the
  // source's encoded image field, checked by make()) into memory of `device`. Throws
  // std::invalid_argument for a field the source does not have.
  GpuDecodeStage(const Parts& parts, size_t image_field,
                 std::vector<std::unique_ptr<DeviceImageDecoder>> decoders, c10::Device device,
                 std::string status);
  ~GpuDecodeStage();  // stop()
  GpuDecodeStage(const GpuDecodeStage&) = delete;
  GpuDecodeStage& operator=(const GpuDecodeStage&) = delete;

  // The consumer routes the batch about to be dispatched into `meta` (rows `rows`, samples
  // `indices[0 .. rows)` of `epoch`): writes meta.route and meta.hybrid, and returns the number of
  // jobs (at most 2 per chunk). Then has_cpu_rows()/has_gpu_rows() say which jobs each chunk has.
  size_t route(SlotMeta& meta, const size_t* indices, size_t rows, uint64_t epoch);
  bool has_cpu_rows(size_t chunk) const { return (chunk_decoders_[chunk] & kCpuBit) != 0; }
  bool has_gpu_rows(size_t chunk) const { return (chunk_decoders_[chunk] & kGpuBit) != 0; }
  // The GPU jobs' queue: the consumer pushes and takes back, the decode threads wait.
  JobQueue& jobs() { return jobs_; }
  // The consumer took back `job` of `meta`'s batch, unstarted, from the queue of `decoder`
  // (cancelling an epoch): the balancer no longer counts it as queued.
  void taken_back(const Job& job, const SlotMeta& meta, Decoder decoder);
  // The rows of `slot`'s batch (described by `meta`) whose images are on the device, as runs for
  // CopyEngine::start.
  std::vector<DeviceRows> device_rows(uint32_t slot, const SlotMeta& meta) const;
  // Stops the decode threads (the queue closed; calls under way finish first). Idempotent.
  void stop();
  // Throws the GpuDecodeError of a decode call that lost the device (a sticky CUDA error), once
  // one has; nothing otherwise.
  void check() const;
  // The error to raise for `failure` (the copy stage's, say): GPU decode's loss of the device,
  // naming `failure` too, when a decode call lost it (waiting, a few seconds at most, for the calls
  // under way to end: one may be failing with the same error); otherwise `failure` itself.
  std::exception_ptr explain(std::exception_ptr failure) const;

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

  // A decode thread: its decoder, and its scratch, reserved once (nothing allocated per call but
  // the first image's name, for errors).
  struct DecodeThread {
    size_t worker = 0;  // its worker number for the source
    std::unique_ptr<DeviceImageDecoder> decoder;
    // The jobs of one call, and for each its rows, images and state.
    struct Taken {
      Job job;
      size_t first = 0, last = 0;  // the chunk's rows
      size_t gpu_rows = 0;         // of those, routed to the GPU
      bool live = true;            // neither cancelled nor failed so far
    };
    std::vector<Taken> taken;
    std::vector<GpuJpeg> images;                 // read, for the decoder
    std::vector<uint8_t*> destinations;          // each image's device row
    std::vector<std::pair<size_t, size_t>> of;   // each image's (taken, row)
    std::vector<uint8_t> refused;                // per image: left to the CPU
    std::vector<std::pair<size_t, size_t>> cpu;  // (taken, row) to decode on the CPU
    std::vector<size_t> hint;                    // one job's samples, for will_write
    std::vector<std::vector<uint8_t>> buffers;   // one per image: its encoded bytes
    std::jthread thread;                         // last: started once the above exist
  };

  void run(DecodeThread& t);
  // Takes `first` and whatever else is queued, up to max_batch images, into t.taken.
  void take_jobs(DecodeThread& t, const Job& first);
  // Decodes t.taken (never throws: a failure is recorded in the jobs' batches), then ends each
  // job; returns nothing, pushing the slots of the batches it ended to the completed queue.
  void run_jobs(DecodeThread& t) noexcept;
  // The parts of run_jobs: read every job's GPU rows; decode them in one call; the rest on the
  // CPU. Each marks the jobs that stop short as not live.
  void read_images(DecodeThread& t);
  void decode_images(DecodeThread& t);
  void decode_on_cpu(DecodeThread& t);
  // Records `error` as the failure of every live job of t that holds an image, and stops them.
  void fail_jobs(DecodeThread& t, std::exception_ptr error);
  // A decode call ended, with `failure` (null: it returned): a sticky one is kept for check().
  void end_call(std::exception_ptr failure) noexcept;
  uint8_t* device_row_pointer(uint32_t slot, size_t row) const;
  size_t chunk_rows(const Job& job, const SlotMeta& meta) const;

  SampleSource& source_;
  BatchFiller& filler_;
  std::vector<std::unique_ptr<SlotMeta>>& meta_;
  IndexQueue& completed_;
  const ResolvedOptions& options_;
  const std::vector<size_t>& order_;
  const size_t image_field_;  // the source's encoded image field
  const std::string status_;
  at::Tensor device_rows_;  // [slots * batch_size, ...image shape] on the copy stage's device
  size_t row_bytes_ = 0;
  std::optional<DecodeBalancer> balancer_;  // kAuto
  JobQueue jobs_;
  std::vector<uint8_t> chunk_decoders_;  // consumer: route()'s kCpuBit | kGpuBit per chunk

  std::atomic<uint64_t> gpu_images_{0}, refused_count_{0}, cpu_images_{0}, failed_batches_{0};
  std::atomic<uint64_t> busy_ns_{0}, cpu_idle_ns_{0};
  // Decode calls started and ended, and the error of the first that lost the device.
  mutable std::mutex device_mutex_;
  mutable std::condition_variable device_changed_;
  uint64_t calls_started_ = 0, calls_ended_ = 0;
  std::exception_ptr device_lost_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  std::vector<std::unique_ptr<DecodeThread>> threads_;  // last: their threads use all of the above
};

}  // namespace conveyor::detail
