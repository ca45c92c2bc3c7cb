// datasets/codec/jpeg_segments.h (build-only): crop-proportional decoding through restart markers
// (issue 12). Each restart interval of a baseline JPEG begins byte-aligned with its DC predictors
// reset, so the entropy-coded segments that cover a crop box can be cut out and decoded alone:
// the file's own tables, a frame header of the covered MCU columns and rows, and the covered
// segments with their RST markers renumbered 0..7 in order make a small JPEG that libjpeg-turbo
// decodes as usual. Decode work then follows the box's area, not (box bottom) x (full width).
//
// Requires: a file whose intervals tile its MCU rows (the interval divides the MCUs per row), with
// one interleaved scan (or one component), Huffman coded, 8-bit; read_segment_layout() says
// whether a file is one. conveyor-prepare --restart N writes such files; some cameras do too.
// Guarantees: the small JPEG's pixels are those of the same MCUs in a decode of the whole file,
// except where a filter reaches across the cut (fancy chroma upsampling): the caller keeps one MCU
// of margin there (JpegDecoder does; conveyor-decode-check compares every byte with full decodes).
// The segment index: conveyor-prepare --restart stores where every interval ends in an APP15
// marker segment (add_segment_index), so that nothing is scanned at load time. Its body is
// "CONVEYOR-SEGMENTS\0", a version byte (1), the number of intervals n (32-bit big-endian), then
// for each interval k its length in bytes, 16-bit big-endian: interval 0 starts where the scan's
// data does, the marker that ends interval k (RST for k < n-1, EOI for the last) is at its start
// plus its length, and interval k+1 starts 2 bytes later. read_segment_layout() trusts an index
// only when its count is the file's, every interval ends on the marker it should, in order, and
// no interval holds a marker: then its intervals are exactly those a scan finds, and its EOI is
// the image's own, not a forged one in bytes appended after it (which other decoders never
// read). Otherwise it scans the file, as for files without one. Checking that no interval holds a
// marker reads every byte, as the scan does; what the index saves is the scan's bookkeeping.
// Other readers skip APP15 segments.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace conveyor::detail {

struct SegmentLayout {
  size_t sof_offset = 0;  // the frame header marker segment: [sof_offset, sof_end)
  size_t sof_end = 0;
  size_t scan_data = 0;          // where the entropy-coded data begins (after the SOS header)
  std::vector<uint32_t> starts;  // segment k: bytes [starts[k], ends[k]) of the file
  std::vector<uint32_t> ends;
  int width = 0, height = 0;          // of the image
  int mcu_width = 0, mcu_height = 0;  // in pixels
  int mcus_per_row = 0, mcu_rows = 0;
  int interval = 0;  // MCUs per restart interval; divides mcus_per_row
  // The segment index's marker segment, [index_offset, index_end), when the file has one (both 0
  // otherwise); `indexed` when the intervals were read from it rather than found by a scan.
  size_t index_offset = 0;
  size_t index_end = 0;
  bool indexed = false;
};

// Reads the marker structure and finds every restart interval, reusing `layout`'s vectors (no
// allocation once they have grown to a file's intervals). False (layout unspecified) when
// the file is not one that segments can be cut from, or is damaged; the caller then decodes it
// the usual way, which reports any damage.
bool read_segment_layout(const uint8_t* data, size_t size, SegmentLayout& layout);

// The most intervals one index marker segment can list.
constexpr size_t kMaxIndexedSegments = (65535 - 2 - 18 - 1 - 4) / 2;

// Writes to `out` the file `data` with a segment index inserted before its frame header. False
// (and `out` unspecified) when the file cannot be segmented, already has an index, has more than
// kMaxIndexedSegments intervals or one longer than 65,535 bytes; then the file is used as it is
// and scanned at load time.
bool add_segment_index(const uint8_t* data, size_t size, std::vector<uint8_t>& out);

// Writes to `out` (reusing its capacity) the JPEG of MCU columns [c0, c1) and rows [r0, r1):
// c0 and c1 are multiples of the interval (or c1 is mcus_per_row), r0 < r1 <= mcu_rows. Its
// width and height keep the image's own extent at the right and bottom edges. The segment index,
// if any, is left out.
void write_segment_jpeg(const uint8_t* data, const SegmentLayout& layout, int c0, int c1, int r0,
                        int r1, std::vector<uint8_t>& out);

}  // namespace conveyor::detail
