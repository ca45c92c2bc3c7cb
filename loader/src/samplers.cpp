#include <numeric>
#include <stdexcept>
#include <string>

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
  if (world_size == 0 || rank >= world_size) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) +
                                " is not in [0, " + std::to_string(world_size) + ")");
  }
}

size_t DistributedSampler::per_rank(size_t n) const {
  return drop_last_ ? n / world_size_ : (n + world_size_ - 1) / world_size_;
}

void DistributedSampler::indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const {
  std::vector<size_t> all;
  if (shuffle_) {
    permutation(n, seed_, epoch, all);
  } else {
    all.resize(n);
    std::iota(all.begin(), all.end(), size_t{0});
  }
  const size_t total = per_rank(n) * world_size_;
  if (total > all.size() && !all.empty()) {  // pad by repeating the head, as PyTorch does
    const size_t original = all.size();
    for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i % original]);
  }
  all.resize(total);
  out.clear();
  for (size_t i = rank_; i < total; i += world_size_) out.push_back(all[i]);
}

}  // namespace conveyor
