#include "conveyor/torch_data.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include <ATen/ATen.h>

namespace conveyor {

WorkerError::WorkerError(std::exception_ptr original, size_t index, std::string sample,
                         const std::string& context)
    : torch::data::WorkerException(std::move(original)), index_(index), sample_(std::move(sample)) {
  // `context` is a whole Conveyor message ("conveyor: ..."): a SampleError's, or the caller's.
  message += " (" + context + ")";
}

namespace detail {

void check_options(const DataLoaderOptions& options) {
  if (options.batch_size() == 0) {
    throw std::invalid_argument("conveyor: DataLoaderOptions batch_size must be at least 1");
  }
  const c10::Device device = options.device();
  if (device.is_cuda() && !cuda_available()) {
    throw std::invalid_argument("conveyor: DataLoaderOptions device " + device.str() +
                                " was requested but no CUDA device is usable here");
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    throw std::invalid_argument("conveyor: DataLoaderOptions device " + device.str() +
                                " is not supported (cpu or cuda)");
  }
  if (options.max_jobs() && *options.max_jobs() == 0) {
    throw std::invalid_argument("conveyor: DataLoaderOptions max_jobs must be at least 1");
  }
}

LoaderOptions to_loader_options(const DataLoaderOptions& options) {
  LoaderOptions o;
  o.batch_size = options.batch_size();
  o.workers = std::max<size_t>(1, options.workers());
  o.drop_last = options.drop_last();
  o.enforce_ordering = options.enforce_ordering();
  o.timeout = options.timeout();
  o.seed = options.seed();
  o.on_error = options.on_error();
  o.device = options.device();
  o.pin_memory = options.pin_memory();
  o.prefetch_factor = std::max<size_t>(1, options.prefetch_factor());
  if (options.max_jobs()) {
    o.slots =
        std::max<size_t>(2, *options.max_jobs()) + (o.device.is_cuda() ? o.prefetch_factor : 0);
  }
  return o;
}

torch::data::DataLoaderOptions to_torch_options(const DataLoaderOptions& options) {
  torch::data::DataLoaderOptions o(options.batch_size());
  o.workers(options.workers())
      .max_jobs(options.max_jobs())
      .timeout(options.timeout())
      .enforce_ordering(options.enforce_ordering())
      .drop_last(options.drop_last());
  return o;
}

std::string describe_tensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  std::ostringstream out;
  out << c10::toString(tensor.scalar_type()) << " " << tensor.sizes() << " on " << tensor.device();
  return out.str();
}

namespace {

std::string describe_spec(const FieldSpec& spec) {
  std::ostringstream out;
  out << c10::toString(spec.dtype) << " " << c10::IntArrayRef(spec.sample_shape) << " on cpu";
  return out.str();
}

}  // namespace

FieldSpec probe_field(const at::Tensor& tensor, const char* name, size_t index) {
  if (!tensor.defined() || !tensor.device().is_cpu()) {
    throw std::runtime_error("conveyor: sample " + std::to_string(index) + " has " + name + " " +
                             describe_tensor(tensor) +
                             "; the collated path needs CPU tensors from the dataset");
  }
  FieldSpec spec;
  spec.name = name;
  spec.dtype = tensor.scalar_type();
  spec.sample_shape = tensor.sizes().vec();
  return spec;
}

void write_tensor(const at::Tensor& tensor, const FieldSpec& spec, size_t index, std::byte* out) {
  if (!tensor.defined() || !tensor.device().is_cpu() || tensor.scalar_type() != spec.dtype ||
      tensor.sizes() != c10::IntArrayRef(spec.sample_shape)) {
    throw std::runtime_error("conveyor: sample " + std::to_string(index) + " has " + spec.name +
                             " " + describe_tensor(tensor) + " but sample 0 had " +
                             describe_spec(spec) +
                             "; the collated path needs every sample's tensors to have the same "
                             "shape and dtype");
  }
  const at::Tensor contiguous = tensor.contiguous();  // no copy when it already is
  std::memcpy(out, contiguous.data_ptr(), spec.sample_bytes());
}

void pin_tensor(at::Tensor& tensor) {
  if (tensor.defined() && tensor.device().is_cpu() && cuda_available() && !tensor.is_pinned()) {
    tensor = tensor.pin_memory();
  }
}

// ---------------------------------------------------------------------------------------------

CollatedEngine::CollatedEngine(std::shared_ptr<SampleSource> source,
                               std::unique_ptr<Sampler> sampler, const DataLoaderOptions& options)
    : source_(std::move(source)), sampler_(std::move(sampler)), options_(options) {
  check_options(options_);
  if (!source_) throw std::invalid_argument("conveyor: make_data_loader needs a dataset");
}

CollatedEngine::~CollatedEngine() = default;

void CollatedEngine::start_epoch() {
  if (joined_) throw std::logic_error("conveyor: the DataLoader was joined; it yields no batches");
  if (engine_) {
    engine_->start_epoch();
  } else {
    start_pending_ = true;
  }
}

void CollatedEngine::rethrow_as_torch(std::exception_ptr error) const {
  try {
    std::rethrow_exception(error);
  } catch (const SampleError& e) {
    // torch::data: with workers the dataset's exception arrives wrapped, without it as it is.
    if (options_.workers() == 0) e.rethrow_original();
    throw WorkerError(e.original(), e.index(), e.path(), e.what());
  } catch (const TimeoutError& e) {
    TORCH_CHECK(false, "Timeout in DataLoader queue while waiting for next batch (timeout was ",
                options_.timeout() ? options_.timeout()->count() : 0, " ms); ", e.what());
  }
}

std::optional<Batch> CollatedEngine::next() {
  if (joined_) throw std::logic_error("conveyor: the DataLoader was joined; it yields no batches");
  if (source_->size() == 0) return std::nullopt;
  if (!engine_) {
    try {
      (void)source_->fields();  // reads sample 0 of a torch dataset; the source keeps the result
    } catch (...) {
      if (options_.workers() == 0) throw;
      throw WorkerError(std::current_exception(), 0, source_->describe(0),
                        "conveyor: sample 0, read to learn the shapes of the batch's tensors");
    }
    engine_ =
        std::make_unique<DataLoader>(source_, to_loader_options(options_), std::move(sampler_));
  }
  if (start_pending_) {
    start_pending_ = false;
    engine_->start_epoch();
  }
  try {
    return engine_->next();
  } catch (const SampleError&) {
    rethrow_as_torch(std::current_exception());
  } catch (const TimeoutError&) {
    rethrow_as_torch(std::current_exception());
  }
}

void CollatedEngine::join() {
  joined_ = true;
  if (engine_) engine_->join();
}

LoaderStats CollatedEngine::stats() const { return engine_ ? engine_->stats() : LoaderStats{}; }

std::string CollatedEngine::mode() const {
  return "collated: " + (engine_ ? engine_->mode()
                                 : std::string("not started (the engine starts on the first "
                                               "batch)"));
}

SourceDataLoader::SourceDataLoader(std::shared_ptr<SampleSource> source,
                                   std::unique_ptr<Sampler> sampler,
                                   const DataLoaderOptions& options)
    : TorchDataLoader<Batch>(options),
      engine_(std::move(source), sampler ? std::move(sampler) : RandomSampler::make(options.seed()),
              options) {}

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
