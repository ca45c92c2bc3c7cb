#include "job_queue.h"

#include "conveyor/internal/invariant.h"

namespace conveyor::detail {

JobQueue::JobQueue(size_t slots, size_t chunks_per_batch)
    : slots_(slots), chunks_(chunks_per_batch), queue_(slots * chunks_per_batch) {}

void JobQueue::check(uint32_t slot, size_t chunks) const {
  CONVEYOR_CHECK(slot < slots_ && chunks >= 1 && chunks <= chunks_, "a job names a real chunk");
}

void JobQueue::push_batch(uint32_t slot, size_t chunks) {
  check(slot, chunks);
  queue_.push_many(chunks, [&](size_t c) { return encode({slot, static_cast<uint32_t>(c)}); });
}

std::optional<Job> JobQueue::wait() {
  const std::optional<uint32_t> value = queue_.wait();
  if (!value) return std::nullopt;
  return decode(*value);
}

std::optional<Job> JobQueue::try_take_back() {
  const std::optional<uint32_t> value = queue_.try_pop();
  if (!value) return std::nullopt;
  return decode(*value);
}

}  // namespace conveyor::detail
