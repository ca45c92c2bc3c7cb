// datasets/storage/command.h (build-only): pipe: locations, a command's standard output, for
// system_storage().
//
// The command runs through /bin/sh -c with the process's environment (its PATH, credentials and
// proxy, as if typed in the user's shell), stdin /dev/null, in a process group of its own. An
// attempt fails when it writes nothing for request_timeout, or exits other than 0 (the reason
// gives the status and the last lines of its stderr); each attempt runs it again, from the start.
// stop() and the destructor kill the group (SIGKILL) and reap the shell, so no process is left
// behind (one that leaves the group, with setsid, is beyond reach).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/storage.h"

namespace conveyor::detail {

std::unique_ptr<ByteStream> open_pipe_stream(const std::string& command,
                                             const RemoteOptions& options,
                                             const StreamCancel& cancel);

// Runs `command` once and reads its whole output into `out` (at most `max_bytes`). Throws
// std::runtime_error naming the command when it could not start, exited other than 0, wrote more
// than `max_bytes`, or nothing for request_timeout.
void read_command_output(const std::string& command, const RemoteOptions& options, size_t max_bytes,
                         std::vector<uint8_t>& out);

}  // namespace conveyor::detail
