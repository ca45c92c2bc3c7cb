// Checkpoints: DataLoader::state/load_state (the engine's Position as a LoaderState), the field
// readers the samplers use, and the torch archive that carries a state (DataLoader::save/load).
#include "checkpoint.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <variant>

#include "conveyor/internal/printable.h"
#include "engine.h"

namespace conveyor {
namespace detail {

namespace {

const LoaderState::Value& read_value(const LoaderState& state, const std::string& key) {
  const LoaderState::Value* value = state.find(key);
  if (value == nullptr) {
    throw std::invalid_argument("conveyor: the checkpoint has no '" + key +
                                "'; it was not written by DataLoader::state() or save()");
  }
  return *value;
}

template <typename T>
const T& read_as(const LoaderState& state, const std::string& key, const char* kind) {
  const T* value = std::get_if<T>(&read_value(state, key));
  if (value == nullptr) {
    throw std::invalid_argument("conveyor: the checkpoint's '" + key + "' is not " + kind);
  }
  return *value;
}

std::invalid_argument out_of_range(const std::string& key, int64_t value,
                                   const std::string& meaning) {
  return std::invalid_argument("conveyor: the checkpoint's '" + key + "' is " +
                               std::to_string(value) + ", not " + meaning);
}

// The range of a count or position held in a size_t, as an int64 bound.
constexpr int64_t kMaxSize = static_cast<int64_t>(
    std::min<uint64_t>(std::numeric_limits<size_t>::max(), std::numeric_limits<int64_t>::max()));

}  // namespace

int64_t read_int(const LoaderState& state, const std::string& key) {
  return read_as<int64_t>(state, key, "an integer");
}

int64_t read_int_in(const LoaderState& state, const std::string& key, int64_t min, int64_t max) {
  const int64_t value = read_int(state, key);
  if (value < min || value > max) {
    throw out_of_range(key, value, "in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

bool read_flag(const LoaderState& state, const std::string& key) {
  return read_int_in(state, key, 0, 1) != 0;
}

const std::string& read_string(const LoaderState& state, const std::string& key) {
  return read_as<std::string>(state, key, "a string");
}

const std::vector<int64_t>& read_list(const LoaderState& state, const std::string& key) {
  return read_as<std::vector<int64_t>>(state, key, "a list of integers");
}

void write_archive(torch::serialize::OutputArchive& archive, const LoaderState& state) {
  for (const auto& [key, value] : state.values()) {
    if (const auto* number = std::get_if<int64_t>(&value)) {
      archive.write(key, c10::IValue(*number));
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      archive.write(key, c10::IValue(*text));
    } else {
      const auto& list = std::get<std::vector<int64_t>>(value);
      at::Tensor tensor = at::empty({static_cast<int64_t>(list.size())}, at::kLong);
      std::copy(list.begin(), list.end(), tensor.data_ptr<int64_t>());
      archive.write(key, tensor, /*is_buffer=*/true);
    }
  }
}

LoaderState read_archive(torch::serialize::InputArchive& archive) {
  LoaderState state;
  for (const std::string& key : archive.keys()) {
    c10::IValue value;
    archive.read(key, value);
    if (key == "training" && value.isBool()) continue;  // torch's module's own attribute
    if (value.isInt()) {
      state.set_int(key, value.toInt());
    } else if (value.isString()) {
      state.set_string(key, value.toStringRef());
    } else if (value.isTensor() && value.toTensor().scalar_type() == at::kLong &&
               value.toTensor().dim() == 1) {
      const at::Tensor tensor = value.toTensor().contiguous();
      const int64_t* data = tensor.data_ptr<int64_t>();
      state.set_list(key, std::vector<int64_t>(data, data + tensor.numel()));
    } else {
      throw std::invalid_argument("conveyor: the checkpoint's '" + printable(key) + "' is a " +
                                  value.tagKind() +
                                  "; a checkpoint holds integers, strings and one-dimensional "
                                  "int64 tensors");
    }
  }
  return state;
}

void expect_same(const std::string& what, int64_t saved, int64_t current) {
  if (saved != current) {
    throw std::invalid_argument("conveyor: the checkpoint's " + what + " is " +
                                std::to_string(saved) + " but this loader's is " +
                                std::to_string(current));
  }
}

void expect_same(const std::string& what, const std::string& saved, const std::string& current) {
  if (saved != current) {
    throw std::invalid_argument("conveyor: the checkpoint's " + what + " is '" + printable(saved) +
                                "' but this loader's is '" + printable(current) + "'");
  }
}

void write_position(LoaderState& state, const CheckpointPosition& p, const OrderShape& shape) {
  state.set_int("conveyor_checkpoint_version", kCheckpointVersion);
  state.set_int("epoch", static_cast<int64_t>(p.epoch));
  state.set_int("order_base", static_cast<int64_t>(p.base));
  state.set_int("order_world_size", static_cast<int64_t>(p.world));
  state.set_int("batches_received", static_cast<int64_t>(p.received));
  state.set_int("epoch_complete", p.complete);
  state.set_int("seed", static_cast<int64_t>(shape.seed));
  state.set_int("batch_size", static_cast<int64_t>(shape.batch_size));
  state.set_int("drop_last", shape.drop_last);
  state.set_int("dataset_size", static_cast<int64_t>(shape.dataset_size));
}

void check_shape(const LoaderState& state, const OrderShape& shape) {
  expect_same("format version", read_int(state, "conveyor_checkpoint_version"), kCheckpointVersion);
  expect_same("batch_size", read_int(state, "batch_size"), static_cast<int64_t>(shape.batch_size));
  expect_same("drop_last", read_int(state, "drop_last"), shape.drop_last);
  expect_same("dataset size", read_int(state, "dataset_size"),
              static_cast<int64_t>(shape.dataset_size));
  expect_same("seed", read_int(state, "seed"), static_cast<int64_t>(shape.seed));
}

CheckpointPosition read_position(const LoaderState& state, size_t dataset_size) {
  CheckpointPosition p;
  p.complete = read_flag(state, "epoch_complete");
  // A complete epoch is continued by the next one, which must be an epoch too.
  const int64_t max_epoch = std::numeric_limits<int64_t>::max() - (p.complete ? 1 : 0);
  p.epoch = static_cast<uint64_t>(read_int_in(state, "epoch", 0, max_epoch));
  p.base = static_cast<size_t>(read_int_in(
      state, "order_base", 0,
      static_cast<int64_t>(std::min<uint64_t>(dataset_size, std::numeric_limits<int64_t>::max()))));
  p.world = static_cast<size_t>(read_int_in(
      state, "order_world_size", 1, static_cast<int64_t>(DistributedSampler::kMaxWorldSize)));
  p.received = static_cast<size_t>(read_int_in(state, "batches_received", 0, kMaxSize));
  return p;
}

void check_position(const CheckpointPosition& p, const OrderShape& shape, size_t world) {
  if (p.complete || p.world == world) return;  // nothing shared out anew
  // Each saved rank's share of the rest, and the batches it holds (no product overflows: the
  // share is at most the dataset's size, the batches at most the share).
  const size_t rest = shape.dataset_size - p.base;
  const size_t share = rest / p.world + (rest % p.world != 0 ? 1 : 0);
  const size_t batches = share / shape.batch_size + (share % shape.batch_size != 0 ? 1 : 0);
  if (p.received > batches) {
    throw std::invalid_argument(
        "conveyor: the checkpoint's 'batches_received' is " + std::to_string(p.received) +
        ", but each of its 'order_world_size' " + std::to_string(p.world) + " ranks had at most " +
        std::to_string(batches) + " batches of " + std::to_string(shape.batch_size) + " in the " +
        std::to_string(rest) + " samples left of the epoch");
  }
}

size_t elastic_base(const CheckpointPosition& p, size_t batch_size, size_t dataset_size) {
  const size_t left = dataset_size - std::min(p.base, dataset_size);
  // world x received x batch_size >= left, without forming a product that overflows.
  if (p.world == 0 || p.received == 0 || batch_size == 0) return p.base;
  const size_t per_rank = left / p.world;  // whole entries each rank may consume before the end
  if (p.received > per_rank / batch_size) return dataset_size;
  return std::min(dataset_size, p.base + p.world * p.received * batch_size);
}

void check_received(const CheckpointPosition& p, size_t batches) {
  if (p.received > batches) {
    throw std::invalid_argument("conveyor: the checkpoint's 'batches_received' is " +
                                std::to_string(p.received) + ", but epoch " +
                                std::to_string(p.epoch) + " of this loader has " +
                                std::to_string(batches) + " batches");
  }
}

}  // namespace detail

DataLoader::Impl::Position DataLoader::Impl::position() const {
  if (resume_) return *resume_;  // loaded and not applied yet
  Position p;
  p.world = sampler_->world_size();
  if (!started_ || next_epoch_) {  // the next begin() starts an epoch from its first batch
    p.epoch = next_epoch_ ? *next_epoch_ : epoch_;
    return p;
  }
  p.epoch = epoch_;
  p.base = order_base_;
  p.received = next_sequence_;
  p.complete = next_sequence_ >= num_batches_;
  if (!options_.enforce_ordering && p.received > 0 && !p.complete) {
    throw std::logic_error(
        "conveyor: DataLoader::save() mid-epoch needs enforce_ordering: without it batches arrive "
        "out of order, so the number received does not say which ones were");
  }
  return p;
}

detail::OrderShape DataLoader::Impl::order_shape() const {
  return {options_.seed, options_.batch_size, options_.drop_last, source_->size()};
}

LoaderState DataLoader::Impl::state() const {
  LoaderState state;
  detail::write_position(state, position(), order_shape());
  sampler_->save(state);
  return state;
}

void DataLoader::Impl::load_state(const LoaderState& state) {
  if (joined_) detail::throw_joined();
  // Everything is read and checked before anything changes.
  const detail::OrderShape shape = order_shape();
  detail::check_shape(state, shape);
  sampler_->check(state);
  const detail::CheckpointPosition position = detail::read_position(state, shape.dataset_size);
  detail::check_position(position, shape, sampler_->world_size());
  resume(position);
}

void DataLoader::Impl::resume(const detail::CheckpointPosition& position) {
  if (joined_) detail::throw_joined();
  resume_ = position;
  next_epoch_.reset();
  epoch_batches_.reset();
  ++runs_;  // the iterators of the epoch in progress are replaced too
}

LoaderState DataLoader::state() const { return impl_->state(); }
void DataLoader::load_state(const LoaderState& state) { impl_->load_state(state); }

void DataLoader::save(torch::serialize::OutputArchive& archive) const {
  detail::write_archive(archive, impl_->state());
}

void DataLoader::load(torch::serialize::InputArchive& archive) {
  impl_->load_state(detail::read_archive(archive));
}

}  // namespace conveyor
