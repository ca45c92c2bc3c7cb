// The drop-in's non-template parts: WorkerError, options, the engine behind torch's conventions,
// and the SampleSource loaders. The collated path's probe is in torch_data_collated.cpp.
#include "conveyor/torch_data.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "engine.h"
#include "errors.h"
#include "options.h"
#include "torch_data_engine.h"

namespace conveyor {

WorkerError::WorkerError(std::exception_ptr original, size_t index, std::string sample,
                         const std::string& context)
    : torch::data::WorkerException(std::move(original)), index_(index), sample_(std::move(sample)) {
  // `context` is a whole Conveyor message ("conveyor: ..."): a SampleError's, or the caller's.
  message += " (" + context + ")";
}

namespace detail {

DropInOptions resolve_drop_in(const DataLoaderOptions& options) {
  if (options.max_jobs() && *options.max_jobs() == 0) {
    throw std::invalid_argument("conveyor: DataLoaderOptions max_jobs must be at least 1");
  }
  LoaderOptions o;
  o.batch_size = options.batch_size();
  o.workers = std::max<size_t>(1, options.workers());
  o.drop_last = options.drop_last();
  o.enforce_ordering = options.enforce_ordering();
  o.timeout = options.timeout();
  o.seed = options.seed();
  o.on_error = options.on_error();
  o.max_substitutes = options.max_substitutes();
  o.device = options.device();
  o.pin_memory = options.pin_memory();
  o.prefetch_factor = options.prefetch_factor();
  DropInOptions resolved{options, resolve_options(o, /*check_device=*/false)};  // names the option
  o.device = resolve_device(o.device);  // the one CUDA query
  resolved.engine.device = o.device;
  if (options.max_jobs()) {  // the slots depend on the device: resolve them again, without it
    const size_t prefetched = o.device.is_cuda() ? resolved.engine.prefetch_factor : 0;
    o.slots = *options.max_jobs() + prefetched;
    resolved.engine = resolve_options(o, /*check_device=*/false);
  }
  return resolved;
}

size_t DropInOptions::max_jobs() const {
  return engine.slots - (engine.device.is_cuda() ? engine.prefetch_factor : 0);
}

void check_options(const DataLoaderOptions& options) { (void)resolve_drop_in(options); }

torch::data::DataLoaderOptions to_torch_options(const DataLoaderOptions& options) {
  torch::data::DataLoaderOptions o(options.batch_size());
  o.workers(options.workers())
      .max_jobs(options.max_jobs())
      .timeout(options.timeout())
      .enforce_ordering(options.enforce_ordering())
      .drop_last(options.drop_last());
  return o;
}

void refuse_batched_checkpoint(const char* method) {
  throw std::logic_error(
      std::string("conveyor: ") + method +
      "(): this loader runs on torch::data's own workers and samplers (the batched path: a "
      "dataset with its own get_batch, a stateful dataset, or one not mapped with Stack<>()), "
      "which own the order, so it cannot save or resume its position; for checkpoints, map a "
      "per-sample dataset with Stack<>() (the collated path) or use a conveyor::SampleSource");
}

void pin_tensor(at::Tensor& tensor) {
  if (tensor.defined() && tensor.device().is_cpu() && cuda_available() && !tensor.is_pinned()) {
    tensor = tensor.pin_memory();
  }
}

// ---------------------------------------------------------------------------------------------

TorchConventionEngine::TorchConventionEngine(std::shared_ptr<SampleSource> source,
                                             std::unique_ptr<Sampler> sampler,
                                             const DropInOptions& options, std::string path)
    : options_(options.user),
      path_(std::move(path)),
      max_jobs_(options.max_jobs()),
      loader_(std::make_unique<DataLoader::Impl>(
          source ? std::move(source)
                 : throw std::invalid_argument("conveyor: make_data_loader needs a dataset"),
          options.engine, std::move(sampler), nullptr)) {}

void TorchConventionEngine::start_epoch() {
  if (joined_) throw_joined();
  loader_.start_epoch();
}

std::optional<Batch> TorchConventionEngine::next() {
  if (joined_) throw_joined();
  try {
    return loader_.next();
  } catch (const SampleError& e) {
    // torch::data: with workers the dataset's exception arrives wrapped, without it as it is.
    if (options_.workers() == 0) e.rethrow_original();
    throw WorkerError(e.original(), e.index(), e.path(), e.what());
  } catch (const TimeoutError& e) {
    throw_torch_timeout(options_.timeout(), e.what());
  }
}

void TorchConventionEngine::save(torch::serialize::OutputArchive& archive) const {
  loader_.save(archive);
}

void TorchConventionEngine::load(torch::serialize::InputArchive& archive) {
  if (joined_) throw_joined();
  loader_.load(archive);
}

void TorchConventionEngine::load_state(const LoaderState& state) {
  if (joined_) throw_joined();
  loader_.load_state(state);
}

void TorchConventionEngine::join() {
  joined_ = true;
  loader_.join();
}

LoaderStats TorchConventionEngine::stats() const { return loader_.stats(); }

std::string TorchConventionEngine::mode() const { return path_ + ": " + loader_.mode(); }

namespace {

// conveyor::Batch straight from a SampleSource (ImageSource's fused decode pipeline): its fields
// are known without reading a sample, so the engine is built at once.
class SourceDataLoader final : public EngineDataLoader<Batch, TorchConventionEngine> {
 public:
  SourceDataLoader(std::shared_ptr<SampleSource> source, std::unique_ptr<Sampler> sampler,
                   const DataLoaderOptions& options)
      : EngineDataLoader<Batch, TorchConventionEngine>(
            options, std::move(source),
            sampler ? std::move(sampler) : RandomSampler::make(options.seed()),
            resolve_drop_in(options), "source") {}

 protected:
  std::optional<Batch> next_batch() override { return engine_.next(); }
};

}  // namespace
}  // namespace detail

std::unique_ptr<TorchDataLoader<Batch>> make_data_loader(std::shared_ptr<SampleSource> source,
                                                         std::unique_ptr<Sampler> sampler,
                                                         DataLoaderOptions options) {
  return std::make_unique<detail::SourceDataLoader>(std::move(source), std::move(sampler), options);
}

std::unique_ptr<TorchDataLoader<Batch>> make_data_loader(std::shared_ptr<SampleSource> source,
                                                         DataLoaderOptions options) {
  return make_data_loader(std::move(source), nullptr, std::move(options));
}

}  // namespace conveyor
