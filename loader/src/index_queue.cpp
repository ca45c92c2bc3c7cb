#include "index_queue.h"

#include "invariant.h"

namespace conveyor::detail {

IndexQueue::IndexQueue(size_t capacity) : queue_(capacity) {}

void IndexQueue::push_index(uint32_t index) {
  CONVEYOR_CHECK(queue_.bounded_push(index), "an index queue is sized for every index in flight");
}

void IndexQueue::push(uint32_t index) {
  push_index(index);
  count_.release();
}

uint32_t IndexQueue::take_after_permit() {
  uint32_t index = 0;
  CONVEYOR_CHECK(queue_.pop(index), "a permit always stands for a queued index");
  return index;
}

uint32_t IndexQueue::pop() {
  count_.acquire();
  return take_after_permit();
}

std::optional<uint32_t> IndexQueue::try_pop() {
  if (!count_.try_acquire()) return std::nullopt;
  return take_after_permit();
}

std::optional<uint32_t> IndexQueue::pop_for(std::chrono::milliseconds timeout) {
  if (!count_.try_acquire_for(timeout)) return std::nullopt;
  return take_after_permit();
}

JobQueue::JobQueue(size_t slots, size_t chunks_per_batch)
    : slots_(slots), chunks_(chunks_per_batch), queue_(slots * chunks_per_batch) {}

void JobQueue::push_batch(uint32_t slot, size_t chunks) {
  CONVEYOR_CHECK(slot < slots_ && chunks >= 1 && chunks <= chunks_, "a job names a real chunk");
  queue_.push_many(chunks, [&](size_t c) { return encode({slot, static_cast<uint32_t>(c)}); });
}

std::optional<Job> JobQueue::wait() {
  queue_.wait_permit();
  if (stopped_.load(std::memory_order_acquire)) return std::nullopt;
  return decode(queue_.take_after_permit());
}

std::optional<Job> JobQueue::try_take_back() {
  std::optional<uint32_t> value = queue_.try_pop();
  if (!value) return std::nullopt;
  return decode(*value);
}

void JobQueue::stop(size_t workers) {
  stopped_.store(true, std::memory_order_release);
  queue_.wake(workers);
}

}  // namespace conveyor::detail
