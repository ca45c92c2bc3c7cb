// loader/src/options.h (detail, not installed): LoaderOptions resolved once, in one place.
//
// What it is for: every default of LoaderOptions (workers, slots, chunk_size, prefetch_factor),
// every clamp and every check lives here. conveyor::DataLoader resolves its options through it,
// and so does the drop-in (torch_data.cpp), which first maps its DataLoaderOptions onto
// LoaderOptions; neither repeats a rule.
//
// Guarantees: resolve_options() either throws std::invalid_argument naming the option, or returns
// options in which batch_size >= 1, workers >= 1, prefetch_factor >= 1, slots >= 2,
// 1 <= chunk_size <= batch_size, slots * chunks_per_batch fits a 32-bit job number, the timeout
// (if any) is in [0, one year], device is the CPU or a usable CUDA device with its index set, and
// gpu_decode has a share in [0, 1], threads >= 1 and max_batch >= chunk_size.
#pragma once

#include <cstddef>
#include <string>

#include "conveyor/loader.h"

namespace conveyor::detail {

struct ResolvedOptions : LoaderOptions {
  size_t chunks_per_batch = 1;  // ceil(batch_size / chunk_size)
  // workers was kAutoWorkers: `workers` is then max_workers (the threads started), and
  // WorkerTuner chooses how many of them work.
  bool auto_workers = false;
};

// `check_device`: false only for a loader given its own CopyEngine (tests), whose device rules.
ResolvedOptions resolve_options(const LoaderOptions& options, bool check_device = true);

}  // namespace conveyor::detail
