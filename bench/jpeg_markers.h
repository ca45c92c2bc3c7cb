// JPEG marker reading for the benchmarks' references and conveyor-decode-check: what user code
// does to learn how a file stores its CMYK, independently of Conveyor's decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace conveyor::bench {

// Whether the JPEG holds an Adobe APP14 marker that libjpeg reads as one (12 bytes or more,
// starting "Adobe"), i.e. whether its CMYK values are stored inverted.
inline bool has_adobe_marker(const std::vector<uint8_t>& d) {
  size_t i = 2;  // after SOI
  while (i + 4 <= d.size()) {
    if (d[i] != 0xFF) return false;
    const uint8_t marker = d[i + 1];
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return false;  // SOS, EOI: no more header markers
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
      i += 2;
      continue;
    }
    const size_t length = static_cast<size_t>(d[i + 2]) << 8 | d[i + 3];
    if (marker == 0xEE && length >= 2 + 12 && i + 4 + 5 <= d.size() &&
        std::memcmp(&d[i + 4], "Adobe", 5) == 0) {
      return true;
    }
    i += 2 + length;
  }
  return false;
}

}  // namespace conveyor::bench
