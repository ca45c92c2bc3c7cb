// conveyor-bench --plot: the run's figures as one picture, for people who would rather look than
// read a table. Three panels:
//   - images/s over time, one line per run (Conveyor and each reference, the median round of
//     each), so a slow start, a stall or a drifting machine shows;
//   - the per-batch latency distribution (time between consecutive batches the consumer got), as
//     a cumulative distribution per run that delivers batches;
//   - the time split of each Conveyor run per image: worker time reading, decoding, transforming
//     (resize, flip, layout) and in the engine's other fill work; consumer time issuing copies,
//     waiting for a batch, and in the loop's own work.
// A plain SVG writer (no dependency); FILE.png is that SVG rendered by rsvg-convert (librsvg,
// Debian's librsvg2-bin, which scripts/setup installs).
#pragma once

#include <string>
#include <vector>

#include "bench_runs.h"

namespace conveyor::bench {

// The SVG text of the picture for `runs` (the first is Conveyor's), titled with `caption` lines
// (the command, the machine, the date).
std::string plot_svg(const std::vector<RunResult>& runs, const std::vector<std::string>& caption);

// Writes plot_svg() to `path`: an .svg file as it is, a .png through rsvg-convert. Throws
// std::runtime_error naming the path when it cannot be written, when the name ends in neither, or
// when a .png is asked for and rsvg-convert is missing or fails.
void write_plot(const std::string& path, const std::vector<RunResult>& runs,
                const std::vector<std::string>& caption);

}  // namespace conveyor::bench
