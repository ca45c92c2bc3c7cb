#include "host_batch.h"

#include <ATen/ATen.h>

#include "conveyor/internal/invariant.h"
#include "ragged.h"

namespace conveyor::detail {

namespace {

std::vector<int64_t> shape_of(int64_t leading, const FieldSpec& field) {
  std::vector<int64_t> shape{leading};
  shape.insert(shape.end(), field.sample_shape.begin(), field.sample_shape.end());
  return shape;
}

}  // namespace

SlotTensors slot_views(const SlotRing& ring, uint32_t slot, const std::vector<FieldSpec>& fields,
                       size_t rows, size_t batch_size) {
  SlotTensors views;
  views.fields.reserve(fields.size());
  views.offsets.resize(fields.size());
  for (size_t f = 0; f < fields.size(); ++f) {
    const FieldSpec& field = fields[f];
    std::byte* region = ring.field(slot, f);
    const auto options = at::TensorOptions().dtype(field.dtype);
    if (!field.ragged()) {
      views.fields.push_back(
          at::from_blob(region, shape_of(static_cast<int64_t>(rows), field), options));
      continue;
    }
    const int64_t total = plan_ragged(region, field, rows, batch_size);
    views.fields.push_back(at::from_blob(region, shape_of(total, field), options));
    views.offsets[f] = at::from_blob(ragged_offsets(region, field, batch_size),
                                     {static_cast<int64_t>(rows) + 1}, at::dtype(at::kLong));
  }
  return views;
}

void compact_slot(const SlotRing& ring, uint32_t slot, const std::vector<FieldSpec>& fields,
                  size_t rows, size_t batch_size, bool skip_host_only) noexcept {
  for (size_t f = 0; f < fields.size(); ++f) {
    if (!fields[f].ragged() || (skip_host_only && fields[f].host_only)) continue;
    compact_ragged(ring.field(slot, f), fields[f], rows, batch_size);
  }
}

void copy_field(const SlotRing& ring, uint32_t slot, const std::vector<FieldSpec>& fields, size_t f,
                const SlotTensors& views, size_t batch_size, bool pinned, at::Tensor& values,
                at::Tensor& offsets) {
  const at::Tensor& view = views.fields[f];
  values = at::empty(view.sizes(), view.options().pinned_memory(pinned));
  if (!fields[f].ragged()) {
    values.copy_(view);
    offsets = at::Tensor();
    return;
  }
  const at::Tensor& offsets_view = views.offsets[f];
  offsets = at::empty(offsets_view.sizes(), offsets_view.options().pinned_memory(pinned));
  offsets.copy_(offsets_view);
  const size_t rows = static_cast<size_t>(offsets_view.size(0)) - 1;
  if (values.numel() == 0) return;  // no item to copy
  gather_ragged(ring.field(slot, f), fields[f], rows, batch_size,
                static_cast<std::byte*>(values.data_ptr()));
}

Batch empty_batch(const BatchHeader& header, const std::vector<FieldSpec>& fields) {
  Batch batch;
  batch.indices = header.indices;
  batch.repeats = header.repeats;
  batch.augment_params = header.augment_params;
  batch.epoch = header.epoch;
  batch.sequence = header.sequence;
  batch.names.reserve(fields.size());
  for (const auto& f : fields) batch.names.push_back(f.name);
  return batch;
}

HostBatches::HostBatches(std::shared_ptr<SharedRing> shared, std::vector<FieldSpec> fields,
                         size_t batch_size, bool pin_memory)
    : shared_(std::move(shared)),
      fields_(std::move(fields)),
      batch_size_(batch_size),
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
  const size_t rows = header.indices.size();
  Batch batch = empty_batch(header, fields_);
  SlotTensors views = slot_views(ring, slot, fields_, rows, batch_size_);
  batch.fields.resize(fields_.size());
  batch.offsets.resize(fields_.size());
  // Zero copy unless that would leave the pipeline without a slot (the user holding every other
  // batch): then this batch is handed out as a copy so iteration can go on.
  const bool zero_copy = shared_->held.load() + 2 <= ring.slots();
  if (!zero_copy || pinned_copy_) {
    for (size_t f = 0; f < fields_.size(); ++f) {
      copy_field(ring, slot, fields_, f, views, batch_size_, pinned_copy_, batch.fields[f],
                 batch.offsets[f]);
    }
    ring.release(slot);  // nothing below throws
    if (!zero_copy) ++copies_to_host_;
    return batch;
  }
  // The slot returns to the ring when the last tensor viewing it is released.
  auto lease = std::make_shared<SlotLease>();
  lease->shared = shared_;
  lease->slot = slot;
  const auto leased = [&lease](void* data, const at::Tensor& view) {
    return at::from_blob(
        data, view.sizes(), [lease](void*) {},
        at::TensorOptions().dtype(view.dtype()).pinned_memory(false));
  };
  for (size_t f = 0; f < fields_.size(); ++f) {
    std::byte* region = ring.field(slot, f);
    batch.fields[f] = leased(region, views.fields[f]);
    if (fields_[f].ragged()) {
      batch.offsets[f] = leased(ragged_offsets(region, fields_[f], batch_size_), views.offsets[f]);
    }
  }
  compact_slot(ring, slot, fields_, rows, batch_size_, /*skip_host_only=*/false);
  const size_t held = shared_->held.fetch_add(1) + 1;  // nothing below throws
  CONVEYOR_DEBUG_CHECK(held <= ring.slots(), "at most every slot is leased");
  (void)held;
  lease->armed = true;
  return batch;
}

}  // namespace conveyor::detail
