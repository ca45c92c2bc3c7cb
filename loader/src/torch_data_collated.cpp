// The drop-in's collated path, non-template parts: tensors written into slot rows, and
// CollatedEngine's shape probe (a background thread, waited for at most `timeout`).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>

#include "conveyor/detail/torch_data_engine.h"
#include "conveyor/torch_data.h"
#include "errors.h"
#include "options.h"

namespace conveyor::detail {

namespace {

std::string describe_tensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return "an undefined tensor";
  std::ostringstream out;
  out << c10::toString(tensor.scalar_type()) << " " << tensor.sizes() << " on " << tensor.device();
  return out.str();
}

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

void write_tensor(const at::Tensor& tensor, const FieldSpec& spec, size_t index,
                  size_t probed_index, std::byte* out) {
  if (!tensor.defined() || !tensor.device().is_cpu() || tensor.scalar_type() != spec.dtype ||
      tensor.sizes() != c10::IntArrayRef(spec.sample_shape)) {
    throw std::runtime_error("conveyor: sample " + std::to_string(index) + " has " + spec.name +
                             " " + describe_tensor(tensor) + " but sample " +
                             std::to_string(probed_index) + " had " + describe_spec(spec) +
                             "; the collated path needs every sample's tensors to have the same "
                             "shape and dtype");
  }
  const at::Tensor contiguous = tensor.contiguous();  // no copy when it already is
  std::memcpy(out, contiguous.data_ptr(), spec.sample_bytes());
}

void ProbedSource::set_fields(std::vector<FieldSpec> fields, size_t index) {
  specs_ = std::move(fields);
  probed_index_ = index;
}

std::vector<FieldSpec> ProbedSource::fields() const {
  if (specs_.empty()) {
    throw std::logic_error(
        "conveyor: internal error: a torch dataset's fields were used before "
        "the probe learnt them");
  }
  return specs_;
}

// ---------------------------------------------------------------------------------------------

CollatedEngine::CollatedEngine(std::shared_ptr<ProbedSource> source,
                               std::unique_ptr<Sampler> sampler, const DataLoaderOptions& options)
    : source_(std::move(source)), sampler_(std::move(sampler)), options_(options) {
  check_options(options_);
  if (!source_) throw std::invalid_argument("conveyor: make_data_loader needs a dataset");
}

CollatedEngine::~CollatedEngine() = default;

void CollatedEngine::start_epoch() {
  if (joined_) throw_joined();
  if (engine_) {
    engine_->start_epoch();
    return;
  }
  // The engine's epoch numbering: 0, then one more per start_epoch(). A sampler that throws
  // leaves the current epoch as it was.
  const uint64_t epoch = started_ ? epoch_ + 1 : 0;
  std::vector<size_t> order;
  sampler_->indices(source_->size(), epoch, order);
  epoch_ = epoch;
  started_ = true;
  order_.swap(order);
  const size_t b = options_.batch_size();
  batches_ = options_.drop_last() ? order_.size() / b : (order_.size() + b - 1) / b;
  next_batch_ = 0;
  reported_.clear();
  // A probe still reading a replaced epoch's sample goes on: any sample tells the shapes.
  if (!probe_.valid() && batches_ > 0) start_probe();
}

void CollatedEngine::start_probe() {
  // The first sample of batch next_batch_; with kSkip, the following ones too, as substitutes.
  const size_t b = options_.batch_size();
  const size_t first = next_batch_ * b;
  const size_t end = std::min(order_.size(), batches_ * b);
  const size_t tries = options_.on_error() == ErrorPolicy::kSkip
                           ? std::min(end - first, 1 + LoaderOptions().max_substitutes)
                           : 1;
  std::vector<size_t> candidates(order_.begin() + static_cast<std::ptrdiff_t>(first),
                                 order_.begin() + static_cast<std::ptrdiff_t>(first + tries));
  for (size_t index : candidates) {
    if (index >= source_->size()) {
      throw std::out_of_range("conveyor: the sampler yielded index " + std::to_string(index) +
                              " but the dataset has " + std::to_string(source_->size()) +
                              " samples");
    }
  }
  probe_epoch_ = epoch_;
  probe_batch_ = next_batch_;
  probe_index_ = candidates.front();
  ProbeOutcome outcome;
  outcome.epoch = epoch_;
  outcome.batch = next_batch_;
  // The task owns everything it touches (its copy of the dataset, the candidates), so it never
  // depends on this object; probe_'s destructor waits for it.
  probe_ = std::async(std::launch::async, [read = source_->field_reader(),
                                           candidates = std::move(candidates), outcome]() mutable {
    for (size_t k = 0; k < candidates.size(); ++k) {
      try {
        outcome.fields = read(candidates[k]);
        outcome.index = candidates[k];
        return outcome;
      } catch (...) {
        if (!outcome.error) {
          outcome.error = std::current_exception();
          outcome.index = candidates[k];
        }
      }
    }
    return outcome;
  });
}

bool CollatedEngine::build_engine() {
  const auto timeout = options_.timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(std::chrono::hours(0));
  for (;;) {
    if (!probe_.valid()) {
      if (next_batch_ >= batches_) return false;  // every batch of this epoch failed, reported
      start_probe();
    }
    if (timeout && probe_.wait_until(deadline) != std::future_status::ready) throw_probe_timeout();
    ProbeOutcome outcome = probe_.get();  // probe_ is no longer valid
    if (outcome.fields.empty()) {
      if (outcome.epoch != epoch_) continue;  // a replaced epoch's failure: probe this one
      next_batch_ = outcome.batch + 1;
      reported_.push_back(outcome.index);
      throw_probe_failure(outcome);
    }
    source_->set_fields(std::move(outcome.fields), outcome.index);
    engine_ =
        std::make_unique<TorchConventionEngine>(source_, std::move(sampler_), options_, "collated");
    engine_->start_epoch(epoch_, std::move(reported_));
    return true;
  }
}

void CollatedEngine::throw_probe_timeout() const {
  const std::string ms = std::to_string(options_.timeout() ? options_.timeout()->count() : 0);
  throw_torch_timeout(
      options_.timeout(),
      "conveyor: sample " + std::to_string(probe_index_) + " (" + source_->describe(probe_index_) +
          "), the first of batch " + std::to_string(probe_batch_) + " of epoch " +
          std::to_string(probe_epoch_) +
          ", read to learn the shapes of the batch's tensors, did not load within " + ms + " ms");
}

void CollatedEngine::throw_probe_failure(const ProbeOutcome& outcome) const {
  // torch::data: with workers the dataset's exception arrives wrapped, without it as it is.
  if (options_.workers() == 0) std::rethrow_exception(outcome.error);
  const std::string sample = source_->describe(outcome.index);
  throw WorkerError(outcome.error, outcome.index, sample,
                    "conveyor: sample " + std::to_string(outcome.index) + " (" + sample +
                        ") failed in batch " + std::to_string(outcome.batch) + " of epoch " +
                        std::to_string(outcome.epoch) + ": " + exception_message(outcome.error));
}

std::optional<Batch> CollatedEngine::next() {
  if (joined_) throw_joined();
  if (!engine_) {
    if (!started_) start_epoch();
    if (!build_engine()) return std::nullopt;
  }
  return engine_->next();
}

void CollatedEngine::join() {
  joined_ = true;
  if (engine_) engine_->join();
}

LoaderStats CollatedEngine::stats() const { return engine_ ? engine_->stats() : LoaderStats{}; }

std::string CollatedEngine::mode() const {
  if (engine_) return engine_->mode();
  return "collated: not started (the engine starts on the first batch, once a background thread "
         "has read one sample to learn the shapes of the batch's tensors)";
}

}  // namespace conveyor::detail
