// datasets/fields/npy.h (build-only): numpy's .npy format, read from bytes that come from the
// data (a shard's member), so as data only: nothing in it is ever evaluated or unpickled.
//
// The format (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte (1.0,
// 2.0 or 3.0), the header's length (u16 little-endian for 1.0, u32 for 2.0 and 3.0), the header:
// a Python dict literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces and ended by '\n', then the array's bytes in C order.
//
// What parse_npy reads:
//   - the header with a small strict reader of exactly that literal: the three keys, each once,
//     in any order, quoted with ' or "; a tuple of decimal integers; True or False. Anything else
//     (another key, an expression, a call, an escape, a non-ASCII byte) is refused;
//   - descr: a byte order ('<' little-endian, or '|' for one-byte types; '<' for them too) and
//     one of b1 (bool), i1 i2 i4 i8, u1 u2 u4 u8, f2 f4 f8, c8 c16 (complex), each to the torch
//     dtype of the same size and kind (torch has uint16/32/64 since 2.3).
// What it refuses, each with a std::runtime_error that starts "npy: " and says what is wrong:
//   - dtype object ('|O'): its data is a pickle, and a pickle is never unpickled (numpy's own
//     allow_pickle=False rule);
//   - structured dtypes (descr a list), strings, datetimes and other types torch has no dtype for;
//   - big-endian data ('>'): the array is returned as a view of the bytes, without a copy, so
//     it is never byte-swapped (save it with arr.astype(arr.dtype.newbyteorder('<')));
//   - fortran_order True (it would need a transposing copy: save np.ascontiguousarray(arr));
//   - more than kMaxNpyDims dimensions, negative dimensions, a shape whose bytes overflow;
//   - data shorter than the shape needs, and data longer than it (a .npy holds one array, so
//     bytes after it mean the file is not what it claims).
// Requires: data points to `size` readable bytes (size 0 allowed). Guarantees: on success
// `data` of the result points into the input, `bytes` is exactly the shape's product times the
// dtype's size, and nothing has been allocated but the shape's vector (at most kMaxNpyDims).
// Pure: no state, safe from any thread.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace conveyor::detail {

// The most dimensions parse_npy accepts (numpy 2's own limit).
constexpr size_t kMaxNpyDims = 64;

struct NpyArray {
  c10::ScalarType dtype = c10::ScalarType::Byte;
  std::vector<int64_t> shape;     // empty for a 0-d array (one element)
  const uint8_t* data = nullptr;  // into the parsed bytes; C order, little-endian
  size_t bytes = 0;               // the product of `shape` times the dtype's size
};

NpyArray parse_npy(const uint8_t* data, size_t size);

}  // namespace conveyor::detail
