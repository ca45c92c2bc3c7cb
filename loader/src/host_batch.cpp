#include "host_batch.h"

#include <ATen/ATen.h>

#include "conveyor/internal/invariant.h"

namespace conveyor::detail {

std::vector<at::Tensor> slot_views(const SlotRing& ring, uint32_t slot,
                                   const std::vector<FieldSpec>& fields, size_t rows) {
  std::vector<at::Tensor> views;
  views.reserve(fields.size());
  for (size_t f = 0; f < fields.size(); ++f) {
    std::vector<int64_t> shape{static_cast<int64_t>(rows)};
    shape.insert(shape.end(), fields[f].sample_shape.begin(), fields[f].sample_shape.end());
    views.push_back(
        at::from_blob(ring.field(slot, f), shape, at::TensorOptions().dtype(fields[f].dtype)));
  }
  return views;
}

Batch empty_batch(const BatchHeader& header, const std::vector<FieldSpec>& fields) {
  Batch batch;
  batch.indices = header.indices;
  batch.epoch = header.epoch;
  batch.sequence = header.sequence;
  batch.names.reserve(fields.size());
  for (const auto& f : fields) batch.names.push_back(f.name);
  return batch;
}

HostBatches::HostBatches(std::shared_ptr<SharedRing> shared, std::vector<FieldSpec> fields,
                         bool pin_memory)
    : shared_(std::move(shared)),
      fields_(std::move(fields)),
      pinned_copy_(pin_memory && cuda_available()) {}

namespace {

// The slot a zero-copy batch views. Armed only once the whole batch is made, so a batch that could
// not be made (an allocation failed) leaves its slot with the caller, as it was.
struct SlotLease {
  std::shared_ptr<SharedRing> shared;
  uint32_t slot = 0;
  bool armed = false;
  ~SlotLease() {
    if (!armed) return;
    shared->held.fetch_sub(1);
    shared->ring.release(slot);
  }
};

}  // namespace

Batch HostBatches::make(uint32_t slot, const BatchHeader& header) {
  SlotRing& ring = shared_->ring;
  Batch batch = empty_batch(header, fields_);
  std::vector<at::Tensor> views = slot_views(ring, slot, fields_, header.indices.size());
  // Zero copy unless that would leave the pipeline without a slot (the user holding every other
  // batch): then this batch is handed out as a copy so iteration can go on.
  const bool zero_copy = shared_->held.load() + 2 <= ring.slots();
  if (!zero_copy || pinned_copy_) {
    for (auto& v : views) {
      batch.fields.push_back(pinned_copy_
                                 ? at::empty(v.sizes(), v.options().pinned_memory(true)).copy_(v)
                                 : v.clone());
    }
    ring.release(slot);  // nothing below throws
    if (!zero_copy) ++copies_to_host_;
    return batch;
  }
  // The slot returns to the ring when the last tensor viewing it is released.
  auto lease = std::make_shared<SlotLease>();
  lease->shared = shared_;
  lease->slot = slot;
  batch.fields.reserve(views.size());
  for (size_t f = 0; f < views.size(); ++f) {
    batch.fields.push_back(at::from_blob(
        ring.field(slot, f), views[f].sizes(), [lease](void*) {},
        at::TensorOptions().dtype(fields_[f].dtype).pinned_memory(false)));
  }
  const size_t held = shared_->held.fetch_add(1) + 1;  // nothing below throws
  CONVEYOR_DEBUG_CHECK(held <= ring.slots(), "at most every slot is leased");
  (void)held;
  lease->armed = true;
  return batch;
}

}  // namespace conveyor::detail
