// datasets/fields/json_value.h (build-only): JSON text from the data (a manifest's cell, a
// shard's .json member), checked and read without trusting it: every value is checked against
// RFC 8259's grammar (strings valid UTF-8, surrogate escapes paired), arrays and objects are
// refused as they open once they nest deeper than the caller's bound, so no input can make the
// reader recurse or allocate without bound, and the readers below allocate nothing on a
// well-formed value but their outputs (within the bound each states).
//
// Text is "one JSON value": optional whitespace (space, tab, CR, LF), the value, optional
// whitespace, nothing else. A UTF-8 byte order mark is not whitespace (the manifest reader drops
// one at the start of a file, manifest_table.h).
//
// Pure functions: no state, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::detail {

// The deepest `max_depth` that check_json and skip_json_value accept (they recurse once per
// level).
constexpr size_t kMaxJsonCheckDepth = 1024;

// Requires: max_depth <= kMaxJsonCheckDepth (std::invalid_argument otherwise).
// Guarantees: returns when `text` is one well-formed JSON value whose arrays and objects nest at
// most `max_depth` deep (a scalar is depth 0, [] and {} depth 1, [[1]] depth 2); otherwise throws
// std::runtime_error starting "json: " that says what is wrong and at which byte, refusing an
// array or object as soon as it opens deeper than `max_depth`.
void check_json(std::string_view text, size_t max_depth);

// The end of the JSON value that starts at text[at] (no whitespace before it), checked as
// check_json checks: the position just after it. Errors as check_json's. For readers of larger
// texts (a JSON Lines row) that need each value's extent.
size_t skip_json_value(std::string_view text, size_t at, size_t max_depth);

// The readers: each returns false, leaving `out` unspecified, when `text` is not one JSON value
// of its kind (malformed text included); true with the value in `out` otherwise.
//
// A string, unescaped (\uXXXX pairs to UTF-8) into `out` (its capacity is reused).
bool json_string(std::string_view text, std::string& out);
// An integer: a JSON number without fraction or exponent, within int64 (-0 is 0).
bool json_integer(std::string_view text, int64_t& out);
// Any JSON number within double's range (1e999 is refused, not infinity), rounded to the nearest
// double (1e-400 is 0).
bool json_number(std::string_view text, double& out);
// An array of numbers ([] included), as json_number reads each, into `out` (cleared first, its
// capacity reused). Throws std::length_error "json: a list of more than N numbers" when the list
// has more than `max_items`, after at most max_items items were stored: `out` never grows past
// max_items, whatever the text.
bool json_number_list(std::string_view text, std::vector<double>& out, size_t max_items);
// A list of lists of numbers, every inner list of the same length ([] and [[], []] included):
// their numbers, row after row, into `out` (cleared first) and the inner lists' length into
// `columns` (0 for []). Throws as json_number_list past max_items numbers in all; false for
// anything else (a flat list, rows of different lengths, deeper nesting).
bool json_number_rows(std::string_view text, std::vector<double>& out, size_t& columns,
                      size_t max_items);

}  // namespace conveyor::detail
