// loader/src/reorderer.h (detail): hands completed batches out in sampler order.
//
// Workers finish batches in any order; the consumer puts each completed batch's slot here under
// its sequence number (its position in the epoch) and takes the one whose turn it is.
//
// Invariant: every sequence held lies in [wanted, wanted + capacity), where wanted is the next
// sequence the consumer will take, because the loader never has more than `capacity` (= slots)
// batches dispatched and not yet taken. So position sequence % capacity is free whenever a batch
// is put there: put() checks it (a collision would overwrite a batch: always checked), and take()
// checks that what it finds there is the sequence asked for.
// Thread safety: the consumer thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace conveyor::detail {

class Reorderer {
 public:
  explicit Reorderer(size_t capacity);

  // Holds `slot`, the batch with this sequence number, until take(sequence).
  void put(size_t sequence, uint32_t slot);
  // The slot of batch `sequence` if it has been put, else nullopt.
  std::optional<uint32_t> take(size_t sequence);
  // Hands every held slot to release(slot) and empties the buffer (a cancelled epoch).
  template <typename Release>
  void clear(Release&& release) {
    for (auto& entry : entries_) {
      if (entry) release(entry->slot);
      entry.reset();
    }
  }
  size_t held() const;

 private:
  struct Entry {
    size_t sequence;
    uint32_t slot;
  };
  std::vector<std::optional<Entry>> entries_;
};

}  // namespace conveyor::detail
