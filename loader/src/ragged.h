// loader/src/ragged.h (detail): a ragged field (FieldSpec::ragged) in a batch slot, and its
// jagged layout (values + offsets) for the batch.
//
// A ragged field's region in a slot, for batch_size B and row bytes S = sample_bytes():
//   [0, B * S)                     the rows, each a RaggedRow, as the workers wrote them;
//   [offsets_at, offsets_at + 8 * (B + 1))   the batch's offsets, written by the consumer
//                                  (offsets_at = B * S rounded up to 8: int64-aligned, as the
//                                  region starts 256-byte aligned).
// Handing a batch out takes two steps, so a step that may fail never leaves the slot half done:
//   1. plan_ragged(): reads every row's count (before anything moves), checks it (0 ..
//      max_items: an invariant, CONVEYOR_CHECK, since sources never write more) and writes the
//      offsets. It moves nothing, so it may run again on the same slot.
//   2. compact_ragged(): moves row r's items to follow row r-1's, front to back; values then are
//      the region's first total * item_bytes bytes. Every destination lies at or before its
//      source (offsets[r] * item_bytes <= r * S + 8), so nothing is read after it is overwritten.
//      Runs once per filled slot, and cannot fail.
// Or, instead of step 2, gather_ragged() copies the used items out of the rows as they are (a
// batch handed out as a copy): the slot is not changed.
// Thread safety: on the consumer thread, for a slot it owns (kReady).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "conveyor/datasets.h"

namespace conveyor::detail {

// The bytes of `field`'s region in a slot: B * sample_bytes(), and for a ragged field its offsets
// as above. Throws std::invalid_argument naming the field when a ragged field's sample_shape has
// a dim <= 0, or the region's size does not fit a size_t.
size_t field_region_bytes(const FieldSpec& field, size_t batch_size);

// A ragged field's offsets in its region (int64 [batch_size + 1] room).
int64_t* ragged_offsets(std::byte* region, const FieldSpec& field, size_t batch_size);
const int64_t* ragged_offsets(const std::byte* region, const FieldSpec& field, size_t batch_size);

// Step 1: reads the counts of rows [0, rows), checks each, writes offsets[0 .. rows] and returns
// the total of items. Idempotent.
int64_t plan_ragged(std::byte* region, const FieldSpec& field, size_t rows, size_t batch_size);

// Step 2, after plan_ragged(): packs the items of rows [0, rows) at the region's start.
void compact_ragged(std::byte* region, const FieldSpec& field, size_t rows,
                    size_t batch_size) noexcept;

// After plan_ragged() (instead of step 2): copies the used items of rows [0, rows) to `out`
// (room for the total of items), the slot unchanged.
void gather_ragged(const std::byte* region, const FieldSpec& field, size_t rows, size_t batch_size,
                   std::byte* out) noexcept;

}  // namespace conveyor::detail
