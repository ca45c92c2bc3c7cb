// loader/src/checkpoint.h (detail): reading and writing a loader's position in a torch archive.
//
// Every value is a named int64 or string attribute of the archive (torch::serialize's own
// convention, as torch's samplers use). Reads name the missing or mismatched field in a
// std::invalid_argument, so a checkpoint that does not fit is refused before anything changes.
#pragma once

#include <cstddef>
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

// A loader's position: where its epoch's batches come from and how far the consumer got.
struct CheckpointPosition {
  uint64_t epoch = 0;
  size_t base = 0;        // entries of the epoch's global order consumed before this order
  size_t world = 1;       // the ranks that shared this order out
  size_t received = 0;    // batches of this order the consumer received
  bool complete = false;  // the epoch had no batch left
};

// What shapes the order besides the sampler: a checkpoint fits only a loader with the same.
struct OrderShape {
  uint64_t seed;
  size_t batch_size;
  bool drop_last;
  size_t dataset_size;
};

// The format of DataLoader::save (the sampler's fields are the sampler's own).
void write_position(torch::serialize::OutputArchive& archive, const CheckpointPosition& position,
                    const OrderShape& shape);
// Checks the format version and `shape` against the checkpoint, naming the first field that
// differs (batch_size, drop_last, dataset size, seed, in that order).
void check_shape(torch::serialize::InputArchive& archive, const OrderShape& shape);
// Reads the position, refusing one that save() never writes (negative, or a base past the data).
CheckpointPosition read_position(torch::serialize::InputArchive& archive, size_t dataset_size);

// Throws std::invalid_argument "conveyor: the checkpoint's <what> is <saved> but this loader's is
// <current>" when they differ.
void expect_same(const std::string& what, int64_t saved, int64_t current);
void expect_same(const std::string& what, const std::string& saved, const std::string& current);

}  // namespace conveyor::detail
