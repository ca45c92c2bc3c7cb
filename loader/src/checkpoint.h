// loader/src/checkpoint.h (detail): reading and writing a loader's position in a torch archive.
//
// Every value is a named int64 or string attribute of the archive (torch::serialize's own
// convention, as torch's samplers use). Reads name the missing or mismatched field in a
// std::invalid_argument, so a checkpoint that does not fit is refused before anything changes.
#pragma once

#include <cstdint>
#include <string>

#include <torch/serialize/archive.h>

namespace conveyor::detail {

// The position format's version; load() refuses another one.
constexpr int64_t kCheckpointVersion = 1;

void write_int(torch::serialize::OutputArchive& archive, const std::string& key, int64_t value);
void write_string(torch::serialize::OutputArchive& archive, const std::string& key,
                  const std::string& value);
int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key);
std::string read_string(torch::serialize::InputArchive& archive, const std::string& key);

// Throws std::invalid_argument "conveyor: the checkpoint's <what> is <saved> but this loader's is
// <current>" when they differ.
void expect_same(const std::string& what, int64_t saved, int64_t current);
void expect_same(const std::string& what, const std::string& saved, const std::string& current);

}  // namespace conveyor::detail
