// datasets/text/printable.h (build-only): the one rule for putting a name that comes from data
// into a message. Names from data (tar member names, keys and shard files from an index, class
// names, labels' text, strings from a checkpoint) are written by whoever made the data, so a raw
// one could fake log lines (a newline then "ERROR ..."), drive the terminal (ESC sequences), or be
// megabytes long. printable() is applied once, where such a name enters a message.
//
// Guarantees: the result is one line of printable text, at most max_bytes plus a short suffix:
//   - printable ASCII is kept; a backslash becomes "\\", so every escape below is unambiguous;
//   - \n, \r and \t become "\n", "\r" and "\t"; other control bytes (C0, DEL), bytes that are not
//     valid UTF-8 and UTF-8's C1 controls (U+0080..U+009F) become "\xHH", one per byte;
//   - the Unicode line and paragraph separators and the bidirectional controls (U+2028, U+2029,
//     U+202A..U+202E, U+2066..U+2069), which reorder or break what a terminal shows, become
//     "\u{HHHH}"; any other valid UTF-8 character is kept;
//   - past max_bytes of output the text is cut (never inside an escape or a character) and
//     "... (N bytes)" says how long the whole was.
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace conveyor::detail {

// Output bytes kept by default before printable() cuts: room for a long path.
constexpr size_t kPrintableBytes = 256;

std::string printable(std::string_view text, size_t max_bytes = kPrintableBytes);

}  // namespace conveyor::detail
