// conveyor/decode_balance.h: which decoder, the CPU workers or the GPU's hardware engines, a
// sample or a chunk of samples goes to in the hybrid decoder.
//
// What it is for: the loader's switch between decoders (LoaderOptions::gpu_decode, conveyor/
// loader.h), kept apart from the engine so that it is tested on its own with simulated decoders.
// Three rules:
// - off: every sample on the CPU (the default; the loader then never loads nvJPEG);
// - a fixed share: fixed_share_decoder() sends sample (seed, epoch, index) to the GPU when a hash
//   of those three numbers falls below the share. A pure function: the decoder of a sample, and
//   so its bytes, do not depend on the number of workers, the order of work or timing, and a
//   resumed epoch sends every sample where it went before. share 1 is "on": every file the
//   hardware takes (files it refuses still go to the CPU, in every mode);
// - automatic: DecodeBalancer sends each chunk to the decoder whose queue will drain first, from
//   each decoder's measured cost per image (a moving average) and the images queued on it, after
//   first keeping both busy: a chunk goes to the GPU when nothing is queued there, else to the CPU
//   while fewer chunks than workers are queued there. So the loader's chunks in flight (slots x
//   chunks per batch) must exceed the workers for the GPU to get a share. Which
//   decoder a sample meets then depends on timing: the crop box never changes (choose_crop's), but
//   the pixels may differ between runs by the decoders' rounding (GpuCropDecoder's tolerance).
//   That is what the automatic mode gives up; resume still replays the same samples and boxes.
//
// Requires: DecodeBalancer's calls may come from any thread (one mutex, taken once per chunk).
// Guarantees: assign() never returns the GPU for a balancer made with gpu_available false; every
// chunk assigned is counted in the backlog until finished() or abandoned() reports it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace conveyor {

enum class Decoder { kCpu, kGpu };

// GpuDecode::Mode::kShare's rule for sample `index` of (seed, epoch); share is clamped to [0, 1].
Decoder fixed_share_decoder(double share, uint64_t seed, uint64_t epoch, size_t index);

class DecodeBalancer {
 public:
  // `cpu_workers` threads decode on the CPU, one GPU decoder on the hardware engines. Until a
  // decoder has reported a chunk, its cost per image is the prior: both decoders assumed equally
  // fast (the GPU's cost per image is the CPU's divided by cpu_workers). `gpu_batch`: the images
  // the GPU decodes in one call, which it should always find queued (the loader's decode threads
  // take several chunks per call); 0 or 1: one chunk at a time.
  DecodeBalancer(size_t cpu_workers, bool gpu_available,
                 std::chrono::nanoseconds cpu_prior_per_image = std::chrono::milliseconds(5),
                 size_t gpu_batch = 0);

  // The decoder for a chunk of `images`: the GPU if nothing is queued there (or fewer images than
  // its batch); else the CPU if a worker has no chunk; else the one that, with the images already
  // queued on it, finishes this chunk first. The chunk is counted as queued there.
  Decoder assign(size_t images);
  // A chunk of `images` assigned to `decoder` finished after `busy` of that decoder's time (for
  // the CPU, one worker's wall time on it). Updates the cost per image (moving average, weight
  // 1/4) and the queue.
  void finished(Decoder decoder, size_t images, std::chrono::nanoseconds busy);
  // A chunk of `images` assigned to `decoder` left its queue without being decoded whole (its
  // epoch cancelled, its batch failed): it no longer counts as queued, and tells nothing of the
  // decoder's cost.
  void abandoned(Decoder decoder, size_t images);

  struct Snapshot {
    uint64_t cpu_images = 0, gpu_images = 0;            // assigned so far
    size_t cpu_backlog = 0, gpu_backlog = 0;            // assigned, not yet finished
    double cpu_ns_per_image = 0, gpu_ns_per_image = 0;  // the estimates (CPU: one worker's)
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  size_t workers_;
  bool gpu_available_;
  size_t gpu_batch_;
  double cost_ns_[2];
  bool measured_[2] = {false, false};
  size_t backlog_[2] = {0, 0};  // images assigned, not finished
  size_t chunks_[2] = {0, 0};   // chunks assigned, not finished
  uint64_t assigned_[2] = {0, 0};
};

}  // namespace conveyor
