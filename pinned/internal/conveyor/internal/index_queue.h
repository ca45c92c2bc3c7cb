// conveyor/internal/index_queue.h: the lock-free hand-off between the engine's threads
// (build-only, like the rest of pinned/internal/: never installed, so no public header includes
// it). The slot ring's free list (pinned.cpp) and the loader's job and completed queues
// (loader/src/job_queue.h, engine.h) are IndexQueues.
//
// What it is for: a bounded multi-producer, multi-consumer queue of 32-bit indices (slots, jobs)
// with a counting semaphore beside it (semaphore.h), so that a thread with nothing to do sleeps
// instead of spinning.
//
// Invariant: every index is pushed before its permit is released, and a permit is acquired before
// its index is popped, so a pop after an acquired permit always finds an index; the queue is sized
// for every index that can be in flight at once, so a push never finds it full. Both are checked
// with CONVEYOR_CHECK (invariant.h): breaking one is a bookkeeping bug, and stops the process.
// Closing: close() wakes every waiter. From then on every pop returns nullopt (each waiter that
// a wake-up reaches passes it on to the next), and pushes still queue their index, so a slot
// released after close() is not lost. pop() waits without end: only for a queue never closed.
// Memory ordering: Boost.Lockfree's push/pop are release/acquire, and sem_post/sem_wait
// synchronize as well: whatever the producer wrote before push() (a slot's SlotMeta, its rows) is
// visible to the thread that pops the index; close() happens-before the pops it ends.
// Thread safety: every member may be called concurrently, except construction and destruction.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <boost/lockfree/queue.hpp>

#include "conveyor/internal/invariant.h"
#include "conveyor/internal/semaphore.h"

namespace conveyor::detail {

class IndexQueue {
 public:
  explicit IndexQueue(size_t capacity) : queue_(capacity) {}
  IndexQueue(const IndexQueue&) = delete;
  IndexQueue& operator=(const IndexQueue&) = delete;

  // Queues `index` and releases its permit; never blocks.
  void push(uint32_t index) {
    push_index(index);
    count_.release();
  }
  // Queues `count` indices made by `index_of(i)`, then releases their permits at once.
  template <typename F>
  void push_many(size_t count, F&& index_of) {
    for (size_t i = 0; i < count; ++i) push_index(index_of(i));
    count_.release(static_cast<std::ptrdiff_t>(count));
  }

  // Waits for an index; nullopt once closed.
  std::optional<uint32_t> wait() {
    if (closed()) return std::nullopt;
    count_.acquire();
    return take_after_permit();
  }
  // Waits for an index, in a queue that is never closed.
  uint32_t pop() {
    const std::optional<uint32_t> index = wait();
    CONVEYOR_CHECK(index.has_value(), "IndexQueue::pop() is only for a queue never closed");
    return *index;
  }
  // An index if one is queued now, without waiting; nullopt also once closed.
  std::optional<uint32_t> try_pop() {
    if (closed() || !count_.try_acquire()) return std::nullopt;
    return take_after_permit();
  }
  // Waits at most `timeout` for an index; nullopt also once closed.
  std::optional<uint32_t> pop_for(std::chrono::milliseconds timeout) {
    if (closed() || !count_.try_acquire_for(timeout)) return std::nullopt;
    return take_after_permit();
  }

  // Ends every wait, now and later (see the top of this file). Idempotent.
  void close() {
    if (closed_.exchange(true, std::memory_order_acq_rel)) return;
    count_.release();  // one wake-up, passed on from waiter to waiter
  }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  std::optional<uint32_t> take_after_permit() {
    if (closed()) {
      count_.release();  // perhaps close()'s wake-up: pass it on to the next waiter
      return std::nullopt;
    }
    uint32_t index = 0;
    CONVEYOR_CHECK(queue_.pop(index), "a permit always stands for a queued index");
    return index;
  }
  void push_index(uint32_t index) {
    CONVEYOR_CHECK(queue_.bounded_push(index), "an index queue is sized for every index in flight");
  }

  boost::lockfree::queue<uint32_t> queue_;
  Semaphore count_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace conveyor::detail
