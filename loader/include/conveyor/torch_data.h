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
// Two paths, chosen at compile time from the dataset's type (mode() says which one is in use):
//   * Collated: a per-sample dataset (torch::data::datasets::Dataset<Self, Example<>> whose
//     get_batch is torch's default, optionally mapped with example-level transforms such as
//     Normalize or TensorLambda) mapped with Stack<>() as the last transform. Each worker owns a
//     copy of the dataset and writes each sample's tensors (memcpy) into a row of a batch slot of
//     conveyor::DataLoader, so with a CUDA device the collate writes straight into a pinned slot
//     and the batch arrives through the side-stream copy (with the CPU device, pin_memory hands
//     each batch out as one copy in LibTorch's pinned host memory); the ErrorPolicy applies per
//     sample. Sample 0 is read once on the first iteration to learn the tensors' shapes and
//     dtypes; every sample must have those shapes and dtypes. Batches: Example<> (.data,
//     .target) or TensorExample.
//   * Batched: every other dataset (custom get_batch, StatefulDataset, SharedBatchDataset,
//     Dataset<Self> without Stack, custom batch requests) runs on torch::data's own worker
//     machinery (so ordering, timeout and exceptions are torch's), wrapped so that the workers
//     pin the batch's tensors (pin_memory, with a usable GPU) and the consumer moves them to
//     `device` (non_blocking). This path reaches tensors in at::Tensor, Example, std::vector and
//     std::optional; other batch types are returned as they are and reject a non-CPU device.
//
// Requires: one thread iterates a loader. Datasets are copied once per worker (collated path, and
// stateless datasets on the batched path), so they must be copyable and their copies must be
// usable concurrently, exactly as with torch::data.
// Guarantees, as torch::data's DataLoader:
//   * DataLoaderOptions has torch's fields, defaults, chaining setters and implicit construction
//     from a batch size; options() returns the resolved FullDataLoaderOptions (max_jobs defaults to
//     2 * workers).
//   * Iterators: an input iterator; end() iterators all compare equal; a valid iterator equals
//     end() once the epoch is exhausted, and equals another valid iterator only if it is a copy of
//     it; dereferencing or incrementing past the end, or dereferencing/incrementing end(), throws
//     c10::Error with torch's messages. The first batch is fetched lazily.
//   * Every index the sampler yields is delivered exactly once per epoch; with enforce_ordering
//     batches arrive in sampler order; a worker's exception reaches the consumer as a
//     torch::data::WorkerException (a conveyor::WorkerError on the collated path, which adds the
//     sample index) whose original_exception is the dataset's exception; with workers == 0 the
//     dataset's exception propagates unwrapped; a batch that does not arrive within timeout throws
//     c10::Error ("Timeout in DataLoader queue while waiting for next batch ...").
// Deliberate differences from torch::data (docs/migration.md lists them all):
//   * begin() while an epoch is in flight (e.g. after a `break`) starts a new epoch, cancelling
//   (or,
//     on the batched path, draining) the rest of the old one, instead of throwing; iterators of
//     the replaced epoch then throw c10::Error when used.
//   * Collated path: workers == 0 still loads on one background thread (Conveyor has no
//     main-thread mode); the number of batch slots is max_jobs (default: workers +
//     prefetch_factor + 2) plus prefetch_factor with a CUDA device.
//   * A CUDA device when no GPU is usable throws std::invalid_argument from make_data_loader.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
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
        on_error(options.on_error()) {}

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
};

// ---------------------------------------------------------------------------------------------
// Errors

// A sample failed in a worker (collated path). Catch it as torch::data::WorkerException; what()
// is torch's message followed by the sample index and the batch; original_exception is what the
// dataset threw.
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
    return Iterator<BatchT>([this, epoch]() -> std::optional<BatchT> {
      TORCH_CHECK(epoch == epochs_begun_, "conveyor: this DataLoader iterator belongs to epoch ",
                  epoch - 1, ", which a later begin() replaced");
      return next_batch();
    });
  }
  Iterator<BatchT> end() { return Iterator<BatchT>(); }
  // Stops the workers; the loader yields nothing afterwards.
  virtual void join() = 0;
  const FullDataLoaderOptions& options() const noexcept { return options_; }
  // Counters and timings (the batched path fills batches and wait_seconds only).
  virtual LoaderStats stats() const = 0;
  // One line: which path (collated or batched) and, for the collated one, the engine's mode.
  virtual std::string mode() const = 0;

 protected:
  virtual void start_epoch() = 0;
  virtual std::optional<BatchT> next_batch() = 0;

 private:
  FullDataLoaderOptions options_;
  uint64_t epochs_begun_ = 0;
};

namespace detail {

namespace td = torch::data;

// Throws std::invalid_argument for options no path can honour (batch_size 0, an unusable device).
void check_options(const DataLoaderOptions& options);
LoaderOptions to_loader_options(const DataLoaderOptions& options);
td::DataLoaderOptions to_torch_options(const DataLoaderOptions& options);

// The collated path's engine, type-erased: conveyor::DataLoader built on the first next() (after
// the source's sample 0 told the shapes), with torch::data's exception conventions.
class CollatedEngine {
 public:
  CollatedEngine(std::shared_ptr<SampleSource> source, std::unique_ptr<Sampler> sampler,
                 const DataLoaderOptions& options);
  ~CollatedEngine();
  CollatedEngine(const CollatedEngine&) = delete;
  CollatedEngine& operator=(const CollatedEngine&) = delete;
  void start_epoch();
  std::optional<Batch> next();
  void join();
  LoaderStats stats() const;
  std::string mode() const;

 private:
  [[noreturn]] void rethrow_as_torch(std::exception_ptr error) const;
  std::shared_ptr<SampleSource> source_;
  std::unique_ptr<Sampler> sampler_;  // until the engine is built
  DataLoaderOptions options_;
  std::unique_ptr<DataLoader> engine_;
  bool start_pending_ = false;
  bool joined_ = false;
};

// --- Which datasets the collated path can take.

// A Dataset<D, E> whose get_batch is torch's default (get() per index).
template <typename D>
concept PlainExampleDataset =
    std::is_base_of_v<td::datasets::Dataset<D, typename D::ExampleType>, D> &&
    std::is_same_v < decltype(&D::get_batch),
        std::vector<typename D::ExampleType>(td::datasets::Dataset<D, typename D::ExampleType>::*)
(c10::ArrayRef<size_t>) > ;

// An example-level Transform<In, Out> whose apply_batch is torch's default (apply() per example).
template <typename T, typename In>
concept ExampleTransform =
    std::is_same_v<typename T::InputType, In> &&
    std::is_base_of_v<td::transforms::Transform<In, typename T::OutputType>, T> &&
    std::is_same_v < decltype(&T::apply_batch),
        std::vector<typename T::OutputType>(
            td::transforms::Transform<In, typename T::OutputType>::*)
(std::vector<In>) > ;

// PerSample<D>::get(d, i): sample i of a per-sample dataset, through its example transforms.
template <typename D>
struct PerSample {
  static constexpr bool value = false;
};
template <PlainExampleDataset D>
struct PerSample<D> {
  static constexpr bool value = true;
  using Example = typename D::ExampleType;
  static Example get(D& dataset, size_t index) { return dataset.get(index); }
};
template <typename S, typename T>
requires(PerSample<S>::value&& ExampleTransform<
         T, typename PerSample<S>::Example>) struct PerSample<td::datasets::MapDataset<S, T>> {
  static constexpr bool value = true;
  using Example = typename T::OutputType;
  static Example get(td::datasets::MapDataset<S, T>& dataset, size_t index) {
    // MapDataset exposes its parts as const; this copy belongs to the calling worker.
    auto& inner = const_cast<S&>(dataset.dataset());
    auto& transform = const_cast<T&>(dataset.transform());
    return transform.apply(PerSample<S>::get(inner, index));
  }
};

// Collated<D>: D is a per-sample dataset mapped with Stack<Example<>> or Stack<TensorExample>.
template <typename D>
struct Collated {
  static constexpr bool value = false;
};
template <typename S, typename E>
requires(PerSample<S>::value&& std::is_same_v<typename PerSample<S>::Example, E> &&
         (std::is_same_v<E, td::Example<>> ||
          std::is_same_v<
              E, td::TensorExample>)) struct Collated<td::datasets::
                                                          MapDataset<S, td::transforms::Stack<E>>> {
  static constexpr bool value = true;
  static constexpr bool has_target = std::is_same_v<E, td::Example<>>;
  using Inner = S;
};

// One description of a tensor for error messages: "float [3, 32, 32]".
std::string describe_tensor(const at::Tensor& tensor);
// Checks `tensor` against `spec` (throwing with the sample index when it differs) and copies its
// bytes to `out`.
void write_tensor(const at::Tensor& tensor, const FieldSpec& spec, size_t index, std::byte* out);
FieldSpec probe_field(const at::Tensor& tensor, const char* name, size_t index);

// A per-sample torch dataset seen as a SampleSource: one copy of the dataset per worker.
template <typename D>
class TorchExampleSource final : public SampleSource {
  using Traits = Collated<D>;
  using Inner = typename Traits::Inner;

 public:
  TorchExampleSource(D dataset, size_t size) : prototype_(std::move(dataset)), size_(size) {}
  size_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override {
    if (specs_.empty()) {  // sample 0 tells the shapes; read once, on a copy
      D probe = prototype_;
      auto example = PerSample<Inner>::get(inner(probe), 0);
      specs_.push_back(probe_field(example.data, "data", 0));
      if constexpr (Traits::has_target) specs_.push_back(probe_field(example.target, "target", 0));
    }
    return specs_;
  }
  void prepare(size_t workers) override {
    copies_.clear();
    copies_.reserve(workers);
    for (size_t w = 0; w < workers; ++w) copies_.push_back(prototype_);
  }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    auto example = PerSample<Inner>::get(inner(copies_[ctx.worker]), ctx.index);
    write_tensor(example.data, specs_[0], ctx.index, fields[0]);
    if constexpr (Traits::has_target) write_tensor(example.target, specs_[1], ctx.index, fields[1]);
  }
  std::string describe(size_t index) const override {
    return "index " + std::to_string(index) + " of the torch dataset";
  }

 private:
  static Inner& inner(D& dataset) { return const_cast<Inner&>(dataset.dataset()); }
  D prototype_;
  size_t size_;
  std::vector<D> copies_;
  mutable std::vector<FieldSpec> specs_;
};

// A torch sampler as a conveyor::Sampler: each epoch, reset() and then next(batch_size) until it
// is exhausted, as torch's loader does; the indices are kept for the epoch. Called by the
// consumer thread only.
template <typename S>
class TorchSamplerAdapter final : public Sampler {
 public:
  TorchSamplerAdapter(S sampler, size_t batch_size)
      : sampler_(std::move(sampler)), batch_size_(batch_size) {}
  void indices(size_t, uint64_t epoch, std::vector<size_t>& out) const override {
    if (epoch != cached_epoch_) {
      cached_.clear();
      sampler_.reset(std::nullopt);
      while (auto request = sampler_.next(batch_size_)) {
        if (request->empty()) break;
        cached_.insert(cached_.end(), request->begin(), request->end());
      }
      cached_epoch_ = epoch;
    }
    out = cached_;
  }

 private:
  mutable S sampler_;
  size_t batch_size_;
  mutable uint64_t cached_epoch_ = UINT64_MAX;
  mutable std::vector<size_t> cached_;
};

template <typename D>
class CollatedDataLoader final : public TorchDataLoader<typename D::BatchType> {
  using BatchT = typename D::BatchType;

 public:
  template <typename S>
  CollatedDataLoader(D dataset, size_t size, S sampler, const DataLoaderOptions& options)
      : TorchDataLoader<BatchT>(options),
        engine_(std::make_shared<TorchExampleSource<D>>(std::move(dataset), size),
                std::make_unique<TorchSamplerAdapter<S>>(std::move(sampler), options.batch_size()),
                options) {}
  void join() override { engine_.join(); }
  LoaderStats stats() const override { return engine_.stats(); }
  std::string mode() const override { return engine_.mode(); }

 protected:
  void start_epoch() override { engine_.start_epoch(); }
  std::optional<BatchT> next_batch() override {
    std::optional<Batch> batch = engine_.next();
    if (!batch) return std::nullopt;
    if constexpr (Collated<D>::has_target) {
      return BatchT(std::move(batch->fields[0]), std::move(batch->fields[1]));
    } else {
      return BatchT(std::move(batch->fields[0]));
    }
  }

 private:
  CollatedEngine engine_;
};

// conveyor::Batch straight from a SampleSource (ImageSource's fused decode pipeline).
class SourceDataLoader final : public TorchDataLoader<Batch> {
 public:
  SourceDataLoader(std::shared_ptr<SampleSource> source, std::unique_ptr<Sampler> sampler,
                   const DataLoaderOptions& options);
  void join() override { engine_.join(); }
  LoaderStats stats() const override { return engine_.stats(); }
  std::string mode() const override { return engine_.mode(); }

 protected:
  void start_epoch() override { engine_.start_epoch(); }
  std::optional<Batch> next_batch() override { return engine_.next(); }

 private:
  CollatedEngine engine_;
};

// --- The batched path.

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <typename T>
struct IsVector : std::false_type {};
template <typename T, typename A>
struct IsVector<std::vector<T, A>> : std::true_type {};
template <typename T>
struct IsExample : std::false_type {};
template <typename Data, typename Target>
struct IsExample<td::Example<Data, Target>> : std::true_type {};

// Whether for_each_tensor reaches tensors in a T.
template <typename T>
constexpr bool holds_tensors() {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return true;
  } else if constexpr (IsExample<T>::value) {
    if constexpr (std::is_void_v<typename T::TargetType>) {
      return holds_tensors<typename T::DataType>();
    } else {
      return holds_tensors<typename T::DataType>() && holds_tensors<typename T::TargetType>();
    }
  } else if constexpr (IsVector<T>::value || IsOptional<T>::value) {
    return holds_tensors<typename T::value_type>();
  } else {
    return false;
  }
}

template <typename T, typename F>
void for_each_tensor(T& value, const F& f) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    f(value);
  } else if constexpr (IsExample<T>::value) {
    for_each_tensor(value.data, f);
    if constexpr (!std::is_void_v<typename T::TargetType>) for_each_tensor(value.target, f);
  } else if constexpr (IsVector<T>::value) {
    for (auto& element : value) for_each_tensor(element, f);
  } else if constexpr (IsOptional<T>::value) {
    if (value) for_each_tensor(*value, f);
  }
}

// Pins a CPU tensor in place when a CUDA device is usable (otherwise leaves it).
void pin_tensor(at::Tensor& tensor);

// D's batches, with the tensors pinned by the worker that made them.
template <typename D>
class PinningDataset final
    : public td::datasets::BatchDataset<PinningDataset<D>, typename D::BatchType,
                                        typename D::BatchRequestType> {
 public:
  using BatchType = typename D::BatchType;
  using BatchRequestType = typename D::BatchRequestType;

  PinningDataset(D dataset, bool pin) : dataset_(std::move(dataset)), pin_(pin) {}
  BatchType get_batch(BatchRequestType request) override {
    BatchType batch = dataset_.get_batch(std::move(request));
    if constexpr (holds_tensors<BatchType>()) {
      if (pin_) for_each_tensor(batch, [](at::Tensor& t) { pin_tensor(t); });
    }
    return batch;
  }
  std::optional<size_t> size() const override { return dataset_.size(); }
  void reset() { dataset_.reset(); }  // instantiated for stateful datasets only

 private:
  D dataset_;
  bool pin_;
};

// torch's loaders, opened up: start_epoch() drains what is in flight first (so a new epoch after
// a `break` works), next_batch() is torch's next().
template <typename Base>
class OpenTorchLoader final : public Base {
 public:
  using Base::Base;
  void start_epoch() {
    this->shuttle_.drain();
    (void)Base::begin();  // resets the sampler/dataset and schedules the first jobs
  }
  auto next_batch() { return this->next(); }
};

template <typename Runner, typename BatchT>
class BatchedDataLoader final : public TorchDataLoader<BatchT> {
 public:
  template <typename... Args>
  explicit BatchedDataLoader(const DataLoaderOptions& options, Args&&... args)
      : TorchDataLoader<BatchT>(options),
        runner_(std::make_unique<Runner>(std::forward<Args>(args)...)) {
    if constexpr (!holds_tensors<BatchT>()) {
      if (!options.device().is_cpu()) {
        throw std::invalid_argument(
            "conveyor: device " + options.device().str() +
            " needs batches whose tensors Conveyor can reach (at::Tensor, Example, std::vector "
            "or std::optional of these); this dataset's batch type is none of them");
      }
    }
  }
  void join() override { runner_->join(); }
  LoaderStats stats() const override {
    LoaderStats s;
    s.batches = batches_;
    s.wait_seconds = wait_seconds_;
    return s;
  }
  std::string mode() const override {
    return "batched: torch::data worker threads call get_batch; " +
           std::string(this->options().pin_memory && cuda_available() ? "pinned by the workers"
                                                                      : "not pinned") +
           (this->options().device.is_cpu() ? ", on the CPU"
                                            : ", moved to " + this->options().device.str());
  }

 protected:
  void start_epoch() override { runner_->start_epoch(); }
  std::optional<BatchT> next_batch() override {
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<BatchT> batch = runner_->next_batch();
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!batch) return std::nullopt;
    ++batches_;
    if constexpr (holds_tensors<BatchT>()) {
      const c10::Device device = this->options().device;
      const bool non_blocking = this->options().non_blocking;
      if (!device.is_cpu()) {
        for_each_tensor(*batch, [&](at::Tensor& t) { t = t.to(device, non_blocking); });
      }
    }
    return batch;
  }

 private:
  std::unique_ptr<Runner> runner_;
  uint64_t batches_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// make_data_loader: torch::data's three forms, and SampleSources.

// A stateless `dataset`, a torch `sampler` and `options`.
template <typename Dataset, typename Sampler>
requires(!Dataset::is_stateful)
    std::unique_ptr<TorchDataLoader<typename Dataset::BatchType>> make_data_loader(
        Dataset dataset, Sampler sampler, DataLoaderOptions options) {
  detail::check_options(options);
  using BatchT = typename Dataset::BatchType;
  if constexpr (detail::Collated<Dataset>::value &&
                std::is_same_v<typename Sampler::BatchRequestType, std::vector<size_t>>) {
    const std::optional<size_t> size = dataset.size();
    if (size) {
      return std::make_unique<detail::CollatedDataLoader<Dataset>>(std::move(dataset), *size,
                                                                   std::move(sampler), options);
    }
  }
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
template <typename Sampler = torch::data::samplers::RandomSampler, typename Dataset>
requires(!Dataset::is_stateful && std::is_constructible_v<Sampler, size_t>)
    std::unique_ptr<TorchDataLoader<typename Dataset::BatchType>> make_data_loader(
        Dataset dataset, DataLoaderOptions options = DataLoaderOptions()) {
  const std::optional<size_t> size = dataset.size();
  TORCH_CHECK(size.has_value(),
              "Expected the dataset to be sized in order to construct the Sampler");
  return make_data_loader(std::move(dataset), Sampler(*size), std::move(options));
}

// A stateful `dataset` (its get_batch returns std::optional; nullopt ends the epoch) and
// `options`. All workers share the one dataset, as with torch::data.
template <typename Dataset>
requires(Dataset::is_stateful)
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
