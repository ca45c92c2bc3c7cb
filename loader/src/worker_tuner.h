// loader/src/worker_tuner.h (detail): workers = kAutoWorkers, the loader choosing while it runs how
// many of its worker threads work, and how many batches it dispatches ahead.
//
// WorkerGate: the workers' side. All max_workers threads are started once; a worker numbered at or
// above active() parks (sleeps on a condition variable) before it takes its next job, and wakes
// when the consumer raises active() or the loader stops. Threads are never created or destroyed
// while tuning, and a worker that is filling a chunk when it is parked finishes that chunk first.
// WorkerTuner: the consumer's side. After each batch handed out it reads the loader's cumulative
// counters (wall time, the consumer's wait for batches, the workers' busy time, samples handed
// out) and, once per window of batches, compares the work the pipeline needs per sample with the
// time the consumer spends per sample:
//   * the consumer waited more than `starved_share` of the window: raise to
//     max(active + 1, ceil(headroom x busy per sample / consumer time per sample)), at most
//     max_workers; a fast consumer thus reaches the budget in one window;
//   * the consumer waited less than `idle_share` and fewer workers would still keep up with
//     `lower_headroom` to spare, in two judged windows in a row: lower to
//     ceil(lower_headroom x busy per sample / consumer time per sample), but by half at most
//     (the work per sample is measured with the current workers, so on a CPU they contend for it
//     is over-estimated: the lowering errs on the side of more workers);
//   * the window after a change only refills the pipeline and is not judged.
// Each epoch's start restarts the window (restart()): the first batches of an epoch wait for a
// pipeline that starts empty. A lowering that is followed by a raise doubles the judged windows in
// a row that the next lowering needs (up to 64), so the count settles instead of oscillating. The
// dispatch depth (batches dispatched and not yet taken for hand-out) follows the workers: active +
// prefetch_factor + 2, at most the ring's slots, which are sized once for max_workers.
//
// Invariants: 1 <= active() <= max_workers; history() holds the first kMaxHistory changes, in
// entries allocated at construction, so tuning allocates nothing. The choice never changes a
// batch's bytes: every sample is a pure function of (seed, epoch, index), whichever worker writes
// it. Thread safety: WorkerGate's members may be called from any thread; WorkerTuner is
// consumer-only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "conveyor/loader.h"

namespace conveyor::detail {

class WorkerGate {
 public:
  explicit WorkerGate(size_t active) : active_(active) {}
  // Returns at once while `worker` < active(); otherwise sleeps until it is, or until stop().
  // Returns false once stop() was called.
  bool wait_turn(size_t worker);
  void set_active(size_t active);
  size_t active() const { return active_.load(std::memory_order_relaxed); }
  // Wakes every parked worker; wait_turn() returns false from now on.
  void stop();

 private:
  std::atomic<size_t> active_;
  std::atomic<bool> stopped_{false};
  std::mutex mutex_;
  std::condition_variable changed_;
};

class WorkerTuner {
 public:
  static constexpr size_t kMaxHistory = 4096;

  struct Options {
    size_t max_workers = 1;
    size_t initial_workers = 1;
    size_t slots = 3;            // the ring's slots: the most the dispatch depth may be
    size_t prefetch_factor = 2;  // the depth is active + prefetch_factor + 2
    size_t window_batches = 4;   // batches per judgement
    double starved_share = 0.03;
    double idle_share = 0.01;
    double headroom = 1.25;       // raising: workers for this multiple of the consumer's pace
    double lower_headroom = 1.5;  // lowering: to workers for this multiple of the consumer's pace
  };
  // The loader's cumulative counters, read by the consumer after each batch.
  struct Counters {
    double seconds = 0;       // since any fixed point (the loader's start)
    double wait_seconds = 0;  // the consumer's waits for a batch
    double busy_seconds = 0;  // workers' time filling chunks (and in the batch stage), summed
    uint64_t samples = 0;     // samples handed out
  };

  explicit WorkerTuner(const Options& options);
  // One batch was handed out; `now` are the counters after it. Returns the active workers to use
  // from now on (changed at most once per window).
  size_t observe(const Counters& now);
  // An epoch starts: its first batches wait for a pipeline filled from nothing, so the window
  // restarts after the next batch and that window is not judged.
  void restart();
  size_t active() const { return active_; }
  size_t depth() const;  // batches to dispatch ahead, for the current active()
  uint64_t batches() const { return batches_; }
  // The start and the changes so far; may be called from any thread (stats()).
  std::vector<ActiveWorkers> history() const;
  uint64_t changes() const { return changes_; }

 private:
  void change(size_t workers, const Counters& now);

  Options options_;
  size_t active_;
  uint64_t batches_ = 0;
  uint64_t window_start_batch_ = 0;
  Counters window_start_;
  bool refilling_ = true;  // the first window (and the one after each change) is not judged
  bool rebase_ = false;    // restart(): the next batch starts a new window
  bool last_was_lower_ = false;
  uint64_t lower_lockout_ = 2;  // judged windows in a row that must ask for fewer workers
  uint64_t lower_streak_ = 0;   // judged windows in a row that asked for fewer workers
  uint64_t changes_ = 0;
  std::vector<ActiveWorkers> history_;  // kMaxHistory entries, allocated once
  std::atomic<size_t> recorded_{0};     // entries of history_ written (release after each)
};

}  // namespace conveyor::detail
