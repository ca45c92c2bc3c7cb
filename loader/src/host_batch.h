// loader/src/host_batch.h (detail): batches handed out from host slots (the CPU path), and the
// tensors that view a slot.
//
// SharedRing: the SlotRing plus the count of slots that batches held by the user still view. The
// loader and every such batch share it, so a batch may outlive its loader.
// HostBatches::make(): a ready slot becomes a Batch:
//   * zero copy: the batch's tensors view the slot, through one lease whose deleter releases the
//     slot (kReady -> kFree) when the last of those tensors is gone;
//   * a copy (clone, or into LibTorch's pinned memory with pin_memory), the slot released at once,
//     when pin_memory asks for pinned batches or when a lease would leave the pipeline fewer than
//     two slots (the user holding every other batch): so iteration can always go on.
// Invariant: `held` counts the leases alive; held <= slots, and a leased slot stays kReady (no
// worker or copy touches it) until its lease ends.
// Thread safety: make() on the consumer thread; leases end on whichever thread drops the last
// tensor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "conveyor/datasets.h"
#include "conveyor/loader.h"
#include "conveyor/pinned.h"

namespace conveyor::detail {

struct SharedRing {
  SlotRing ring;
  std::atomic<size_t> held{0};  // slots viewed by batches the user still holds
  explicit SharedRing(SlotRing::Options options) : ring(std::move(options)) {}
};

// Tensors [rows, ...sample_shape] viewing `slot`'s fields (no ownership).
std::vector<at::Tensor> slot_views(const SlotRing& ring, uint32_t slot,
                                   const std::vector<FieldSpec>& fields, size_t rows);

// A batch's description without its tensors: indices, epoch, sequence, field names.
struct BatchHeader {
  std::vector<size_t> indices;
  uint64_t epoch = 0;
  size_t sequence = 0;
};
Batch empty_batch(const BatchHeader& header, const std::vector<FieldSpec>& fields);

class HostBatches {
 public:
  HostBatches(std::shared_ptr<SharedRing> shared, std::vector<FieldSpec> fields, bool pin_memory);
  // Makes the batch in `slot` (kReady) and takes the slot over: it returns to the ring when the
  // batch no longer needs it. If it throws (an allocation failed), the slot is still kReady and
  // still the caller's.
  Batch make(uint32_t slot, const BatchHeader& header);
  // Batches handed out as copies because a lease would have taken the pipeline's last slots.
  uint64_t copies_to_host() const { return copies_to_host_; }

 private:
  std::shared_ptr<SharedRing> shared_;
  std::vector<FieldSpec> fields_;
  bool pinned_copy_;
  uint64_t copies_to_host_ = 0;
};

}  // namespace conveyor::detail
