// conveyor/detail/torch_data_collated.h: the drop-in's collated path (detail; included by
// conveyor/torch_data.h after its public types, never directly).
//
// What it is for: a per-sample torch dataset mapped with Stack<>() runs on conveyor::DataLoader:
// each worker calls get() on its own copy of the dataset and copies the sample's tensors into its
// row of a batch slot, so the collate writes straight into (pinned) slot memory.
//
// Requires: the dataset is copyable and its copies usable concurrently; every sample's tensors
// are CPU tensors with the shapes and dtypes of the sample the probe read.
// Guarantees: the shapes are learnt by the engine, on a background thread it owns
// (SampleSource::learns_fields), waited for at most `timeout`; a failure there is reported as the
// failure of that sample, in its batch and epoch, as a worker's would be, and the engine passes
// that batch over. Epochs,
// positions and checkpoints are the engine's (conveyor::DataLoader's) alone; a checkpoint carries
// the torch sampler's order of the current epoch whole (DrawnOrderSampler).
// Thread safety: CollatedDataLoader is used by one consumer thread; TorchExampleSource's
// write_sample is called by the workers, each on its own copy of the dataset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/data.h>

namespace conveyor {
namespace detail {

namespace td = torch::data;

// --- Which datasets the collated path can take.

// A Dataset<D, E> whose get_batch is torch's default (get() per index).
template <typename D, typename = void>
struct IsPlainExampleDataset : std::false_type {};
template <typename D>
struct IsPlainExampleDataset<D, std::void_t<typename D::ExampleType, decltype(&D::get_batch)>>
    : std::conjunction<std::is_base_of<td::datasets::Dataset<D, typename D::ExampleType>, D>,
                       std::is_same<decltype(&D::get_batch),
                                    std::vector<typename D::ExampleType> (
                                        td::datasets::Dataset<D, typename D::ExampleType>::*)(
                                        c10::ArrayRef<size_t>)>> {};

// An example-level Transform<In, Out> whose apply_batch is torch's default (apply() per example).
template <typename T, typename In, typename = void>
struct IsExampleTransform : std::false_type {};
template <typename T, typename In>
struct IsExampleTransform<
    T, In, std::void_t<typename T::InputType, typename T::OutputType, decltype(&T::apply_batch)>>
    : std::conjunction<std::is_same<typename T::InputType, In>,
                       std::is_base_of<td::transforms::Transform<In, typename T::OutputType>, T>,
                       std::is_same<decltype(&T::apply_batch),
                                    std::vector<typename T::OutputType> (
                                        td::transforms::Transform<In, typename T::OutputType>::*)(
                                        std::vector<In>)>> {};

// PerSample<D>::get(d, i): sample i of a per-sample dataset, through its example transforms.
template <typename D, typename = void>
struct PerSample {
  static constexpr bool value = false;
};
template <typename D>
struct PerSample<D, std::enable_if_t<IsPlainExampleDataset<D>::value>> {
  static constexpr bool value = true;
  using Example = typename D::ExampleType;
  static Example get(D& dataset, size_t index) { return dataset.get(index); }
};
template <typename S, typename T>
struct PerSample<td::datasets::MapDataset<S, T>,
                 std::enable_if_t<IsExampleTransform<T, typename PerSample<S>::Example>::value>> {
  static constexpr bool value = true;
  using Example = typename T::OutputType;
  static Example get(td::datasets::MapDataset<S, T>& dataset, size_t index) {
    // MapDataset exposes its parts as const; this copy belongs to the calling thread.
    auto& inner = const_cast<S&>(dataset.dataset());
    auto& transform = const_cast<T&>(dataset.transform());
    return transform.apply(PerSample<S>::get(inner, index));
  }
};

// Collated<D>: D is a per-sample dataset mapped with Stack<Example<>> or Stack<TensorExample>.
template <typename D, typename = void>
struct Collated {
  static constexpr bool value = false;
};
template <typename S, typename E>
struct Collated<
    td::datasets::MapDataset<S, td::transforms::Stack<E>>,
    std::enable_if_t<std::is_same_v<typename PerSample<S>::Example, E> &&
                     (std::is_same_v<E, td::Example<>> || std::is_same_v<E, td::TensorExample>)>> {
  static constexpr bool value = true;
  static constexpr bool has_target = std::is_same_v<E, td::Example<>>;
  using Inner = S;
};

// --- The dataset and the sampler as Conveyor sees them.

// The spec of field `name` from `tensor`, a field of sample `index`; throws unless a CPU tensor.
FieldSpec probe_field(const at::Tensor& tensor, const char* name, size_t index);
// Checks `tensor` (field of sample `index`) against `spec`, learnt from sample `probed_index`,
// throwing with both indices when it differs, and copies its bytes to `out`.
void write_tensor(const at::Tensor& tensor, const FieldSpec& spec, size_t index,
                  size_t probed_index, std::byte* out);

// A SampleSource whose fields are learnt by reading one of its samples (a torch dataset): the
// engine calls learn_fields() on its probe thread (SampleSource::learns_fields).
class ProbedSource : public SampleSource {
 public:
  bool learns_fields() const final { return true; }
  // read_fields(index), kept: fields() from then on, and the sample named when another differs.
  std::vector<FieldSpec> learn_fields(size_t index) final;
  // Empty until learn_fields() returned.
  std::vector<FieldSpec> fields() const override { return specs_; }

 protected:
  // The field specs of sample `index`, or what the dataset threw. Runs on the engine's probe
  // thread, never with prepare() or write_sample().
  virtual std::vector<FieldSpec> read_fields(size_t index) = 0;
  const std::vector<FieldSpec>& specs() const { return specs_; }
  size_t probed_index() const { return probed_index_; }

 private:
  std::vector<FieldSpec> specs_;
  size_t probed_index_ = 0;
};

// A per-sample torch dataset seen as a SampleSource: one copy of the dataset per worker.
template <typename D>
class TorchExampleSource final : public ProbedSource {
  using Traits = Collated<D>;
  using Inner = typename Traits::Inner;

 public:
  TorchExampleSource(D dataset, size_t size) : prototype_(std::move(dataset)), size_(size) {}
  size_t size() const override { return size_; }
  void prepare(size_t workers) override {
    copies_.clear();
    copies_.reserve(workers);
    for (size_t w = 0; w < workers; ++w) copies_.push_back(prototype_);
  }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    auto example = PerSample<Inner>::get(inner(copies_[ctx.worker]), ctx.index);
    write_tensor(example.data, specs()[0], ctx.index, probed_index(), fields[0]);
    if constexpr (Traits::has_target) {
      write_tensor(example.target, specs()[1], ctx.index, probed_index(), fields[1]);
    }
  }
  std::string describe(size_t index) const override {
    return "index " + std::to_string(index) + " of the torch dataset";
  }

 protected:
  std::vector<FieldSpec> read_fields(size_t index) override {
    D dataset = prototype_;  // the probe's own copy: the workers' copies start from prototype_
    auto example = PerSample<Inner>::get(inner(dataset), index);
    std::vector<FieldSpec> specs{probe_field(example.data, "data", index)};
    if constexpr (Traits::has_target) {
      specs.push_back(probe_field(example.target, "target", index));
    }
    return specs;
  }

 private:
  static Inner& inner(D& dataset) { return const_cast<Inner&>(dataset.dataset()); }
  D prototype_;
  size_t size_;
  std::vector<D> copies_;
};

// The non-template part of TorchSamplerAdapter: a sampler whose order is drawn (draw()), not
// computed from the epoch, so each epoch's order is kept once drawn (the shape probe and the
// engine see the same one) and a checkpoint carries it whole. Called by the consumer thread only.
class DrawnOrderSampler : public Sampler {
 public:
  // An order read from a checkpoint: the epoch it belongs to (none when nothing was drawn).
  struct SavedOrder {
    std::optional<uint64_t> epoch;
    std::vector<size_t> order;
  };
  explicit DrawnOrderSampler(size_t dataset_size) : dataset_size_(dataset_size) {}
  // The kept order when `epoch` is the last epoch drawn (or restored), else a new draw().
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const final;
  // Writes "sampler" ("torch"), "sampler_order_epoch" (-1 when nothing was drawn) and
  // "sampler_order" (that epoch's whole order, a list; an int64 tensor in an archive).
  void save(LoaderState& state) const override;
  // Throws std::invalid_argument naming the field unless read() accepts the state and its
  // position (DataLoader::state's) is one this order serves: one process's, and, mid-epoch, in
  // the epoch whose order it holds.
  void check(const LoaderState& state) const override;
  // The order in `state`, checked (every index below the dataset's size).
  SavedOrder read(const LoaderState& state) const;
  // Serves `saved.order` for `saved.epoch` from now on, instead of drawing that epoch again;
  // later epochs are drawn as usual.
  void restore(SavedOrder saved);

 protected:
  // A new order from the wrapped sampler (its next epoch).
  virtual void draw(std::vector<size_t>& out) const = 0;

 private:
  size_t dataset_size_;
  mutable std::optional<uint64_t> cached_epoch_;
  mutable std::vector<size_t> cached_;
};

// A torch sampler as a conveyor::Sampler: each epoch, reset() and then next(batch_size) until it
// is exhausted, as torch's loader does. reset() draws from torch's global generator
// (RandomSampler), so an order is not a function of the epoch: a resumed epoch's order comes from
// the checkpoint, and later epochs from the sampler, as with torch::data.
template <typename S>
class TorchSamplerAdapter final : public DrawnOrderSampler {
 public:
  TorchSamplerAdapter(S sampler, size_t batch_size, size_t dataset_size)
      : DrawnOrderSampler(dataset_size), sampler_(std::move(sampler)), batch_size_(batch_size) {}

 protected:
  void draw(std::vector<size_t>& out) const override {
    out.clear();
    sampler_.reset(std::nullopt);
    while (auto request = sampler_.next(batch_size_)) {
      if (request->empty()) break;
      out.insert(out.end(), request->begin(), request->end());
    }
  }

 private:
  mutable S sampler_;
  size_t batch_size_;
};

// --- The engine and the loader.

class TorchConventionEngine;  // torch_data/src/torch_data_engine.h (not installed)

// The collated path's engine, type-erased: conveyor::DataLoader's engine behind
// TorchConventionEngine, whose epochs, order, checkpoints and probe (the engine learns the
// tensors' shapes from the first sample it waits for: ProbedSource) it is. load() restores the
// torch sampler's drawn order too.
class CollatedEngine {
 public:
  CollatedEngine(std::shared_ptr<ProbedSource> source, std::unique_ptr<DrawnOrderSampler> sampler,
                 const DataLoaderOptions& options);
  ~CollatedEngine();
  CollatedEngine(const CollatedEngine&) = delete;
  CollatedEngine& operator=(const CollatedEngine&) = delete;
  void start_epoch();
  std::optional<Batch> next();
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  void join();
  LoaderStats stats() const;
  std::string mode() const;
  size_t max_jobs() const;  // FullDataLoaderOptions::max_jobs

 private:
  DrawnOrderSampler* drawn_;  // the sampler, which the engine owns
  std::unique_ptr<TorchConventionEngine> engine_;
};

// A TorchDataLoader on Conveyor's engine: what the collated path (CollatedEngine) and
// SampleSources (TorchConventionEngine, torch_data.cpp) forward to their engine, written once.
// `Engine` has start_epoch, join, stats, mode, save, load and max_jobs; the subclass turns the
// engine's next() into its BatchT.
template <typename BatchT, typename Engine>
class EngineDataLoader : public TorchDataLoader<BatchT> {
 public:
  void join() override { engine_.join(); }
  LoaderStats stats() const override { return engine_.stats(); }
  std::string mode() const override { return engine_.mode(); }
  void save(torch::serialize::OutputArchive& archive) const override { engine_.save(archive); }
  void load(torch::serialize::InputArchive& archive) override {
    engine_.load(archive);
    this->replaced_by_load();
  }

 protected:
  template <typename... EngineArgs>
  explicit EngineDataLoader(const DataLoaderOptions& options, EngineArgs&&... engine_args)
      : TorchDataLoader<BatchT>(options), engine_(std::forward<EngineArgs>(engine_args)...) {
    this->report_max_jobs(engine_.max_jobs());
  }
  void start_epoch() override { engine_.start_epoch(); }

  Engine engine_;
};

template <typename D>
class CollatedDataLoader final : public EngineDataLoader<typename D::BatchType, CollatedEngine> {
  using BatchT = typename D::BatchType;

 public:
  template <typename S>
  CollatedDataLoader(D dataset, size_t size, S sampler, const DataLoaderOptions& options)
      : EngineDataLoader<BatchT, CollatedEngine>(
            options, std::make_shared<TorchExampleSource<D>>(std::move(dataset), size),
            std::make_unique<TorchSamplerAdapter<S>>(std::move(sampler), options.batch_size(),
                                                     size),
            options) {}

 protected:
  std::optional<BatchT> next_batch() override {
    std::optional<Batch> batch = this->engine_.next();
    if (!batch) return std::nullopt;
    if constexpr (Collated<D>::has_target) {
      return BatchT(std::move(batch->fields[0]), std::move(batch->fields[1]));
    } else {
      return BatchT(std::move(batch->fields[0]));
    }
  }
};

}  // namespace detail
}  // namespace conveyor
