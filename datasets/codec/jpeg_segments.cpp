// Crop-proportional decoding through restart markers: the layout of a file's restart intervals,
// and the small JPEG of the intervals that cover a box (see jpeg_segments.h).
#include "jpeg_segments.h"

#include <algorithm>
#include <cstring>

namespace conveyor::detail {

namespace {

unsigned word(const uint8_t* p) { return static_cast<unsigned>(p[0]) << 8 | p[1]; }

uint32_t u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | p[3];
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

constexpr uint8_t kIndexMarker = 0xEF;            // APP15
constexpr char kIndexId[] = "CONVEYOR-SEGMENTS";  // with its NUL: 18 bytes
constexpr size_t kIndexIdSize = sizeof kIndexId;
constexpr uint8_t kIndexVersion = 1;
constexpr size_t kIndexHeader = kIndexIdSize + 1 + 4;  // id, version, count

// Whether entropy-coded bytes [begin, end), followed by a marker at `end`, hold no marker: each
// 0xFF in them is a stuffed byte (FF 00) or fill before a marker (FF FF), as the scan below reads
// them.
bool holds_no_marker(const uint8_t* data, size_t begin, size_t end) {
  size_t pos = begin;
  while (pos < end) {
    const void* found = std::memchr(data + pos, 0xFF, end - pos);
    if (found == nullptr) return true;
    const size_t p = static_cast<size_t>(static_cast<const uint8_t*>(found) - data);
    const uint8_t next = data[p + 1];  // p + 1 <= end: the byte at `end` is the marker's 0xFF
    if (next == 0x00) {
      pos = p + 2;
    } else if (next == 0xFF) {
      pos = p + 1;
    } else {
      return false;
    }
  }
  return true;
}

// Fills layout.starts/ends from the index at [index_offset, index_end) of a layout whose header
// has been read; false (vectors cleared) unless every entry checks out: each interval ends on the
// marker it should and holds none, so that the intervals are those a scan finds, in the image's
// own entropy-coded data (not bytes appended after its EOI).
bool read_index(const uint8_t* data, size_t size, size_t segments, SegmentLayout& layout) {
  const uint8_t* body = data + layout.index_offset + 4;
  const size_t body_size = layout.index_end - layout.index_offset - 4;
  const size_t n = u32(body + kIndexIdSize + 1);
  if (n != segments || body_size != kIndexHeader + 2 * n) return false;
  const uint8_t* entry = body + kIndexHeader;
  size_t start = layout.scan_data;
  for (size_t k = 0; k < n; ++k, entry += 2) {
    const size_t end = start + word(entry);
    const uint8_t expected = k + 1 < n ? static_cast<uint8_t>(0xD0 + k % 8) : 0xD9;
    if (end + 1 >= size || data[end] != 0xFF || data[end + 1] != expected ||
        !holds_no_marker(data, start, end)) {
      layout.starts.clear();
      layout.ends.clear();
      return false;
    }
    layout.starts.push_back(static_cast<uint32_t>(start));
    layout.ends.push_back(static_cast<uint32_t>(end));
    start = end + 2;
  }
  return true;
}

}  // namespace

bool read_segment_layout(const uint8_t* data, size_t size, SegmentLayout& layout) {
  // Reset field by field: the vectors keep their capacity from the decoder's last file.
  layout.sof_offset = layout.sof_end = layout.scan_data = 0;
  layout.starts.clear();
  layout.ends.clear();
  layout.width = layout.height = layout.mcu_width = layout.mcu_height = 0;
  layout.mcus_per_row = layout.mcu_rows = layout.interval = 0;
  layout.index_offset = layout.index_end = 0;
  layout.indexed = false;
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return false;
  size_t pos = 2;
  int components = 0;
  bool have_sof = false;
  // The header: marker segments up to the first SOS.
  while (true) {
    while (pos < size && data[pos] == 0xFF && pos + 1 < size && data[pos + 1] == 0xFF) ++pos;
    if (pos + 4 > size || data[pos] != 0xFF) return false;
    const uint8_t marker = data[pos + 1];
    const size_t length = word(data + pos + 2);
    if (length < 2 || pos + 2 + length > size) return false;
    const uint8_t* body = data + pos + 4;
    if (marker == 0xC0 || marker == 0xC1) {  // baseline or extended sequential, Huffman
      if (have_sof || length < 8 || body[0] != 8) return false;
      layout.height = static_cast<int>(word(body + 1));
      layout.width = static_cast<int>(word(body + 3));
      components = body[5];
      if (layout.height == 0 || layout.width == 0 || components < 1 || components > 4 ||
          length != 8 + 3 * static_cast<size_t>(components)) {
        return false;
      }
      int max_h = 1, max_v = 1;
      for (int c = 0; c < components; ++c) {
        const int h = body[7 + 3 * c] >> 4, v = body[7 + 3 * c] & 15;
        if (h < 1 || h > 4 || v < 1 || v > 4) return false;
        max_h = std::max(max_h, h);
        max_v = std::max(max_v, v);
      }
      // A single-component scan's MCU is one 8x8 block, whatever the sampling factors say.
      layout.mcu_width = components == 1 ? 8 : 8 * max_h;
      layout.mcu_height = components == 1 ? 8 : 8 * max_v;
      layout.sof_offset = pos;
      layout.sof_end = pos + 2 + length;
      have_sof = true;
    } else if ((marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                marker != 0xCC) ||
               marker == 0xCC) {
      return false;  // progressive, lossless, hierarchical or arithmetic
    } else if (marker == kIndexMarker && layout.index_end == 0 && length >= 2 + kIndexHeader &&
               std::memcmp(body, kIndexId, kIndexIdSize) == 0 &&
               body[kIndexIdSize] == kIndexVersion) {
      layout.index_offset = pos;
      layout.index_end = pos + 2 + length;
    } else if (marker == 0xDD) {
      if (length != 4) return false;
      layout.interval = static_cast<int>(word(body));
    } else if (marker == 0xDA) {
      if (!have_sof || length < 6 || body[0] != components) return false;  // one interleaved scan
      layout.scan_data = pos + 2 + length;
      break;
    } else if (marker == 0xD8 || marker == 0xD9 || (marker >= 0xD0 && marker <= 0xD7)) {
      return false;
    }
    pos += 2 + length;
  }
  if (layout.interval <= 0) return false;
  layout.mcus_per_row = (layout.width + layout.mcu_width - 1) / layout.mcu_width;
  layout.mcu_rows = (layout.height + layout.mcu_height - 1) / layout.mcu_height;
  if (layout.mcus_per_row % layout.interval != 0) return false;
  const size_t segments = static_cast<size_t>(layout.mcus_per_row) /
                          static_cast<size_t>(layout.interval) *
                          static_cast<size_t>(layout.mcu_rows);
  if (size > UINT32_MAX) return false;
  layout.starts.reserve(segments);
  layout.ends.reserve(segments);
  if (layout.index_end != 0 && read_index(data, size, segments, layout)) {
    layout.indexed = true;
    return true;
  }
  // The entropy-coded data: FF 00 is a stuffed byte, FF FF fill, FF D0..D7 a restart marker (in
  // sequence), FF D9 the end; any other marker inside the scan (DNL, a second scan) is refused.
  pos = layout.scan_data;
  layout.starts.push_back(static_cast<uint32_t>(pos));
  while (true) {
    const void* found = std::memchr(data + pos, 0xFF, size - pos);
    if (found == nullptr) return false;  // no EOI: truncated
    const size_t p = static_cast<size_t>(static_cast<const uint8_t*>(found) - data);
    if (p + 1 >= size) return false;
    const uint8_t next = data[p + 1];
    if (next == 0x00 || next == 0xFF) {
      pos = p + 1 + (next == 0x00 ? 1 : 0);
      continue;
    }
    if (next >= 0xD0 && next <= 0xD7) {
      if (next - 0xD0 != static_cast<int>((layout.ends.size()) % 8)) return false;
      layout.ends.push_back(static_cast<uint32_t>(p));
      if (layout.ends.size() >= segments) return false;  // more intervals than MCUs
      layout.starts.push_back(static_cast<uint32_t>(p + 2));
      pos = p + 2;
      continue;
    }
    if (next == 0xD9) {
      layout.ends.push_back(static_cast<uint32_t>(p));
      break;
    }
    return false;
  }
  return layout.ends.size() == segments;
}

void write_segment_jpeg(const uint8_t* data, const SegmentLayout& layout, int c0, int c1, int r0,
                        int r1, std::vector<uint8_t>& out) {
  out.clear();
  // Everything before the frame header (SOI, APPn, tables) but the segment index, then the frame
  // header with the covered extent, then everything after it up to the scan's data (tables, DRI,
  // SOS).
  if (layout.index_end != 0 && layout.index_end <= layout.sof_offset) {
    out.insert(out.end(), data, data + layout.index_offset);
    out.insert(out.end(), data + layout.index_end, data + layout.sof_offset);
  } else {
    out.insert(out.end(), data, data + layout.sof_offset);
  }
  const size_t sof = out.size();
  out.insert(out.end(), data + layout.sof_offset, data + layout.sof_end);
  const int width = std::min(layout.width - c0 * layout.mcu_width, (c1 - c0) * layout.mcu_width);
  const int height =
      std::min(layout.height - r0 * layout.mcu_height, (r1 - r0) * layout.mcu_height);
  out[sof + 5] = static_cast<uint8_t>(height >> 8);
  out[sof + 6] = static_cast<uint8_t>(height);
  out[sof + 7] = static_cast<uint8_t>(width >> 8);
  out[sof + 8] = static_cast<uint8_t>(width);
  out.insert(out.end(), data + layout.sof_end, data + layout.scan_data);
  const int per_row = layout.mcus_per_row / layout.interval;
  const int first = c0 / layout.interval;
  const int last = (c1 + layout.interval - 1) / layout.interval;  // exclusive
  int written = 0;
  for (int r = r0; r < r1; ++r) {
    for (int s = first; s < last; ++s) {
      const size_t k =
          static_cast<size_t>(r) * static_cast<size_t>(per_row) + static_cast<size_t>(s);
      if (written > 0) {
        out.push_back(0xFF);
        out.push_back(static_cast<uint8_t>(0xD0 + (written - 1) % 8));
      }
      out.insert(out.end(), data + layout.starts[k], data + layout.ends[k]);
      ++written;
    }
  }
  out.push_back(0xFF);
  out.push_back(0xD9);
}

bool add_segment_index(const uint8_t* data, size_t size, std::vector<uint8_t>& out) {
  SegmentLayout layout;
  if (!read_segment_layout(data, size, layout) || layout.index_end != 0) return false;
  const size_t n = layout.ends.size();
  if (n == 0 || n > kMaxIndexedSegments) return false;
  for (size_t k = 0; k < n; ++k) {
    if (layout.ends[k] - layout.starts[k] > 0xFFFF) return false;  // a 16-bit length each
  }
  const size_t marker_size = 4 + kIndexHeader + 2 * n;
  if (size + marker_size > UINT32_MAX) return false;
  out.clear();
  out.reserve(size + marker_size);
  out.insert(out.end(), data, data + layout.sof_offset);
  out.push_back(0xFF);
  out.push_back(kIndexMarker);
  out.push_back(static_cast<uint8_t>((marker_size - 2) >> 8));
  out.push_back(static_cast<uint8_t>(marker_size - 2));
  out.insert(out.end(), kIndexId, kIndexId + kIndexIdSize);
  out.push_back(kIndexVersion);
  put_u32(out, static_cast<uint32_t>(n));
  for (size_t k = 0; k < n; ++k) {
    const uint32_t length = layout.ends[k] - layout.starts[k];
    out.push_back(static_cast<uint8_t>(length >> 8));
    out.push_back(static_cast<uint8_t>(length));
  }
  out.insert(out.end(), data + layout.sof_offset, data + size);
  return true;
}

}  // namespace conveyor::detail
