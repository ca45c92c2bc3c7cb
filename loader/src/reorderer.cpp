#include "reorderer.h"

#include "conveyor/internal/invariant.h"

namespace conveyor::detail {

Reorderer::Reorderer(size_t capacity) : entries_(capacity) {
  CONVEYOR_CHECK(capacity >= 1, "a reorderer holds at least one batch");
}

void Reorderer::put(size_t sequence, uint32_t slot) {
  std::optional<Entry>& entry = entries_[sequence % entries_.size()];
  CONVEYOR_CHECK(!entry,
                 "at most `slots` batches are dispatched and not taken, so "
                 "sequence % slots never collides in the reorder buffer");
  entry = Entry{sequence, slot};
}

std::optional<uint32_t> Reorderer::take(size_t sequence) {
  std::optional<Entry>& entry = entries_[sequence % entries_.size()];
  if (!entry) return std::nullopt;
  CONVEYOR_CHECK(entry->sequence == sequence,
                 "the reorder buffer holds only sequences in [wanted, wanted + slots)");
  const uint32_t slot = entry->slot;
  entry.reset();
  return slot;
}

size_t Reorderer::held() const {
  size_t n = 0;
  for (const auto& entry : entries_) n += entry.has_value();
  return n;
}

}  // namespace conveyor::detail
