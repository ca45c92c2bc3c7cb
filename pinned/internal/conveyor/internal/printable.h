// conveyor/internal/printable.h: the one way an error message quotes a string that came from data
// (a member name in a shard, a string in a checkpoint, a key of a Python state): build-only, like
// the rest of pinned/internal/, which every library of this build includes (the datasets library
// through conveyor_trace, the others through conveyor_pinned).
//
// Data is never trusted, so a message must not carry it raw: a 256 MB string would be copied
// whole into the exception, and a newline or a terminal escape would let a name fake log lines or
// rewrite the terminal. printable() bounds and escapes it:
//   * At most `max` bytes of `text` are shown; a longer text is cut (never inside a UTF-8
//     character) and followed by "... (N bytes)", N its whole length.
//   * ASCII control characters and DEL are escaped: \n, \r, \t, \\ (the backslash itself), and
//     \xNN for the others. Bytes that are not valid UTF-8 are \xNN too, as are the UTF-8 encodings
//     of the C1 controls (U+0080 to U+009F), the line and paragraph separators (U+2028, U+2029)
//     and the bidirectional overrides and isolates (U+202A to U+202E, U+2066 to U+2069), which
//     terminals and editors act on. Valid UTF-8 otherwise shows as itself.
// The result holds no quotes: the caller writes them ('...').
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace conveyor::detail {

namespace printable_detail {

// The length of the valid UTF-8 sequence that starts at `at` (2 to 4), or 0 when it is not one.
inline size_t utf8_length(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[at + i]); };
  const uint8_t lead = byte(0);
  size_t length = 0;
  uint8_t second_min = 0x80;
  uint8_t second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // no overlong forms
    if (lead == 0xED) second_max = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() - at < length) return 0;
  if (byte(1) < second_min || byte(1) > second_max) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

// Whether the valid UTF-8 character at `at` of `length` bytes is one that terminals act on.
inline bool acts_on_terminals(std::string_view text, size_t at, size_t length) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[at + i]); };
  if (length == 2) return byte(0) == 0xC2 && byte(1) <= 0x9F;  // C1 controls
  if (length != 3 || byte(0) != 0xE2) return false;
  if (byte(1) == 0x80) return byte(2) >= 0xA8 && byte(2) <= 0xAE;  // U+2028 to U+202E
  if (byte(1) == 0x81) return byte(2) >= 0xA6 && byte(2) <= 0xA9;  // U+2066 to U+2069
  return false;
}

inline void append_hex(std::string& out, uint8_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out += "\\x";
  out += kDigits[value >> 4];
  out += kDigits[value & 0xF];
}

}  // namespace printable_detail

// `text`, bounded to `max` bytes and escaped as above, for quoting in a message.
inline std::string printable(std::string_view text, size_t max = 200) {
  namespace p = printable_detail;
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const auto byte = static_cast<uint8_t>(text[at]);
    const size_t utf8 = byte >= 0x80 ? p::utf8_length(text, at) : 0;
    const size_t length = utf8 > 0 ? utf8 : 1;
    if (at + length > max) break;
    if (utf8 > 0 && !p::acts_on_terminals(text, at, utf8)) {
      out.append(text.substr(at, utf8));
    } else if (utf8 > 0) {
      for (size_t i = 0; i < utf8; ++i) p::append_hex(out, static_cast<uint8_t>(text[at + i]));
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\r') {
      out += "\\r";
    } else if (byte == '\t') {
      out += "\\t";
    } else if (byte == '\\') {
      out += "\\\\";
    } else if (byte < 0x20 || byte >= 0x7F) {
      p::append_hex(out, byte);
    } else {
      out += static_cast<char>(byte);
    }
    at += length;
  }
  if (at < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// printable(text, max) between single quotes. Built by appends: GCC 12 at -O3 misreads
// "'" + std::string (a false -Wrestrict), which warnings-as-errors turns into a failed build.
inline std::string quoted(std::string_view text, size_t max = 200) {
  std::string out = "'";
  out += printable(text, max);
  out += '\'';
  return out;
}

}  // namespace conveyor::detail
