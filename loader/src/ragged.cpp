#include "ragged.h"

#include <c10/core/ScalarType.h>

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "conveyor/internal/invariant.h"

namespace conveyor::detail {
namespace {

constexpr size_t kCount = sizeof(int64_t);  // a RaggedRow's count

// a * b, or false when it does not fit a size_t.
bool multiply(size_t a, size_t b, size_t& out) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a) return false;
  out = a * b;
  return true;
}
bool add(size_t a, size_t b, size_t& out) {
  if (b > std::numeric_limits<size_t>::max() - a) return false;
  out = a + b;
  return true;
}

size_t offsets_at(const FieldSpec& field, size_t batch_size) {
  return (batch_size * field.sample_bytes() + kCount - 1) / kCount * kCount;
}

}  // namespace

size_t field_region_bytes(const FieldSpec& field, size_t batch_size) {
  if (!field.ragged()) return field.sample_bytes() * batch_size;
  const std::string which = "conveyor: ragged field '" + field.name + "'";
  size_t item = c10::elementSize(field.dtype);
  for (int64_t d : field.sample_shape) {
    if (d <= 0) {
      throw std::invalid_argument(which +
                                  ": each dim of an item's sample_shape must be positive, "
                                  "got " +
                                  std::to_string(d));
    }
    if (!multiply(item, static_cast<size_t>(d), item)) item = 0;
  }
  size_t row = 0, all_rows = 0, padded = 0, offsets = 0, region = 0;
  const bool fits = item != 0 && multiply(field.max_items, item, row) && add(row, kCount, row) &&
                    multiply(row, batch_size, all_rows) && add(all_rows, kCount - 1, padded) &&
                    multiply(batch_size + 1, kCount, offsets) &&
                    add(padded / kCount * kCount, offsets, region);
  if (!fits) {
    throw std::invalid_argument(which + ": max_items " + std::to_string(field.max_items) +
                                " items of its shape, times batch_size " +
                                std::to_string(batch_size) + ", overflow the slot's size");
  }
  return region;
}

int64_t* ragged_offsets(std::byte* region, const FieldSpec& field, size_t batch_size) {
  return reinterpret_cast<int64_t*>(region + offsets_at(field, batch_size));
}

const int64_t* ragged_offsets(const std::byte* region, const FieldSpec& field, size_t batch_size) {
  return reinterpret_cast<const int64_t*>(region + offsets_at(field, batch_size));
}

int64_t plan_ragged(std::byte* region, const FieldSpec& field, size_t rows, size_t batch_size) {
  CONVEYOR_CHECK(field.ragged() && rows <= batch_size, "a ragged field's rows fit the batch");
  int64_t* offsets = ragged_offsets(region, field, batch_size);
  const auto max_items = static_cast<int64_t>(field.max_items);
  int64_t total = 0;
  offsets[0] = 0;
  for (size_t r = 0; r < rows; ++r) {
    const int64_t count = RaggedRow(region + r * field.sample_bytes()).count();
    CONVEYOR_CHECK(count >= 0 && count <= max_items,
                   "a source writes 0 .. max_items items in a ragged field's row");
    total += count;
    offsets[r + 1] = total;
  }
  return total;
}

void compact_ragged(std::byte* region, const FieldSpec& field, size_t rows,
                    size_t batch_size) noexcept {
  const int64_t* offsets = ragged_offsets(region, field, batch_size);
  const size_t item = field.item_bytes();
  for (size_t r = 0; r < rows; ++r) {
    const auto first = static_cast<size_t>(offsets[r]);
    const auto count = static_cast<size_t>(offsets[r + 1]) - first;
    // The destination lies at or before the source, and before any later row's count.
    std::memmove(region + first * item, region + r * field.sample_bytes() + kCount, count * item);
  }
}

void gather_ragged(const std::byte* region, const FieldSpec& field, size_t rows, size_t batch_size,
                   std::byte* out) noexcept {
  const int64_t* offsets = ragged_offsets(region, field, batch_size);
  const size_t item = field.item_bytes();
  for (size_t r = 0; r < rows; ++r) {
    const auto first = static_cast<size_t>(offsets[r]);
    const auto count = static_cast<size_t>(offsets[r + 1]) - first;
    std::memcpy(out + first * item, region + r * field.sample_bytes() + kCount, count * item);
  }
}

}  // namespace conveyor::detail
