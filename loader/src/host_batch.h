// loader/src/host_batch.h (detail): batches handed out from host slots (the CPU path), and the
// tensors that view a slot.
//
// A ragged field (FieldSpec::ragged, loader/src/ragged.h) is handed out in the jagged layout: its
// values [total items, ...sample_shape] and offsets int64 [B + 1]. A zero-copy batch views both in
// the slot, once its rows are compacted in place; a copy gathers the used items, the slot as it
// was.
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

// Tensors viewing the batch in `slot` (no ownership), one per field: a fixed field's rows
// [rows, ...sample_shape]; a ragged field's values [total, ...sample_shape] at the region's start
// (their content valid once compact_slot() ran) and offsets [rows + 1] (valid now: this plans the
// ragged fields, plan_ragged(), and may run again on the same slot). offsets[f] is undefined for
// a fixed field.
struct SlotTensors {
  std::vector<at::Tensor> fields;
  std::vector<at::Tensor> offsets;
};
SlotTensors slot_views(const SlotRing& ring, uint32_t slot, const std::vector<FieldSpec>& fields,
                       size_t rows, size_t batch_size);
// Compacts the ragged fields of `slot` (but the host_only ones when `skip_host_only`), after
// slot_views(): their values views then hold the items. Once per filled slot.
void compact_slot(const SlotRing& ring, uint32_t slot, const std::vector<FieldSpec>& fields,
                  size_t rows, size_t batch_size, bool skip_host_only) noexcept;
// Field f copied out of `slot` (`views` from slot_views(), before compact_slot()): a fixed field's
// rows, or a ragged field's used items and its offsets (`offsets` left undefined for a fixed
// field). In LibTorch's pinned host memory when `pinned`. Throws when an allocation fails.
void copy_field(const SlotRing& ring, uint32_t slot, const std::vector<FieldSpec>& fields, size_t f,
                const SlotTensors& views, size_t batch_size, bool pinned, at::Tensor& values,
                at::Tensor& offsets);

// A batch's description without its tensors: indices, epoch, sequence, field names.
struct BatchHeader {
  std::vector<size_t> indices;
  uint64_t epoch = 0;
  size_t sequence = 0;
  std::vector<uint32_t> repeats{};  // empty: all 0
  std::shared_ptr<const AugmentRecord> augment_params{};
};
Batch empty_batch(const BatchHeader& header, const std::vector<FieldSpec>& fields);

class HostBatches {
 public:
  HostBatches(std::shared_ptr<SharedRing> shared, std::vector<FieldSpec> fields, size_t batch_size,
              bool pin_memory);
  // Makes the batch in `slot` (kReady) and takes the slot over: it returns to the ring when the
  // batch no longer needs it. If it throws (an allocation failed), the slot is still kReady and
  // still the caller's.
  Batch make(uint32_t slot, const BatchHeader& header);
  // Batches handed out as copies because a lease would have taken the pipeline's last slots.
  uint64_t copies_to_host() const { return copies_to_host_; }

 private:
  std::shared_ptr<SharedRing> shared_;
  std::vector<FieldSpec> fields_;
  size_t batch_size_;  // the ring's: where a ragged field's offsets lie
  bool pinned_copy_;
  uint64_t copies_to_host_ = 0;
};

}  // namespace conveyor::detail
