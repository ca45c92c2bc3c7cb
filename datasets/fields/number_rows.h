// datasets/fields/number_rows.h (build-only): a member read as rows of numbers, for the fields
// that read coordinates (boxes, points): the array field's readers (an .npy, a MemberReader's
// array, a JSON list) taking any real or integer dtype, each value as a double.
//
// Guarantees: read_number_rows() fills `out` or throws a std::runtime_error starting with
// `field "NAME": member "M"` that says what the member holds and what the field reads; it never
// stores more than max_rows rows (a member with more is an error naming max_bytes).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "sources/sample_kind.h"

namespace conveyor::detail {

struct NumberRows {
  std::vector<double> values;  // rows * columns, row after row; reused
  size_t rows = 0;
  size_t columns = 0;
};

// How a field reads its rows.
struct RowShape {
  const char* items = "rows";  // what the rows are, for messages: "boxes", "points"
  size_t min_columns = 1;      // the numbers a row may have: min_columns..max_columns
  size_t max_columns = 1;
  size_t flat_columns = 0;  // a flat JSON list's numbers per row; 0: a flat list is refused
  size_t max_rows = 0;      // the field's bound (from its max_bytes)
  size_t max_bytes = 0;     // for messages
};

// Member `member` of field `field` as rows: an .npy or a MemberReader's array of shape [N, C]
// (any bool, integer or floating dtype; C in the shape's bounds; [0] is no rows), a JSON list of
// N lists of C numbers, or (flat_columns > 0) a flat JSON list of N * flat_columns numbers.
void read_number_rows(const std::string& field, const Member& member, const RowShape& shape,
                      NumberRows& out);

}  // namespace conveyor::detail
