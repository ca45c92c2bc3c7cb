// conveyor/detail/torch_data_batched.h: the drop-in's batched path (detail; included by
// conveyor/torch_data.h after its public types, never directly).
//
// What it is for: every dataset that the collated path cannot take runs on torch::data's own
// loaders (StatelessDataLoader, StatefulDataLoader), wrapped so that workers pin each batch's
// tensors and the consumer moves them to the device.
//
// Requires: the dataset meets torch::data's requirements for its loader.
// Guarantees: ordering, timeout and exceptions are torch's; save() and load() throw
// std::logic_error (torch owns the order); a new epoch may begin while the
// previous one still has batches in flight (OpenTorchLoader: checked against torch 2.11 by
// tests/torch_data_test.cpp).
// Thread safety: torch's: the consumer thread calls the loader; torch's workers call get_batch.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/data.h>

namespace conveyor {
namespace detail {

namespace td = torch::data;

td::DataLoaderOptions to_torch_options(const DataLoaderOptions& options);
// Throws std::logic_error: the batched path offers no checkpoints (`method`: "save" or "load").
[[noreturn]] void refuse_batched_checkpoint(const char* method);

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

// torch's loaders, opened up through their protected members: the one place where the drop-in
// relies on more than torch's public API, because torch's begin() refuses to start an epoch while
// batches are in flight (and its reset(), which would not, is private in the derived loaders).
// start_epoch() first drains the shuttle (in torch 2.11: drops the queued jobs, then waits for the
// ones being computed and discards their results), so that begin()'s check passes; begin() then
// resets the sampler (stateless) or the dataset (stateful), starts a new sequence and schedules
// the first jobs. next_batch() is torch's protected next().
// The test TorchDataBatchedNewEpoch.AfterBreakEachIndexOnceNoStaleBatchOnTorch2_11 checks this
// (each index exactly once, no batch of the old epoch) and names the torch version it was checked
// against; on a torch upgrade, re-check DataLoaderBase::begin/reset and DataShuttle::drain.
template <typename Base>
class OpenTorchLoader final : public Base {
 public:
  using Base::Base;
  void start_epoch() {
    this->shuttle_.drain();
    (void)Base::begin();
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
  // torch's workers and samplers own the order, so the position cannot be saved or resumed.
  void save(torch::serialize::OutputArchive&) const override { refuse_batched_checkpoint("save"); }
  void load(torch::serialize::InputArchive&) override { refuse_batched_checkpoint("load"); }
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
}  // namespace conveyor
