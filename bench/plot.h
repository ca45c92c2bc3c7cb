// conveyor-bench --plot: the run's figures as one picture (images/s over time per run, the
// per-batch latency distribution, where Conveyor's time goes per image), drawn by matplotlib from
// the bench's JSON (bench/plot.py, which draws only: every figure is the JSON's).
//
// Where things are: the script is conveyor-bench-plot.py beside the conveyor-bench binary (the
// build copies bench/plot.py there, and install puts it beside the installed one). The Python is
// $CONVEYOR_PYTHON, else the one the build was configured with (scripts/configure: the project's
// venv, where scripts/setup installs matplotlib), else python3 on the PATH.
#pragma once

#include <string>

namespace conveyor::bench {

// True when `path` ends in .svg or .png, the kinds matplotlib writes here.
bool is_plot_name(const std::string& path);

// Draws the JSON at `json_path` (what conveyor-bench --json writes) into `path` (.svg or .png).
// Throws std::runtime_error naming the path, the script and the interpreter when the script is
// missing, cannot be run, or fails (its stderr goes to the bench's).
void write_plot(const std::string& path, const std::string& json_path);

}  // namespace conveyor::bench
