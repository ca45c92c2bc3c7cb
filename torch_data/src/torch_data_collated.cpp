// The drop-in's collated path, non-template parts: the fields learnt from a sample, tensors
// written into slot rows, the torch sampler's kept (and checkpointed) order, and CollatedEngine
// over the engine (whose probe reads the sample: loader/src/field_probe.cpp).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include "checkpoint.h"
#include "conveyor/torch_data.h"
#include "engine.h"
#include "errors.h"
#include "options.h"
#include "torch_data_engine.h"

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

std::vector<FieldSpec> ProbedSource::learn_fields(size_t index) {
  std::vector<FieldSpec> fields = read_fields(index);
  specs_ = fields;
  probed_index_ = index;
  return fields;
}

// ---------------------------------------------------------------------------------------------
// DrawnOrderSampler

void DrawnOrderSampler::indices(size_t, uint64_t epoch, std::vector<size_t>& out) const {
  if (cached_epoch_ != epoch) {
    std::vector<size_t> drawn;
    draw(drawn);
    cached_.swap(drawn);
    cached_epoch_ = epoch;
  }
  out = cached_;
}

void DrawnOrderSampler::save(LoaderState& state) const {
  state.set_string("sampler", "torch");
  state.set_int("sampler_order_epoch",
                cached_epoch_ ? static_cast<int64_t>(*cached_epoch_) : int64_t{-1});
  state.set_list("sampler_order", std::vector<int64_t>(cached_.begin(), cached_.end()));
}

void DrawnOrderSampler::check(const LoaderState& state) const {
  const SavedOrder order = read(state);
  const CheckpointPosition saved = read_position(state, dataset_size_);  // the engine's reader
  if (saved.base != 0 || saved.world != 1) {
    throw std::invalid_argument("conveyor: the checkpoint's position (order base " +
                                std::to_string(saved.base) + ", world size " +
                                std::to_string(saved.world) +
                                ") is not one a loader over a torch dataset saves");
  }
  if (!saved.complete && saved.received > 0 && order.epoch != saved.epoch) {
    throw std::invalid_argument("conveyor: the checkpoint's 'sampler_order_epoch' is " +
                                (order.epoch ? std::to_string(*order.epoch) : std::string("-1")) +
                                " but its epoch " + std::to_string(saved.epoch) +
                                " is under way: the order of that epoch is missing");
  }
}

DrawnOrderSampler::SavedOrder DrawnOrderSampler::read(const LoaderState& state) const {
  expect_same("sampler", read_string(state, "sampler"), "torch");
  const int64_t epoch =
      read_int_in(state, "sampler_order_epoch", -1, std::numeric_limits<int64_t>::max());
  const std::vector<int64_t>& order = read_list(state, "sampler_order");
  SavedOrder saved;
  if (epoch < 0) return saved;  // nothing was drawn
  saved.epoch = static_cast<uint64_t>(epoch);
  saved.order.reserve(order.size());
  for (const int64_t index : order) {
    if (index < 0 || static_cast<uint64_t>(index) >= dataset_size_) {
      throw std::invalid_argument("conveyor: the checkpoint's 'sampler_order' holds index " +
                                  std::to_string(index) + " but the dataset has " +
                                  std::to_string(dataset_size_) + " samples");
    }
    saved.order.push_back(static_cast<size_t>(index));
  }
  return saved;
}

void DrawnOrderSampler::restore(SavedOrder saved) {
  cached_epoch_ = saved.epoch;
  cached_.swap(saved.order);
}

// ---------------------------------------------------------------------------------------------

CollatedEngine::CollatedEngine(std::shared_ptr<ProbedSource> source,
                               std::unique_ptr<DrawnOrderSampler> sampler,
                               const DataLoaderOptions& options)
    : drawn_(sampler.get()) {
  if (!sampler) throw std::invalid_argument("conveyor: make_data_loader needs a sampler");
  engine_ = std::make_unique<TorchConventionEngine>(std::move(source), std::move(sampler),
                                                    resolve_drop_in(options), "collated");
}

CollatedEngine::~CollatedEngine() = default;

void CollatedEngine::start_epoch() { engine_->start_epoch(); }
std::optional<Batch> CollatedEngine::next() { return engine_->next(); }
void CollatedEngine::save(torch::serialize::OutputArchive& archive) const {
  engine_->save(archive);
}

void CollatedEngine::load(torch::serialize::InputArchive& archive) {
  const LoaderState state = read_archive(archive);
  engine_->load_state(state);            // reads and checks everything (the order too) first
  drawn_->restore(drawn_->read(state));  // checked by the engine's load
}

void CollatedEngine::join() { engine_->join(); }
LoaderStats CollatedEngine::stats() const { return engine_->stats(); }
std::string CollatedEngine::mode() const { return engine_->mode(); }
size_t CollatedEngine::max_jobs() const { return engine_->max_jobs(); }

}  // namespace conveyor::detail
