// loader/src/torch_data_engine.h (detail, not installed): conveyor::DataLoader behind
// torch::data's conventions, for the drop-in's sources (loader/src/torch_data*.cpp).
//
// What it is for: the drop-in's loaders that run on Conveyor's engine (the collated path, once
// its shapes are known, and SampleSources such as ImageSource) need torch::data's error
// conventions on top of conveyor::DataLoader; this is the one place that translates them.
//
// Requires: the source's fields() are known when it is constructed (it builds the engine).
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

namespace conveyor {
namespace detail {

class TorchConventionEngine {
 public:
  // `path` names the drop-in's path in mode(): "collated" (a torch dataset) or "source".
  TorchConventionEngine(std::shared_ptr<SampleSource> source, std::unique_ptr<Sampler> sampler,
                        const DataLoaderOptions& options, std::string path);
  // Starts the next epoch, or `epoch` when given. `reported`: samples of that epoch whose failure
  // the caller has already reported; the batch each one fails is passed over once.
  void start_epoch(std::optional<uint64_t> epoch = std::nullopt, std::vector<size_t> reported = {});
  std::optional<Batch> next();
  // DataLoader::save and DataLoader::load (which see).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  void join();
  LoaderStats stats() const;
  // The path's name, ": ", and the engine's mode.
  std::string mode() const;

 private:
  DataLoaderOptions options_;
  std::string path_;
  DataLoader loader_;
  std::vector<size_t> reported_;
  bool joined_ = false;
};

}  // namespace detail
}  // namespace conveyor
