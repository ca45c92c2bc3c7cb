#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "checkpoint.h"
#include "conveyor/loader.h"
#include "conveyor/random.h"

namespace conveyor {
namespace {

void permutation(size_t n, uint64_t seed, uint64_t epoch, std::vector<size_t>& out) {
  out.resize(n);
  std::iota(out.begin(), out.end(), size_t{0});
  SampleRng rng(seed, epoch, 0x5a3d1e);
  for (size_t i = n; i > 1; --i) {  // Fisher-Yates
    size_t j = static_cast<size_t>(rng.next() % i);
    std::swap(out[i - 1], out[j]);
  }
}

}  // namespace

using detail::expect_same;
using detail::read_int;
using detail::read_int_in;
using detail::read_string;

void Sampler::save(LoaderState& state) const { state.set_string("sampler", "custom"); }

void Sampler::check(const LoaderState& state) const {
  expect_same("sampler", read_string(state, "sampler"), "custom");
}

void Sampler::remaining_indices(size_t n, uint64_t epoch, size_t consumed,
                                std::vector<size_t>& out) const {
  indices(n, epoch, out);
  out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(std::min(consumed, out.size())));
}

void Sampler::remaining_draws(size_t n, uint64_t epoch, size_t consumed, std::vector<size_t>& out,
                              std::vector<uint32_t>& repeats) const {
  if (consumed == 0) {
    indices(n, epoch, out);
  } else {
    remaining_indices(n, epoch, consumed, out);
  }
  repeats.clear();
}

void SequentialSampler::save(LoaderState& state) const {
  state.set_string("sampler", "sequential");
}

void SequentialSampler::check(const LoaderState& state) const {
  expect_same("sampler", read_string(state, "sampler"), "sequential");
}

void RandomSampler::save(LoaderState& state) const {
  state.set_string("sampler", "random");
  state.set_int("sampler_seed", static_cast<int64_t>(seed_));
}

void RandomSampler::check(const LoaderState& state) const {
  expect_same("sampler", read_string(state, "sampler"), "random");
  expect_same("sampler seed", read_int(state, "sampler_seed"), static_cast<int64_t>(seed_));
}

void DistributedSampler::save(LoaderState& state) const {
  state.set_string("sampler", "distributed");
  state.set_int("sampler_seed", static_cast<int64_t>(seed_));
  state.set_int("sampler_shuffle", shuffle_);
  state.set_int("sampler_drop_last", drop_last_);
  state.set_int("sampler_world_size", static_cast<int64_t>(world_size_));
  state.set_int("sampler_rank", static_cast<int64_t>(rank_));
}

void DistributedSampler::check(const LoaderState& state) const {
  expect_same("sampler", read_string(state, "sampler"), "distributed");
  expect_same("sampler seed", read_int(state, "sampler_seed"), static_cast<int64_t>(seed_));
  expect_same("sampler shuffle", read_int(state, "sampler_shuffle"), shuffle_);
  expect_same("sampler drop_last", read_int(state, "sampler_drop_last"), drop_last_);
  // The world size and rank may differ (an elastic resume), but they must be a world and a rank.
  const int64_t world =
      read_int_in(state, "sampler_world_size", 1, static_cast<int64_t>(kMaxWorldSize));
  read_int_in(state, "sampler_rank", 0, world - 1);
}

void SequentialSampler::indices(size_t n, uint64_t, std::vector<size_t>& out) const {
  out.resize(n);
  std::iota(out.begin(), out.end(), size_t{0});
}

void RandomSampler::indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const {
  permutation(n, seed_, epoch, out);
}

DistributedSampler::DistributedSampler(size_t rank, size_t world_size, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (world_size == 0 || world_size > kMaxWorldSize) {
    throw std::invalid_argument("DistributedSampler: world size " + std::to_string(world_size) +
                                " is not in [1, " + std::to_string(kMaxWorldSize) + "]");
  }
  if (rank >= world_size) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) +
                                " is not in [0, " + std::to_string(world_size) + ")");
  }
}

size_t DistributedSampler::per_rank(size_t n) const {
  return drop_last_ ? n / world_size_ : (n + world_size_ - 1) / world_size_;
}

void DistributedSampler::indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const {
  remaining_indices(n, epoch, 0, out);
}

void DistributedSampler::remaining_indices(size_t n, uint64_t epoch, size_t consumed,
                                           std::vector<size_t>& out) const {
  std::vector<size_t> rest;  // the epoch's global order without its first `consumed` entries
  if (shuffle_) {
    permutation(n, seed_, epoch, rest);
  } else {
    rest.resize(n);
    std::iota(rest.begin(), rest.end(), size_t{0});
  }
  rest.erase(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(std::min(consumed, n)));
  const size_t per_rank =
      drop_last_ ? rest.size() / world_size_ : (rest.size() + world_size_ - 1) / world_size_;
  const size_t total = per_rank * world_size_;
  if (total > rest.size() && !rest.empty()) {  // pad by repeating the head, as PyTorch does
    const size_t original = rest.size();
    for (size_t i = 0; rest.size() < total; ++i) rest.push_back(rest[i % original]);
  }
  rest.resize(total);
  out.clear();
  for (size_t i = rank_; i < total; i += world_size_) out.push_back(rest[i]);
}

RASampler::RASampler(size_t rank, size_t world_size, uint32_t num_repeats, bool shuffle,
                     uint64_t seed, size_t selected_round)
    : rank_(rank),
      world_size_(world_size),
      num_repeats_(num_repeats),
      shuffle_(shuffle),
      seed_(seed),
      selected_round_(selected_round) {
  if (world_size == 0 || world_size > DistributedSampler::kMaxWorldSize) {
    throw std::invalid_argument("RASampler: world size " + std::to_string(world_size) +
                                " is not in [1, " +
                                std::to_string(DistributedSampler::kMaxWorldSize) + "]");
  }
  if (rank >= world_size) {
    throw std::invalid_argument("RASampler: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(world_size) + ")");
  }
  if (num_repeats == 0 || num_repeats > kMaxRepeats) {
    throw std::invalid_argument("RASampler: num_repeats " + std::to_string(num_repeats) +
                                " is not in [1, " + std::to_string(kMaxRepeats) + "]");
  }
}

void RASampler::indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const {
  std::vector<uint32_t> repeats;
  remaining_draws(n, epoch, 0, out, repeats);
}

void RASampler::remaining_indices(size_t n, uint64_t epoch, size_t consumed,
                                  std::vector<size_t>& out) const {
  std::vector<uint32_t> repeats;
  remaining_draws(n, epoch, consumed, out, repeats);
}

void RASampler::remaining_draws(size_t n, uint64_t epoch, size_t consumed, std::vector<size_t>& out,
                                std::vector<uint32_t>& repeats) const {
  std::vector<size_t> order;
  if (shuffle_) {
    permutation(n, seed_, epoch, order);
  } else {
    order.resize(n);
    std::iota(order.begin(), order.end(), size_t{0});
  }
  const size_t selected = selected_round_ == 0 ? n : n / selected_round_ * selected_round_;
  const size_t per_rank = (selected - std::min(consumed, selected)) / world_size_;
  // Entry p of the global order is draw p % k of order[p / k]; p < selected <= n <= n * k.
  out.resize(per_rank);
  repeats.resize(per_rank);
  for (size_t j = 0; j < per_rank; ++j) {
    const size_t p = consumed + rank_ + j * world_size_;
    out[j] = order[p / num_repeats_];
    repeats[j] = static_cast<uint32_t>(p % num_repeats_);
  }
}

void RASampler::save(LoaderState& state) const {
  state.set_string("sampler", "repeated_augmentation");
  state.set_int("sampler_seed", static_cast<int64_t>(seed_));
  state.set_int("sampler_shuffle", shuffle_);
  state.set_int("sampler_num_repeats", num_repeats_);
  state.set_int("sampler_selected_round", static_cast<int64_t>(selected_round_));
  state.set_int("sampler_world_size", static_cast<int64_t>(world_size_));
  state.set_int("sampler_rank", static_cast<int64_t>(rank_));
}

void RASampler::check(const LoaderState& state) const {
  expect_same("sampler", read_string(state, "sampler"), "repeated_augmentation");
  expect_same("sampler seed", read_int(state, "sampler_seed"), static_cast<int64_t>(seed_));
  expect_same("sampler shuffle", read_int(state, "sampler_shuffle"), shuffle_);
  expect_same("sampler num_repeats", read_int(state, "sampler_num_repeats"),
              static_cast<int64_t>(num_repeats_));
  expect_same("sampler selected_round", read_int(state, "sampler_selected_round"),
              static_cast<int64_t>(selected_round_));
  const int64_t world = read_int_in(state, "sampler_world_size", 1,
                                    static_cast<int64_t>(DistributedSampler::kMaxWorldSize));
  read_int_in(state, "sampler_rank", 0, world - 1);
}

}  // namespace conveyor
