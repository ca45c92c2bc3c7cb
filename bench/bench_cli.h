// conveyor-bench's command line: CLI11 (Debian's libcli11-dev) parses it and writes --help from
// the options' own descriptions; the checks that span options (a folder for --compare, the
// dataset to generate) follow the parse.
#pragma once

#include "bench_runs.h"

namespace conveyor::bench {

// The configuration the command line asks for; generates (once, cached) the default dataset when
// no --data is given. Exits 0 after --help or --generate-only, 2 after a usage error (the message
// and the help on stderr).
BenchConfig parse_command_line(int argc, char** argv);

}  // namespace conveyor::bench
