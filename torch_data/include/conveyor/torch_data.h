// conveyor/torch_data.h: a drop-in for LibTorch's torch::data::make_data_loader.
//
// What it is for: switching an existing LibTorch training loop to Conveyor by changing one name,
// and getting pinned memory and GPU prefetch by adding two options:
//
//   auto loader = torch::data::make_data_loader(std::move(dataset),
//                                               torch::data::DataLoaderOptions(64).workers(4));
//   // becomes
//   auto loader = conveyor::make_data_loader(std::move(dataset),
//                                            conveyor::DataLoaderOptions(64).workers(4)
//                                                .pin_memory(true).device(torch::kCUDA));
//   for (auto& batch : *loader) train_step(batch.data, batch.target);
//
// make_data_loader has torch's three forms (dataset + sampler + options; dataset + options with a
// default torch RandomSampler; stateful dataset + options) and also takes Conveyor's own
// SampleSources (ImageSource: the fused JPEG decode pipeline), whose batches are conveyor::Batch.
// It returns a std::unique_ptr<TorchDataLoader<B>> where B is what torch's loader would yield.
//
// Three paths, chosen at compile time from the dataset's type (mode() says which one is in use):
//   * Collated: a per-sample dataset (torch::data::datasets::Dataset<Self, Example<>> whose
//     get_batch is torch's default, optionally mapped with example-level transforms such as
//     Normalize or TensorLambda) mapped with Stack<>() as the last transform. Each worker owns a
//     copy of the dataset and writes each sample's tensors (memcpy) into a row of a batch slot of
//     conveyor::DataLoader, so with a CUDA device the collate writes straight into a pinned slot
//     and the batch arrives through the side-stream copy (with the CPU device, pin_memory hands
//     each batch out as one copy in LibTorch's pinned host memory); the ErrorPolicy applies per
//     sample. On the first epoch, a background thread owned by the loader reads the first sample
//     of the first batch (the first index of the sampler's order) once, on its own copy of the
//     dataset, to learn the tensors' shapes and dtypes; every sample must have those shapes and
//     dtypes. Batches: Example<> (.data, .target) or TensorExample.
//   * Batched: every other dataset (custom get_batch, StatefulDataset, SharedBatchDataset,
//     Dataset<Self> without Stack, custom batch requests) runs on torch::data's own worker
//     machinery (so ordering, timeout and exceptions are torch's), wrapped so that the workers
//     pin the batch's tensors (pin_memory, with a usable GPU) and the consumer moves them to
//     `device` (non_blocking). This path reaches tensors in at::Tensor, Example, std::vector and
//     std::optional; other batch types are returned as they are and reject a non-CPU device.
//   * Sources: a conveyor::SampleSource (ImageSource) runs on conveyor::DataLoader as it is (its
//     fields are known without reading a sample, so nothing is probed); mode() says "source".
//
// Requires: C++17 or later. One thread iterates a loader. Datasets are copied once per worker
// (collated path, and stateless datasets on the batched path) and once for the shape probe, so
// they must be copyable and their copies must be usable concurrently, exactly as with
// torch::data. The dataset type is checked at compile time; a type that fits no path fails to
// compile with a message saying why.
// Guarantees, as torch::data's DataLoader:
//   * DataLoaderOptions has torch's fields, defaults, chaining setters and implicit construction
//     from a batch size; options() returns the resolved FullDataLoaderOptions (max_jobs: on the
//     batched path 2 * workers by default, as torch's; on the collated path and for SampleSources
//     the batch slots the engine really has). Options that no path can honour throw
//     std::invalid_argument from make_data_loader.
//   * Iterators: an input iterator; end() iterators all compare equal; a valid iterator equals
//     end() once the epoch is exhausted, and equals another valid iterator only if it is a copy of
//     it; dereferencing or incrementing past the end, or dereferencing/incrementing end(), throws
//     c10::Error with torch's messages. The first batch is fetched lazily.
//   * Every index the sampler yields is delivered exactly once per epoch; with enforce_ordering
//     batches arrive in sampler order; a worker's exception reaches the consumer as a
//     torch::data::WorkerException (a conveyor::WorkerError on the collated path, which adds the
//     index of the sample that failed, its batch and its epoch; the shape probe's failure is
//     reported as the failure of that sample in the first batch) whose original_exception is the
//     dataset's exception; with workers == 0 the dataset's exception propagates unwrapped.
//   * Timeout: no wait for a batch lasts longer than `timeout`, the first batch included (on the
//     collated path the shape probe and then the batch are each waited for at most `timeout`);
//     on expiry c10::Error ("Timeout in DataLoader queue while waiting for next batch ...") is
//     thrown, and a later increment or dereference waits again for the same batch.
//   * Destroying a loader mid-epoch returns once the samples being read finish (for the shape
//     probe: the one sample it reads); no thread outlives the loader.
//   * Checkpoints: save()/load() resume mid-epoch in O(1), byte-identical to an uninterrupted run
//     for the rest of the epoch, on the collated path and SampleSources (TorchDataLoader::save);
//     the batched path refuses them (std::logic_error).
// Thread safety: a loader and its iterators are used by one thread at a time; the worker and
// probe threads are the loader's own.
// Deliberate differences from torch::data (docs/migration.md lists them all):
//   * begin() while an epoch is in flight (e.g. after a `break`) starts a new epoch, cancelling
//     (or, on the batched path, draining) the rest of the old one, instead of throwing; iterators
//     of the replaced epoch then throw c10::Error when used.
//   * Collated path: workers == 0 still loads on one background worker (Conveyor has no
//     main-thread mode); the number of batch slots is max_jobs (default: workers +
//     prefetch_factor + 2) plus prefetch_factor with a CUDA device.
//   * A CUDA device when no GPU is usable throws std::invalid_argument from make_data_loader.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/arg.h>
#include <torch/data.h>

#include "conveyor/datasets.h"
#include "conveyor/loader.h"

namespace conveyor {

// ---------------------------------------------------------------------------------------------
// Options

// torch::data::DataLoaderOptions plus Conveyor's options. Set values with the chaining setters
// (`DataLoaderOptions(64).workers(4).pin_memory(true)`), read them through options().
struct DataLoaderOptions {
  DataLoaderOptions() = default;
  /* implicit */ DataLoaderOptions(size_t batch_size) : batch_size_(batch_size) {}

  // --- torch::data's options, same names and defaults.
  // The size of each batch.
  TORCH_ARG(size_t, batch_size) = 1;
  // Worker threads. 0: torch loads on the main thread; Conveyor's collated path uses one worker.
  TORCH_ARG(size_t, workers) = 0;
  // Batches in flight at once. Default: 2 * workers (batched path); on the collated path the
  // number of batch slots, default workers + prefetch_factor + 2.
  TORCH_ARG(std::optional<size_t>, max_jobs);
  // Longest wait for the next batch; none by default.
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout);
  // Deliver batches in sampler order (true) or as they finish.
  TORCH_ARG(bool, enforce_ordering) = true;
  // Omit the last batch when it has fewer than batch_size examples.
  TORCH_ARG(bool, drop_last) = false;

  // --- Conveyor's options.
  // Page-locked batch memory when a CUDA device is usable (ignored without one). Off by default,
  // as torch::data does not pin.
  TORCH_ARG(bool, pin_memory) = false;
  // Where batches are delivered. A CUDA device adds the side-stream copy (collated path) or a
  // .to(device, non_blocking) on the consumer (batched path).
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);
  // Batches copied to a CUDA device ahead of the consumer (collated path); at least 1.
  TORCH_ARG(size_t, prefetch_factor) = 2;
  // The batched path's .to(device, non_blocking). The collated path's copies are always
  // asynchronous and ordered before the consumer's stream.
  TORCH_ARG(bool, non_blocking) = true;
  // Seeds Conveyor's augmentations (ImageSource) and the default sampler of SampleSource loaders.
  // torch datasets and torch samplers keep using torch's global generator, as with torch::data.
  TORCH_ARG(uint64_t, seed) = 0;
  // What a failing sample does (collated path and SampleSources). kSkip substitutes the next
  // sample that loads and records it in stats(); the batched path supports only kRaise.
  TORCH_ARG(ErrorPolicy, on_error) = ErrorPolicy::kRaise;
  // With kSkip: how many following samples to try as a substitute for a failing one (the
  // workers', and the shape probe's before the first batch) before the batch fails.
  TORCH_ARG(size_t, max_substitutes) = LoaderOptions().max_substitutes;
};

// The options with defaults resolved, as torch::data::FullDataLoaderOptions.
struct FullDataLoaderOptions {
  explicit FullDataLoaderOptions(const DataLoaderOptions& options)
      : batch_size(options.batch_size()),
        workers(options.workers()),
        max_jobs(options.max_jobs().value_or(2 * options.workers())),
        timeout(options.timeout()),
        enforce_ordering(options.enforce_ordering()),
        drop_last(options.drop_last()),
        pin_memory(options.pin_memory()),
        device(options.device()),
        prefetch_factor(options.prefetch_factor()),
        non_blocking(options.non_blocking()),
        seed(options.seed()),
        on_error(options.on_error()),
        max_substitutes(options.max_substitutes()) {}

  size_t batch_size;
  size_t workers;
  size_t max_jobs;
  std::optional<std::chrono::milliseconds> timeout;
  bool enforce_ordering;
  bool drop_last;
  bool pin_memory;
  c10::Device device;
  size_t prefetch_factor;
  bool non_blocking;
  uint64_t seed;
  ErrorPolicy on_error;
  size_t max_substitutes;
};

// ---------------------------------------------------------------------------------------------
// Errors

// A sample failed in a worker, or in the shape probe (collated path and SampleSources). Catch it
// as torch::data::WorkerException; what() is torch's message followed by the sample's index, its
// batch and its epoch; original_exception is what the dataset threw.
class WorkerError : public torch::data::WorkerException {
 public:
  // The message is torch's WorkerException message for `original`, then " (" + context + ")";
  // `context` is a whole Conveyor message ("conveyor: sample 13 (...) failed in batch ...").
  WorkerError(std::exception_ptr original, size_t index, std::string sample,
              const std::string& context);
  size_t index() const { return index_; }
  // The sample's description (a file path for ImageSource).
  const std::string& sample() const { return sample_; }

 private:
  size_t index_;
  std::string sample_;
};

// ---------------------------------------------------------------------------------------------
// Iterator and loader

// torch::data::Iterator's semantics: see the header comment.
template <typename BatchT>
class Iterator {
 public:
  using difference_type = std::ptrdiff_t;
  using value_type = BatchT;
  using pointer = BatchT*;
  using reference = BatchT&;
  using iterator_category = std::input_iterator_tag;
  using BatchProducer = std::function<std::optional<BatchT>()>;

  // The past-the-end iterator.
  Iterator() = default;
  explicit Iterator(BatchProducer next_batch)
      : state_(std::make_shared<State>(State{std::move(next_batch), std::nullopt, false})) {}

  Iterator& operator++() {
    TORCH_CHECK(state_, "Incrementing the DataLoader's past-the-end iterator is not allowed");
    lazy_initialize();
    TORCH_CHECK(state_->batch.has_value(), "Attempted to increment iterator past the end");
    // As torch: if fetching throws, the iterator keeps its batch and may be incremented again.
    state_->batch = state_->next_batch();
    return *this;
  }
  BatchT& operator*() {
    TORCH_CHECK(state_, "Dereferencing the DataLoader's past-the-end iterator is not allowed");
    lazy_initialize();
    TORCH_CHECK(state_->batch.has_value(),
                "Attempted to dereference iterator that was past the end");
    return *state_->batch;
  }
  BatchT* operator->() { return &**this; }
  bool operator==(const Iterator& other) const {
    if (!state_ && !other.state_) return true;
    if (state_ && other.state_) return state_ == other.state_;
    const Iterator& valid = state_ ? *this : other;
    valid.lazy_initialize();
    return !valid.state_->batch.has_value();
  }
  bool operator!=(const Iterator& other) const { return !(*this == other); }

 private:
  struct State {
    BatchProducer next_batch;
    std::optional<BatchT> batch;
    bool initialized;
  };
  void lazy_initialize() const {
    if (!state_->initialized) {
      state_->batch = state_->next_batch();
      state_->initialized = true;
    }
  }
  std::shared_ptr<State> state_;  // null: past-the-end
};

// What make_data_loader returns: torch::data's loader interface (begin, end, join, options).
template <typename BatchT>
class TorchDataLoader {
 public:
  using BatchType = BatchT;

  explicit TorchDataLoader(const DataLoaderOptions& options) : options_(options) {}
  virtual ~TorchDataLoader() = default;
  TorchDataLoader(const TorchDataLoader&) = delete;
  TorchDataLoader& operator=(const TorchDataLoader&) = delete;

  // Starts a new epoch (the first, or the next one, cancelling what is left of the current one).
  Iterator<BatchT> begin() {
    start_epoch();
    const uint64_t epoch = ++epochs_begun_;
    return Iterator<BatchT>([this, epoch, loads = loads_]() -> std::optional<BatchT> {
      TORCH_CHECK(epoch == epochs_begun_, "conveyor: this DataLoader iterator belongs to epoch ",
                  epoch - 1, ", which a later begin() replaced");
      TORCH_CHECK(loads == loads_, "conveyor: this DataLoader iterator belongs to epoch ",
                  epoch - 1,
                  ", which a later load() replaced; call begin() to continue from the checkpoint");
      return next_batch();
    });
  }
  Iterator<BatchT> end() { return Iterator<BatchT>(); }
  // Stops the workers; the loader yields nothing afterwards.
  virtual void join() = 0;
  const FullDataLoaderOptions& options() const noexcept { return options_; }
  // Counters and timings (the batched path fills batches and wait_seconds only).
  virtual LoaderStats stats() const = 0;
  // One line: which path (collated, source or batched) and, on Conveyor's engine, its mode.
  virtual std::string mode() const = 0;

  // --- Checkpoints (collated path and SampleSources; as conveyor::DataLoader::save/load).
  // Writes the loader's position into `archive` (save it with the model's, e.g. by torch::save):
  // the epoch, the batches received in it (the batch an iterator holds counts as received), and
  // what shapes the order: batch_size, drop_last, seed, the dataset's size and the sampler. On the
  // collated path the sampler is a torch sampler, whose order is drawn from torch's global
  // generator, so the checkpoint holds the current epoch's whole order. Nothing about workers,
  // max_jobs or prefetch_factor. Throws std::logic_error mid-epoch without enforce_ordering, and
  // always on the batched path (torch's workers own its order; use a per-sample dataset mapped
  // with Stack<>(), or a SampleSource).
  virtual void save(torch::serialize::OutputArchive& archive) const = 0;
  // Reads a position written by save() of a loader on the same path. The next begin() continues
  // that epoch with the batch after the last one received, without reading a sample before it;
  // its batches are byte-identical to an uninterrupted run's, whatever the workers or max_jobs.
  // If that epoch was complete, the next begin() starts the one after it. Later epochs: as
  // DataLoader::load for SampleSources (bit-exact); on the collated path they are drawn from the
  // torch sampler as usual, so they follow torch's global generator exactly as torch::data's
  // would (for bit-exact later epochs, save and restore its state yourself:
  // at::detail::getDefaultCPUGenerator().get_state()/set_state(); or use a conveyor::Sampler
  // through a SampleSource). Iterators obtained before load() throw c10::Error when used.
  // Throws std::invalid_argument naming a field that does not fit (batch_size, drop_last,
  // dataset size, seed, the sampler) or a number out of its range (DataLoader::load_state's
  // checks), leaving the loader as it was; std::logic_error on the batched path. Load only
  // archives you wrote: InputArchive::load_from() is torch::jit::load(), which can run code from
  // the file before load() sees it (docs/resume.md).
  virtual void load(torch::serialize::InputArchive& archive) = 0;

 protected:
  virtual void start_epoch() = 0;
  virtual std::optional<BatchT> next_batch() = 0;
  // Makes the iterators of the current epoch throw; a subclass's load() calls it once it loaded.
  void replaced_by_load() { ++loads_; }
  // What options().max_jobs reports: on Conveyor's engine, the batch slots it really uses.
  void report_max_jobs(size_t max_jobs) { options_.max_jobs = max_jobs; }

 private:
  FullDataLoaderOptions options_;
  uint64_t epochs_begun_ = 0;
  uint64_t loads_ = 0;  // load() calls so far
};

namespace detail {
// Throws std::invalid_argument, naming the option, for options no path can honour (batch_size 0,
// max_jobs 0, a negative timeout, a device that is not the CPU or a usable CUDA device).
void check_options(const DataLoaderOptions& options);
}  // namespace detail

}  // namespace conveyor

// How each path works (templates, so in headers; not for direct inclusion). They use the types
// above.
#include "conveyor/detail/torch_data_batched.h"
#include "conveyor/detail/torch_data_collated.h"

namespace conveyor {

// ---------------------------------------------------------------------------------------------
// make_data_loader: torch::data's three forms, and SampleSources.

// A stateless `dataset`, a torch `sampler` and `options`.
template <typename Dataset, typename Sampler, std::enable_if_t<!Dataset::is_stateful, int> = 0>
std::unique_ptr<TorchDataLoader<typename Dataset::BatchType>> make_data_loader(
    Dataset dataset, Sampler sampler, DataLoaderOptions options) {
  using BatchT = typename Dataset::BatchType;
  if constexpr (detail::Collated<Dataset>::value &&
                std::is_same_v<typename Sampler::BatchRequestType, std::vector<size_t>>) {
    const std::optional<size_t> size = dataset.size();
    if (size) {  // its engine resolves (and checks) the options, once
      return std::make_unique<detail::CollatedDataLoader<Dataset>>(std::move(dataset), *size,
                                                                   std::move(sampler), options);
    }
  }
  detail::check_options(options);
  if (options.on_error() != ErrorPolicy::kRaise) {
    throw std::invalid_argument(
        "conveyor: on_error(kSkip) needs a per-sample dataset mapped with Stack<>() (the "
        "collated path); this dataset's batches come from its get_batch");
  }
  using Runner = detail::OpenTorchLoader<
      torch::data::StatelessDataLoader<detail::PinningDataset<Dataset>, Sampler>>;
  return std::make_unique<detail::BatchedDataLoader<Runner, BatchT>>(
      options, detail::PinningDataset<Dataset>(std::move(dataset), options.pin_memory()),
      std::move(sampler), detail::to_torch_options(options));
}

// A stateless `dataset` and `options`; the sampler (a torch RandomSampler by default) is
// constructed from the dataset's size.
template <typename Sampler = torch::data::samplers::RandomSampler, typename Dataset,
          std::enable_if_t<!Dataset::is_stateful, int> = 0>
std::unique_ptr<TorchDataLoader<typename Dataset::BatchType>> make_data_loader(
    Dataset dataset, DataLoaderOptions options = DataLoaderOptions()) {
  static_assert(std::is_constructible_v<Sampler, size_t>,
                "conveyor::make_data_loader(dataset, options) constructs the Sampler from the "
                "dataset's size, and this Sampler cannot be; pass a sampler: "
                "make_data_loader(dataset, sampler, options)");
  const std::optional<size_t> size = dataset.size();
  TORCH_CHECK(size.has_value(),
              "Expected the dataset to be sized in order to construct the Sampler");
  return make_data_loader(std::move(dataset), Sampler(*size), std::move(options));
}

// A stateful `dataset` (its get_batch returns std::optional; nullopt ends the epoch) and
// `options`. All workers share the one dataset, as with torch::data.
template <typename Dataset, std::enable_if_t<Dataset::is_stateful, int> = 0>
std::unique_ptr<TorchDataLoader<typename Dataset::BatchType::value_type>> make_data_loader(
    Dataset dataset, DataLoaderOptions options = DataLoaderOptions()) {
  detail::check_options(options);
  if (options.on_error() != ErrorPolicy::kRaise) {
    throw std::invalid_argument("conveyor: on_error(kSkip) is not available for stateful datasets");
  }
  using BatchT = typename Dataset::BatchType::value_type;
  using Runner =
      detail::OpenTorchLoader<torch::data::StatefulDataLoader<detail::PinningDataset<Dataset>>>;
  return std::make_unique<detail::BatchedDataLoader<Runner, BatchT>>(
      options, detail::PinningDataset<Dataset>(std::move(dataset), options.pin_memory()),
      detail::to_torch_options(options));
}

// Conveyor's own sources (e.g. ImageSource::image_folder): batches are conveyor::Batch, written by
// the workers straight into (pinned) slots. `sampler` defaults to RandomSampler(options.seed()).
std::unique_ptr<TorchDataLoader<Batch>> make_data_loader(std::shared_ptr<SampleSource> source,
                                                         std::unique_ptr<Sampler> sampler,
                                                         DataLoaderOptions options);
std::unique_ptr<TorchDataLoader<Batch>> make_data_loader(
    std::shared_ptr<SampleSource> source, DataLoaderOptions options = DataLoaderOptions());

}  // namespace conveyor
