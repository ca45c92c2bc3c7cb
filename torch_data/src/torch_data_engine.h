// torch_data/src/torch_data_engine.h (detail, not installed): conveyor::DataLoader behind
// torch::data's conventions, for the drop-in's sources (torch_data/src/torch_data*.cpp).
//
// What it is for: the drop-in's loaders that run on Conveyor's engine (the collated path, once
// its shapes are known, and SampleSources such as ImageSource) need torch::data's error
// conventions on top of conveyor::DataLoader; this is the one place that translates them.
//
// Requires: the source's fields() are known, or it learns_fields() (the engine then reads them
// from the first sample it waits for).
// Guarantees: a sample's failure arrives as conveyor::WorkerError (with workers == 0, the
// dataset's own exception, unwrapped, as torch::data does); a batch that does not arrive within
// `timeout` throws torch's c10::Error ("Timeout in DataLoader queue while waiting for next batch
// ..."); after join(), start_epoch() and next() throw std::logic_error; save() and load() are
// DataLoader's.
// Thread safety: one consumer thread; the engine's workers are its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/loader.h"
#include "conveyor/torch_data.h"
#include "options.h"

namespace conveyor {
namespace detail {

// DataLoaderOptions resolved once (one CUDA query), for the engine: what the drop-in's loaders
// keep and pass on. The drop-in's own rules are here: max_jobs >= 1, workers == 0 meaning one
// background worker, and max_jobs meaning batch slots (plus the prefetched ones on a CUDA
// device); every other rule is resolve_options()'s.
struct DropInOptions {
  DataLoaderOptions user;  // as given: torch's conventions (workers == 0, timeout) follow these
  ResolvedOptions engine;
  // The batch slots in use, as FullDataLoaderOptions::max_jobs reports them.
  size_t max_jobs() const;
};
// Throws std::invalid_argument naming the option that no path can honour.
DropInOptions resolve_drop_in(const DataLoaderOptions& options);

class TorchConventionEngine {
 public:
  // `path` names the drop-in's path in mode(): "collated" (a torch dataset) or "source".
  TorchConventionEngine(std::shared_ptr<SampleSource> source, std::unique_ptr<Sampler> sampler,
                        const DropInOptions& options, std::string path);
  void start_epoch();
  std::optional<Batch> next();
  // DataLoader::save and DataLoader::load (which see).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  void load_state(const LoaderState& state);  // DataLoader::load_state
  void join();
  LoaderStats stats() const;
  // The path's name, ": ", and the engine's mode.
  std::string mode() const;
  size_t max_jobs() const { return max_jobs_; }  // DropInOptions::max_jobs()

 private:
  DataLoaderOptions options_;
  std::string path_;
  size_t max_jobs_;
  DataLoader loader_;
  bool joined_ = false;
};

}  // namespace detail
}  // namespace conveyor
