// loader/src/checkpoint.h (detail): reading and writing a loader's position as a LoaderState,
// and the torch archive that carries one.
//
// One reader of the fields for both carriers: DataLoader::load_state() reads a LoaderState, and
// DataLoader::load() turns an archive into one first (read_archive). Every read names the
// missing, mistyped or out-of-range field (and its value, quoted through printable()) in a
// std::invalid_argument, so a state that does not fit is refused before anything changes and
// before any of its numbers enters arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/serialize/archive.h>

#include "conveyor/loader.h"

namespace conveyor::detail {

// The position format's version; load() refuses another one.
constexpr int64_t kCheckpointVersion = 1;

int64_t read_int(const LoaderState& state, const std::string& key);
// read_int() in [min, max], or std::invalid_argument "the checkpoint's '<key>' is <value>, not
// <meaning>" (e.g. "not in [1, 16777216]").
int64_t read_int_in(const LoaderState& state, const std::string& key, int64_t min, int64_t max);
// 0 or 1.
bool read_flag(const LoaderState& state, const std::string& key);
const std::string& read_string(const LoaderState& state, const std::string& key);
const std::vector<int64_t>& read_list(const LoaderState& state, const std::string& key);

// The archive carrier: integers and strings as attributes, lists as one-dimensional int64
// tensors (buffers). read_archive() reads every attribute but torch's own "training" flag, and
// throws std::invalid_argument naming an attribute of another kind.
void write_archive(torch::serialize::OutputArchive& archive, const LoaderState& state);
LoaderState read_archive(torch::serialize::InputArchive& archive);

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

// The format of DataLoader::state (the sampler's fields are the sampler's own).
void write_position(LoaderState& state, const CheckpointPosition& position,
                    const OrderShape& shape);
// Checks the format version and `shape` against the checkpoint, naming the first field that
// differs (batch_size, drop_last, dataset size, seed, in that order).
void check_shape(const LoaderState& state, const OrderShape& shape);
// Reads the position, refusing one that save() never writes: a negative number, an epoch
// complete with no epoch after it, a base past the data, a world size outside
// [1, DistributedSampler::kMaxWorldSize].
CheckpointPosition read_position(const LoaderState& state, size_t dataset_size);
// For a loader whose sampler shares each order among `world` ranks: refuses a position that
// cannot be continued by it. When the saved world differs (an elastic resume), the saved ranks
// received `received` batches each of an equal share of the rest of the order, at most
// ceil((dataset_size - base) / world) entries, so `received` is at most that share's batches.
void check_position(const CheckpointPosition& position, const OrderShape& shape, size_t world);
// An elastic resume's base: what the saved ranks consumed of the epoch's global order,
// base + world x received x batch_size, at most dataset_size (overflow-safe).
size_t elastic_base(const CheckpointPosition& position, size_t batch_size, size_t dataset_size);
// When a loader continues its own order: refuses more batches received than the order has.
void check_received(const CheckpointPosition& position, size_t batches);

// Throws std::invalid_argument "conveyor: the checkpoint's <what> is <saved> but this loader's is
// <current>" when they differ (strings quoted through printable()).
void expect_same(const std::string& what, int64_t saved, int64_t current);
void expect_same(const std::string& what, const std::string& saved, const std::string& current);

}  // namespace conveyor::detail
