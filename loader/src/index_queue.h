// loader/src/index_queue.h (detail): the lock-free hand-offs between the engine's threads.
//
// IndexQueue: a bounded multi-producer, multi-consumer queue of 32-bit indices (slots) with a
// counting semaphore beside it, so that a thread with nothing to do sleeps instead of spinning.
// JobQueue: an IndexQueue of jobs, each one chunk of one batch slot, from the consumer to the
// workers.
//
// Invariant: every index is pushed before its permit is released, and a permit is acquired before
// its index is popped, so the semaphore's count never exceeds the number of queued indices: a pop
// after an acquired permit always finds one (checked; failing it is a bookkeeping bug). The
// queues are sized for every index that can be in flight at once (every slot, or every chunk of
// every slot), so a push never finds them full (checked).
// Memory ordering: Boost.Lockfree's push/pop are release/acquire, and sem_post/sem_wait
// synchronize as well: whatever the producer wrote before push() (a slot's SlotMeta, its rows) is
// visible to the thread that pops the index.
// Thread safety: every member may be called concurrently, except construction and destruction.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <boost/lockfree/queue.hpp>

#include "conveyor/internal/semaphore.h"

namespace conveyor::detail {

class IndexQueue {
 public:
  explicit IndexQueue(size_t capacity);
  IndexQueue(const IndexQueue&) = delete;
  IndexQueue& operator=(const IndexQueue&) = delete;

  // Queues `index` and releases its permit; never blocks.
  void push(uint32_t index);
  // Queues `count` indices made by `index_of(i)`, then releases their permits at once.
  template <typename F>
  void push_many(size_t count, F&& index_of) {
    for (size_t i = 0; i < count; ++i) push_index(index_of(i));
    count_.release(static_cast<std::ptrdiff_t>(count));
  }
  // Waits for an index.
  uint32_t pop();
  // An index if one is queued now, without waiting.
  std::optional<uint32_t> try_pop();
  // Waits at most `timeout` for an index.
  std::optional<uint32_t> pop_for(std::chrono::milliseconds timeout);

  // Releases `waiters` permits with no index behind them, so that threads blocked in pop_permit()
  // wake up; only for shutting down (the invariant above no longer holds afterwards).
  void wake(size_t waiters) { count_.release(static_cast<std::ptrdiff_t>(waiters)); }
  // pop() in two steps, for a thread that also wakes for shutdown: wait_permit() returns when an
  // index is queued or wake() was called; the caller checks its own stop flag, then pops the index
  // its permit stands for with take_after_permit().
  void wait_permit() { count_.acquire(); }
  uint32_t take_after_permit();

 private:
  void push_index(uint32_t index);
  boost::lockfree::queue<uint32_t> queue_;
  Semaphore count_{0};
};

// One chunk of the batch in a slot: rows [chunk * chunk_size, (chunk + 1) * chunk_size).
struct Job {
  uint32_t slot;
  uint32_t chunk;
  bool operator==(const Job& other) const { return slot == other.slot && chunk == other.chunk; }
};

class JobQueue {
 public:
  // Room for every chunk of every slot.
  JobQueue(size_t slots, size_t chunks_per_batch);

  // The consumer queues the first `chunks` chunks of `slot`'s batch.
  void push_batch(uint32_t slot, size_t chunks);
  // A worker waits for a job; nullopt once stop() was called.
  std::optional<Job> wait();
  // The consumer takes back a job no worker started (to cancel an epoch); nullopt when none is
  // queued.
  std::optional<Job> try_take_back();
  // Wakes `workers` threads blocked in wait(); every later wait() returns nullopt.
  void stop(size_t workers);

 private:
  uint32_t encode(Job job) const { return static_cast<uint32_t>(job.slot * chunks_ + job.chunk); }
  Job decode(uint32_t value) const {
    return {static_cast<uint32_t>(value / chunks_), static_cast<uint32_t>(value % chunks_)};
  }
  size_t slots_;
  size_t chunks_;
  IndexQueue queue_;
  std::atomic<bool> stopped_{false};
};

}  // namespace conveyor::detail
