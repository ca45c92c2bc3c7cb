#include "host_batch.h"

#include <ATen/ATen.h>

#include "invariant.h"

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
    ring.release(slot);
    if (!zero_copy) ++copies_to_host_;
    return batch;
  }
  // The slot returns to the ring when the last tensor viewing it is released.
  const size_t held = shared_->held.fetch_add(1) + 1;
  CONVEYOR_DEBUG_CHECK(held <= ring.slots(), "at most every slot is leased");
  (void)held;
  std::shared_ptr<void> lease(nullptr, [shared = shared_, slot](void*) {
    shared->held.fetch_sub(1);
    shared->ring.release(slot);
  });
  for (size_t f = 0; f < views.size(); ++f) {
    batch.fields.push_back(at::from_blob(
        ring.field(slot, f), views[f].sizes(), [lease](void*) {},
        at::TensorOptions().dtype(fields_[f].dtype).pinned_memory(false)));
  }
  return batch;
}

}  // namespace conveyor::detail
