// loader/src/job_queue.h (detail): the consumer's jobs for the workers.
//
// JobQueue: an IndexQueue (conveyor/internal/index_queue.h, the one lock-free hand-off of the
// machinery, shared with the slot ring's free list) of jobs, each one chunk of one batch slot.
//
// Invariant: the queue has room for every chunk of every slot, so a push never finds it full, and
// a job names a real chunk (both checked with CONVEYOR_CHECK: a broken one stops the process, as
// everywhere in the machinery).
// Thread safety: push_batch(), push_some() and try_take_back() on the consumer thread, wait() on
// the workers (or the GPU decode thread, for its own queue), stop() on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "conveyor/internal/index_queue.h"

namespace conveyor::detail {

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
  // The consumer queues the chunks c < `chunks` of `slot`'s batch for which wanted(c) is true
  // (GPU decode: the chunks with rows for this queue's decoder).
  template <typename Wanted>
  void push_some(uint32_t slot, size_t chunks, Wanted&& wanted) {
    check(slot, chunks);
    size_t count = 0;
    for (size_t c = 0; c < chunks; ++c) count += wanted(c) ? 1 : 0;
    size_t next = 0;  // push_many asks for the indices in order
    queue_.push_many(count, [&](size_t) {
      while (!wanted(next)) ++next;
      return encode({slot, static_cast<uint32_t>(next++)});
    });
  }
  // A worker waits for a job; nullopt once stop() was called.
  std::optional<Job> wait();
  // The consumer takes back a job no worker started (to cancel an epoch); nullopt when none is
  // queued.
  std::optional<Job> try_take_back();
  // Wakes every thread blocked in wait(); every later wait() returns nullopt.
  void stop() { queue_.close(); }

 private:
  void check(uint32_t slot, size_t chunks) const;
  uint32_t encode(Job job) const { return static_cast<uint32_t>(job.slot * chunks_ + job.chunk); }
  Job decode(uint32_t value) const {
    return {static_cast<uint32_t>(value / chunks_), static_cast<uint32_t>(value % chunks_)};
  }
  size_t slots_;
  size_t chunks_;
  IndexQueue queue_;
};

}  // namespace conveyor::detail
