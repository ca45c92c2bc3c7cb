// tools/restart_markers.h: conveyor-prepare --restart N. Rewrites a JPEG losslessly, in the DCT
// coefficient domain, with a restart marker every few MCUs, so that crop-proportional decoding
// (issue 12) can cut out the entropy-coded segments that cover a crop box.
//
// Guarantees: the coefficients are those of the input, so a decode of the output gives the same
// pixels as a decode of the input (conveyor-prepare checks this for every file). The output is
// baseline Huffman with optimized tables, whatever the input (progressive and arithmetic files
// are converted), with the input's APP and COM markers (EXIF orientation included). The restart
// interval is the largest divisor of the MCUs per row that is not above the target, so that the
// intervals tile every MCU row.
// Thread safety: a pure function; any number of threads call it at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::tools {

struct RestartRewrite {
  std::vector<uint8_t> jpeg;
  int interval = 0;      // MCUs per restart interval
  int mcus_per_row = 0;  // of the image
};

// The largest divisor of `mcus_per_row` that is at most `target` (at least 1).
int restart_interval_for(int mcus_per_row, int target);

// Throws std::runtime_error with libjpeg's message when the input cannot be read.
RestartRewrite add_restart_markers(const uint8_t* data, size_t size, int target_mcus);

}  // namespace conveyor::tools
