// printable (printable.h): names from data made safe for a message.
#include "text/printable.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace conveyor::detail {

namespace {

// The length of the valid UTF-8 sequence at text[i] and its code point, or 0 when the bytes
// there are not one (overlong forms, surrogates and code points past U+10FFFF included).
size_t utf8_sequence(std::string_view text, size_t i, uint32_t& code) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  size_t length = 0;
  uint32_t minimum = 0;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2, code = lead & 0x1fu, minimum = 0x80;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3, code = lead & 0x0fu, minimum = 0x800;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4, code = lead & 0x07u, minimum = 0x10000;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0u) != 0x80u) return 0;
    code = (code << 6) | (byte(i + k) & 0x3fu);
  }
  if (code < minimum || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return length;
}

bool reorders_or_breaks_lines(uint32_t code) {
  return code == 0x2028 || code == 0x2029 || (code >= 0x202a && code <= 0x202e) ||
         (code >= 0x2066 && code <= 0x2069);
}

std::string hex_escape(uint8_t byte) {
  char text[5];
  std::snprintf(text, sizeof text, "\\x%02x", byte);
  return text;
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<uint8_t>(text[i]);
    std::string piece;
    size_t consumed = 1;
    if (byte == '\\') {
      piece = "\\\\";
    } else if (byte == '\n') {
      piece = "\\n";
    } else if (byte == '\r') {
      piece = "\\r";
    } else if (byte == '\t') {
      piece = "\\t";
    } else if (byte >= 0x20 && byte < 0x7f) {
      piece.assign(1, static_cast<char>(byte));
    } else if (byte < 0x80) {
      piece = hex_escape(byte);  // C0 controls and DEL
    } else {
      uint32_t code = 0;
      const size_t length = utf8_sequence(text, i, code);
      if (length == 0 || code < 0xa0) {
        piece = hex_escape(byte);  // not UTF-8, or a C1 control: each byte on its own
        if (length != 0) {
          piece += hex_escape(static_cast<uint8_t>(text[i + 1]));
          consumed = 2;
        }
      } else if (reorders_or_breaks_lines(code)) {
        char escaped[12];
        std::snprintf(escaped, sizeof escaped, "\\u{%04x}", static_cast<unsigned>(code));
        piece = escaped;
        consumed = length;
      } else {
        piece.assign(text.substr(i, length));
        consumed = length;
      }
    }
    if (out.size() + piece.size() > max_bytes) {
      return out + "... (" + std::to_string(text.size()) + " bytes)";
    }
    out += piece;
    i += consumed;
  }
  return out;
}

}  // namespace conveyor::detail
