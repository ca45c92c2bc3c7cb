// Datasets and helpers shared by the drop-in's tests (tests/torch_data*_test.cpp): per-sample,
// batch and stateful torch datasets whose failures and delays a test controls.
#pragma once

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <torch/version.h>

#include "conveyor/torch_data.h"

namespace conveyor::torch_data_test {

namespace td = torch::data;
using namespace std::chrono_literals;

struct BadSample : std::runtime_error {
  explicit BadSample(size_t index)
      : std::runtime_error("bad sample " + std::to_string(index)), index(index) {}
  size_t index;
};

// What the copies of a dataset share: failures, delays and who called get() on which copy.
struct Probe {
  std::set<size_t> fail_at;
  std::set<size_t> fail_once_at;  // these fail on their first read only (failed_once: read)
  std::set<size_t> odd_shape_at;
  std::chrono::milliseconds delay{0};
  size_t slow_every = 0;     // with delay: only indices divisible by it are slow (0: all)
  std::set<size_t> slow_at;  // with delay: only these indices are slow (when not empty)
  bool slow_once = false;    // with slow_at: only the first read of them is slow
  std::atomic<bool> slowed{false};
  std::atomic<int> shared_copy_calls{0};  // get() on a copy another thread used before
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::set<size_t> failed_once;  // under mutex
};

// Sample i: data float [3,2,2] filled with i, target int64 i.
class Numbers : public td::datasets::Dataset<Numbers> {
 public:
  explicit Numbers(size_t n, std::shared_ptr<Probe> probe = std::make_shared<Probe>())
      : n_(n), probe_(std::move(probe)) {}
  td::Example<> get(size_t index) override {
    const std::thread::id me = std::this_thread::get_id();
    if (owner_ == std::thread::id()) owner_ = me;
    if (owner_ != me) probe_->shared_copy_calls.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(probe_->mutex);
      probe_->threads.insert(me);
    }
    if (is_slow(index)) std::this_thread::sleep_for(probe_->delay);
    if (probe_->fail_at.count(index)) throw BadSample(index);
    if (probe_->fail_once_at.count(index)) {
      std::lock_guard<std::mutex> lock(probe_->mutex);
      if (probe_->failed_once.insert(index).second) throw BadSample(index);
    }
    const auto v = static_cast<double>(index);
    at::Tensor data =
        probe_->odd_shape_at.count(index) ? torch::full({3, 2, 3}, v) : torch::full({3, 2, 2}, v);
    return {data, torch::tensor(static_cast<int64_t>(index))};
  }
  std::optional<size_t> size() const override { return n_; }

 private:
  bool is_slow(size_t index) const {
    if (probe_->delay.count() == 0) return false;
    if (!probe_->slow_at.empty()) {
      return probe_->slow_at.count(index) && !(probe_->slow_once && probe_->slowed.exchange(true));
    }
    return probe_->slow_every == 0 || index % probe_->slow_every == 0;
  }
  size_t n_;
  std::shared_ptr<Probe> probe_;
  std::thread::id owner_;  // per copy: the thread that uses this copy
};

// A dataset with its own get_batch: batches are plain vectors of squares.
class Squares : public td::datasets::BatchDataset<Squares, std::vector<int64_t>> {
 public:
  explicit Squares(size_t n) : n_(n) {}
  std::vector<int64_t> get_batch(c10::ArrayRef<size_t> indices) override {
    std::vector<int64_t> out;
    std::this_thread::sleep_for(batch_delay_);
    for (size_t i : indices) {
      if (i == slow_at_) std::this_thread::sleep_for(slow_delay_);
      if (i == fail_at_) throw BadSample(i);
      out.push_back(static_cast<int64_t>(i * i));
    }
    return out;
  }
  std::optional<size_t> size() const override { return n_; }
  size_t fail_at_ = SIZE_MAX;
  size_t slow_at_ = SIZE_MAX;  // a batch holding this index takes slow_delay_ longer
  std::chrono::milliseconds slow_delay_{0};
  std::chrono::milliseconds batch_delay_{0};  // every batch

 private:
  size_t n_;
};

// A stateful stream 0..n-1 handed out in chunks; shared by the workers.
class Countdown : public td::datasets::StatefulDataset<Countdown, std::vector<int64_t>> {
 public:
  explicit Countdown(size_t n) : n_(n), state_(std::make_shared<State>()) {}
  std::optional<std::vector<int64_t>> get_batch(size_t batch_size) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->next >= n_) return std::nullopt;
    std::vector<int64_t> out;
    for (size_t k = 0; k < batch_size && state_->next < n_; ++k) {
      out.push_back(static_cast<int64_t>(state_->next++));
    }
    return out;
  }
  std::optional<size_t> size() const override { return n_; }
  void reset() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->next = 0;
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}

 private:
  struct State {
    std::mutex mutex;
    size_t next = 0;
  };
  size_t n_;
  std::shared_ptr<State> state_;
};

inline auto stacked(size_t n, std::shared_ptr<Probe> probe = std::make_shared<Probe>()) {
  return Numbers(n, std::move(probe)).map(td::transforms::Stack<>());
}

inline std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The targets of every batch of one epoch, checking each row's data holds its target.
template <typename Loader>
std::vector<std::vector<int64_t>> epoch_targets(Loader& loader) {
  std::vector<std::vector<int64_t>> batches;
  for (auto& batch : loader) {
    std::vector<int64_t> targets = to_vector(batch.target);
    at::Tensor data = batch.data.to(at::kCPU);
    for (size_t r = 0; r < targets.size(); ++r) {
      EXPECT_TRUE(
          data[static_cast<int64_t>(r)].eq(static_cast<double>(targets[r])).all().item<bool>())
          << "row " << r << " of a batch does not hold sample " << targets[r];
    }
    batches.push_back(std::move(targets));
  }
  return batches;
}

template <typename Loader>
std::vector<std::vector<int64_t>> epoch_vectors(Loader& loader) {
  std::vector<std::vector<int64_t>> batches;
  for (auto& batch : loader) batches.push_back(batch);
  return batches;
}

inline std::string message_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace conveyor::torch_data_test
