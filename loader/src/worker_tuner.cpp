#include "worker_tuner.h"

#include <algorithm>
#include <cmath>

#include "conveyor/internal/invariant.h"

namespace conveyor::detail {

bool WorkerGate::wait_turn(size_t worker) {
  if (worker < active_.load(std::memory_order_acquire)) {
    return !stopped_.load(std::memory_order_acquire);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    return stopped_.load(std::memory_order_acquire) ||
           worker < active_.load(std::memory_order_acquire);
  });
  return !stopped_.load(std::memory_order_acquire);
}

void WorkerGate::set_active(size_t active) {
  {
    std::lock_guard<std::mutex> lock(mutex_);  // a worker between its check and its sleep sees it
    active_.store(active, std::memory_order_release);
  }
  changed_.notify_all();
}

void WorkerGate::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_.store(true, std::memory_order_release);
  }
  changed_.notify_all();
}

WorkerTuner::WorkerTuner(const Options& options)
    : options_(options),
      active_(std::clamp<size_t>(options.initial_workers, 1,
                                 std::max<size_t>(1, options.max_workers))) {
  options_.max_workers = std::max<size_t>(1, options_.max_workers);
  options_.window_batches = std::max<size_t>(1, options_.window_batches);
  history_.resize(kMaxHistory);
  history_[0] = {0, 0.0, active_};
  recorded_.store(1, std::memory_order_release);
}

std::vector<ActiveWorkers> WorkerTuner::history() const {
  const size_t n = recorded_.load(std::memory_order_acquire);
  return {history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(n)};
}

size_t WorkerTuner::depth() const {
  return std::clamp<size_t>(active_ + options_.prefetch_factor + 2, 2,
                            std::max<size_t>(2, options_.slots));
}

void WorkerTuner::change(size_t workers, const Counters& now) {
  CONVEYOR_CHECK(workers >= 1 && workers <= options_.max_workers, "the tuner keeps the budget");
  if (workers == active_) return;
  const bool lower = workers < active_;
  if (!lower && last_was_lower_) {  // the last lowering starved the consumer: lower more rarely
    lower_lockout_ = std::min<uint64_t>(64, lower_lockout_ * 2);
  }
  last_was_lower_ = lower;
  active_ = workers;
  ++changes_;
  lower_streak_ = 0;
  refilling_ = true;
  const size_t n = recorded_.load(std::memory_order_relaxed);  // only this thread writes it
  if (n < kMaxHistory) {
    history_[n] = {batches_, now.seconds, active_};
    recorded_.store(n + 1, std::memory_order_release);  // a reader sees the entry it counts
  }
}

void WorkerTuner::restart() {
  rebase_ = true;
  refilling_ = true;
}

size_t WorkerTuner::observe(const Counters& now) {
  ++batches_;
  if (rebase_) {
    rebase_ = false;
    window_start_ = now;
    window_start_batch_ = batches_;
    return active_;
  }
  if (batches_ - window_start_batch_ < options_.window_batches) return active_;
  const Counters start = window_start_;
  window_start_ = now;
  window_start_batch_ = batches_;
  if (refilling_) {  // batches of this window were dispatched before the last change
    refilling_ = false;
    return active_;
  }
  const double wall = now.seconds - start.seconds;
  const double wait = std::max(0.0, now.wait_seconds - start.wait_seconds);
  const double busy = std::max(0.0, now.busy_seconds - start.busy_seconds);
  const double samples = static_cast<double>(now.samples - start.samples);
  if (wall <= 0 || samples <= 0) return active_;
  const double wait_share = wait / wall;
  // Workers the consumer's pace needs: the work per sample over the consumer's own time per
  // sample (at least a microsecond, so a consumer that does nothing asks for the whole budget).
  const double consumer_per_sample = std::max(1e-6, (wall - wait) / samples);
  const double busy_per_sample = busy / samples;
  const double needed = busy_per_sample / consumer_per_sample;
  const auto at_most_budget = [&](double workers) {
    return static_cast<size_t>(
        std::clamp(std::ceil(workers), 1.0, static_cast<double>(options_.max_workers)));
  };
  const size_t fewer = at_most_budget(needed * options_.lower_headroom);
  if (wait_share > options_.starved_share && active_ < options_.max_workers) {
    change(std::max(active_ + 1, at_most_budget(needed * options_.headroom)), now);
  } else if (wait_share < options_.idle_share && active_ > 1 && fewer < active_) {
    // A window in which the consumer was descheduled looks like a slow consumer: lower only
    // after `lower_lockout_` such windows in a row, and by half at most.
    if (++lower_streak_ >= lower_lockout_) change(std::max(fewer, (active_ + 1) / 2), now);
  } else {
    lower_streak_ = 0;
  }
  return active_;
}

}  // namespace conveyor::detail
