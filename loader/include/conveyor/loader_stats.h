// conveyor/loader_stats.h: what a DataLoader counts: LoaderStats.
// Part of the loader's public interface (conveyor/loader.h includes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

struct SkippedSample {
  size_t index;
  std::string path;
  std::string message;
  uint64_t epoch;
};

// A change of the active workers under kAutoWorkers: from the batch handed out `batch` (counted
// over the loader's life) and `seconds` after the loader started, `workers` work.
struct ActiveWorkers {
  uint64_t batch = 0;
  double seconds = 0;
  size_t workers = 0;
};

// How the images were shared between the CPU and the GPU decoder (LoaderOptions::gpu_decode).
struct GpuDecodeStats {
  bool active = false;  // the GPU decoder runs
  // Off, why it cannot run, or which decoder runs on which device.
  std::string status = "off";
  uint64_t gpu_images = 0;  // images decoded on the device
  uint64_t cpu_images = 0;  // images decoded on the CPU (by the workers, and the refused ones)
  // Of the images sent to the device decoder, those it left to the CPU: files the hardware does
  // not take, files it could not read (the CPU path then names the error), and substitutes.
  uint64_t refused = 0;
  // Batched decode calls that failed on the device (CUDA or nvJPEG), their images then decoded on
  // the CPU.
  uint64_t failed_batches = 0;
  double gpu_busy_seconds = 0;  // the decode threads' time on chunks, summed over them
  double gpu_idle_seconds = 0;  // the decode threads' time waiting for chunks, summed
  double cpu_idle_seconds = 0;  // the workers' time waiting for a chunk, summed over workers
  // kAuto: the balancer's estimates of the cost per image (the CPU's: one worker's).
  double cpu_ns_per_image = 0;
  double gpu_ns_per_image = 0;
  double gpu_share() const {
    const uint64_t all = gpu_images + cpu_images;
    return all == 0 ? 0.0 : static_cast<double>(gpu_images) / static_cast<double>(all);
  }
};

struct LoaderStats {
  uint64_t batches = 0;                        // delivered to the consumer
  uint64_t samples = 0;                        // rows delivered
  uint64_t skipped = 0;                        // samples replaced under kSkip
  uint64_t errors = 0;                         // sample failures seen (raised or skipped)
  std::vector<SkippedSample> skipped_samples;  // the first 1000
  double fill_seconds = 0;          // worker time spent writing samples, summed over workers
  double copy_issue_seconds = 0;    // consumer time spent issuing device copies
  double wait_seconds = 0;          // time the consumer waited for a batch
  std::vector<size_t> slot_states;  // slots per SlotState, now
  uint64_t copies_to_host = 0;      // batches handed out as copies because the user held every slot
  size_t active_workers = 0;        // workers that work now (all of them unless kAutoWorkers)
  // Under kAutoWorkers: the active workers from the start, then every change (the first 4096).
  std::vector<ActiveWorkers> active_workers_history;
  GpuDecodeStats gpu_decode;  // the split between the decoders (LoaderOptions::gpu_decode)
  // Time the batch stage (LoaderOptions::batch_transform) took: the workers' time running it on a
  // CPU loader (summed over workers), the consumer's time queuing its ops on a CUDA loader (part
  // of copy_issue_seconds there). 0 without a batch_transform.
  double transform_seconds = 0;
};

}  // namespace conveyor
