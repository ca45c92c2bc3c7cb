// conveyor/samplers.h: the order of dataset indices in each epoch: sequential, random, distributed.
// Part of the loader's public interface (conveyor/loader.h includes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "conveyor/loader_state.h"

namespace conveyor {

// Samplers: the order of dataset indices in each epoch.

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Writes the indices of `epoch` for a dataset of `dataset_size` samples into `out`.
  // Must be a pure function of its arguments and the sampler's construction parameters.
  virtual void indices(size_t dataset_size, uint64_t epoch, std::vector<size_t>& out) const = 0;

  // --- Checkpoints (DataLoader::state/load_state, save/load). The defaults suit a sampler used
  // by one process. Keys of the loader's own ("epoch", "batch_size", ...: docs/resume.md) are
  // not the sampler's to write; a sampler's keys start with "sampler".
  // Writes the parameters that shape the order (a seed, a world size, ...).
  virtual void save(LoaderState& state) const;
  // Throws std::invalid_argument naming a parameter in `state` (written by save()) that does
  // not fit this sampler, or is missing, or out of its range. A distributed sampler accepts
  // another world size and rank.
  virtual void check(const LoaderState& state) const;
  // The processes that share each epoch's order (1 unless distributed).
  virtual size_t world_size() const { return 1; }
  // This process's indices for the rest of `epoch` once an earlier job consumed the first
  // `consumed` entries of the epoch's global order (the order before it is shared out among
  // ranks). Default: indices() without its first `consumed` entries.
  virtual void remaining_indices(size_t dataset_size, uint64_t epoch, size_t consumed,
                                 std::vector<size_t>& out) const;
  // What the loader calls: remaining_indices() (indices() when `consumed` is 0) into `out`, and
  // into `repeats` each entry's repeat number, for a sampler that draws a sample several times in
  // an epoch (RASampler): the k-th draw of an index in the epoch's global order is repeat k-1,
  // and its per-sample random choices (crop, flip, batch ops) differ from the other repeats'
  // (SampleContext::repeat, BatchContext::repeats). Default: `repeats` left empty (all 0).
  virtual void remaining_draws(size_t dataset_size, uint64_t epoch, size_t consumed,
                               std::vector<size_t>& out, std::vector<uint32_t>& repeats) const;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  static std::unique_ptr<Sampler> make() { return std::make_unique<SequentialSampler>(); }
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override;
  void save(LoaderState& state) const override;
  void check(const LoaderState& state) const override;
};

// A permutation that is a pure function of (seed, epoch): the same whatever the number of workers,
// different from epoch to epoch.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(uint64_t seed = 0) : seed_(seed) {}
  static std::unique_ptr<Sampler> make(uint64_t seed = 0) {
    return std::make_unique<RandomSampler>(seed);
  }
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override;
  void save(LoaderState& state) const override;
  void check(const LoaderState& state) const override;

 private:
  uint64_t seed_;
};

// PyTorch's DistributedSampler: each of `world_size` ranks gets a disjoint share of one (optionally
// shuffled by seed and epoch) permutation. Without drop_last the permutation is padded by repeating
// its head so every rank gets ceil(n / world_size) indices; with drop_last the tail is dropped so
// every rank gets floor(n / world_size).
//
// Elastic resume: when an epoch is resumed from a checkpoint saved by a job of N ranks into a job
// of M ranks (remaining_indices()), the epoch's global order is the same permutation; its first
// `consumed` entries (what the N ranks had received: N x the batches each received x batch size,
// never padding, since every rank received the same number of batches) are dropped, and the rest
// is shared out over the M ranks by the same rule: padded by repeating the head of the rest so
// that every rank gets ceil(rest / M) (some samples then come twice in that epoch, as with
// PyTorch's padding), or with drop_last its tail dropped so that every rank gets floor(rest / M).
// With M == N the loader instead continues each rank's own order, so a resume is bit-exact.
class DistributedSampler : public Sampler {
 public:
  // The most ranks a job may have: the constructor refuses more, and so does a checkpoint's
  // world size (more than any job runs; a larger number is a corrupt or forged state).
  static constexpr size_t kMaxWorldSize = size_t{1} << 24;
  // Throws std::invalid_argument unless 1 <= world_size <= kMaxWorldSize and rank < world_size.
  DistributedSampler(size_t rank, size_t world_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  static std::unique_ptr<Sampler> make(size_t rank, size_t world_size, bool shuffle = true,
                                       uint64_t seed = 0, bool drop_last = false) {
    return std::make_unique<DistributedSampler>(rank, world_size, shuffle, seed, drop_last);
  }
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override;
  void save(LoaderState& state) const override;
  void check(const LoaderState& state) const override;
  size_t world_size() const override { return world_size_; }
  size_t rank() const { return rank_; }
  void remaining_indices(size_t n, uint64_t epoch, size_t consumed,
                         std::vector<size_t>& out) const override;
  // Indices per rank for a dataset of n samples.
  size_t per_rank(size_t n) const;

 private:
  size_t rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
};

// DeiT's RASampler (repeated augmentation, Hoffer et al. 2020): each sample is drawn
// `num_repeats` times in an epoch, each time with its own random choices, and the repeats are
// spread over the ranks. The epoch's global order is a permutation of (seed, epoch) (0..n-1
// without `shuffle`) with each index repeated num_repeats times in a row (its draws are repeats
// 0, 1, ...); entry p goes to rank p % world_size, so a sample's repeats land on consecutive
// ranks. As DeiT's, an epoch stays the dataset's length: the ranks take the global order's first
// floor(T / world_size) * world_size entries, T = n rounded down to a multiple of
// `selected_round` (256 in DeiT; 0: T = n), floor(T / world_size) each: every rank gets equal
// batches.
//
// Elastic resume (remaining_draws() with consumed > 0, from a job of another world size): the
// global order does not depend on the world size, so the new ranks continue it after its first
// `consumed` entries, floor((T - consumed) / world_size) each. With the same world size the
// loader continues each rank's own order (bit-exact).
class RASampler : public Sampler {
 public:
  // The most repeats: more is a corrupt state or a mistake (DeiT uses 3, torchvision's recipe 4).
  static constexpr uint32_t kMaxRepeats = 1024;
  // Throws std::invalid_argument unless 1 <= world_size <= DistributedSampler::kMaxWorldSize,
  // rank < world_size and 1 <= num_repeats <= kMaxRepeats.
  RASampler(size_t rank, size_t world_size, uint32_t num_repeats = 3, bool shuffle = true,
            uint64_t seed = 0, size_t selected_round = 256);
  static std::unique_ptr<Sampler> make(size_t rank, size_t world_size, uint32_t num_repeats = 3,
                                       bool shuffle = true, uint64_t seed = 0,
                                       size_t selected_round = 256) {
    return std::make_unique<RASampler>(rank, world_size, num_repeats, shuffle, seed,
                                       selected_round);
  }
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override;
  void remaining_indices(size_t n, uint64_t epoch, size_t consumed,
                         std::vector<size_t>& out) const override;
  void remaining_draws(size_t n, uint64_t epoch, size_t consumed, std::vector<size_t>& out,
                       std::vector<uint32_t>& repeats) const override;
  void save(LoaderState& state) const override;
  void check(const LoaderState& state) const override;
  size_t world_size() const override { return world_size_; }
  size_t rank() const { return rank_; }
  uint32_t num_repeats() const { return num_repeats_; }

 private:
  size_t rank_, world_size_;
  uint32_t num_repeats_;
  bool shuffle_;
  uint64_t seed_;
  size_t selected_round_;
};

}  // namespace conveyor
