// Checkpoints: DataLoader::save/load (the engine's Position in a torch archive) and the archive
// helpers the samplers use.
#include "checkpoint.h"

#include <stdexcept>

#include "engine.h"

namespace conveyor {
namespace detail {

void write_int(torch::serialize::OutputArchive& archive, const std::string& key, int64_t value) {
  archive.write(key, c10::IValue(value));
}

void write_string(torch::serialize::OutputArchive& archive, const std::string& key,
                  const std::string& value) {
  archive.write(key, c10::IValue(value));
}

namespace {

c10::IValue read_value(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  if (!archive.try_read(key, value)) {
    throw std::invalid_argument("conveyor: the checkpoint has no '" + key +
                                "'; it was not written by DataLoader::save()");
  }
  return value;
}

}  // namespace

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  const c10::IValue value = read_value(archive, key);
  if (!value.isInt())
    throw std::invalid_argument("conveyor: the checkpoint's '" + key + "' is not an integer");
  return value.toInt();
}

std::string read_string(torch::serialize::InputArchive& archive, const std::string& key) {
  const c10::IValue value = read_value(archive, key);
  if (!value.isString())
    throw std::invalid_argument("conveyor: the checkpoint's '" + key + "' is not a string");
  return value.toStringRef();
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
    throw std::invalid_argument("conveyor: the checkpoint's " + what + " is '" + saved +
                                "' but this loader's is '" + current + "'");
  }
}

void write_position(torch::serialize::OutputArchive& archive, const CheckpointPosition& p,
                    const OrderShape& shape) {
  write_int(archive, "conveyor_checkpoint_version", kCheckpointVersion);
  write_int(archive, "epoch", static_cast<int64_t>(p.epoch));
  write_int(archive, "order_base", static_cast<int64_t>(p.base));
  write_int(archive, "order_world_size", static_cast<int64_t>(p.world));
  write_int(archive, "batches_received", static_cast<int64_t>(p.received));
  write_int(archive, "epoch_complete", p.complete);
  write_int(archive, "seed", static_cast<int64_t>(shape.seed));
  write_int(archive, "batch_size", static_cast<int64_t>(shape.batch_size));
  write_int(archive, "drop_last", shape.drop_last);
  write_int(archive, "dataset_size", static_cast<int64_t>(shape.dataset_size));
}

void check_shape(torch::serialize::InputArchive& archive, const OrderShape& shape) {
  expect_same("format version", read_int(archive, "conveyor_checkpoint_version"),
              kCheckpointVersion);
  expect_same("batch_size", read_int(archive, "batch_size"),
              static_cast<int64_t>(shape.batch_size));
  expect_same("drop_last", read_int(archive, "drop_last"), shape.drop_last);
  expect_same("dataset size", read_int(archive, "dataset_size"),
              static_cast<int64_t>(shape.dataset_size));
  expect_same("seed", read_int(archive, "seed"), static_cast<int64_t>(shape.seed));
}

CheckpointPosition read_position(torch::serialize::InputArchive& archive, size_t dataset_size) {
  const int64_t epoch = read_int(archive, "epoch");
  const int64_t base = read_int(archive, "order_base");
  const int64_t world = read_int(archive, "order_world_size");
  const int64_t received = read_int(archive, "batches_received");
  if (epoch < 0 || base < 0 || world < 1 || received < 0 ||
      static_cast<size_t>(base) > dataset_size) {
    throw std::invalid_argument("conveyor: the checkpoint's position (epoch " +
                                std::to_string(epoch) + ", order base " + std::to_string(base) +
                                ", world size " + std::to_string(world) + ", batches received " +
                                std::to_string(received) + ") is not one save() writes");
  }
  CheckpointPosition p;
  p.epoch = static_cast<uint64_t>(epoch);
  p.base = static_cast<size_t>(base);
  p.world = static_cast<size_t>(world);
  p.received = static_cast<size_t>(received);
  p.complete = read_int(archive, "epoch_complete") != 0;
  return p;
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

void DataLoader::Impl::save(torch::serialize::OutputArchive& archive) const {
  detail::write_position(archive, position(), order_shape());
  sampler_->save(archive);
}

void DataLoader::Impl::load(torch::serialize::InputArchive& archive) {
  if (joined_) detail::throw_joined();
  // Everything is read and checked before anything changes.
  detail::check_shape(archive, order_shape());
  sampler_->check(archive);
  resume(detail::read_position(archive, source_->size()));
}

void DataLoader::Impl::resume(const detail::CheckpointPosition& position) {
  if (joined_) detail::throw_joined();
  resume_ = position;
  next_epoch_.reset();
  epoch_batches_.reset();
  ++runs_;  // the iterators of the epoch in progress are replaced too
}

void DataLoader::save(torch::serialize::OutputArchive& archive) const { impl_->save(archive); }
void DataLoader::load(torch::serialize::InputArchive& archive) { impl_->load(archive); }

}  // namespace conveyor
