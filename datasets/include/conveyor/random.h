// conveyor/random.h: the deterministic random stream behind samplers and augmentations.
//
// SampleRng is a small splitmix64 generator whose stream is a pure function of (seed, epoch,
// index[, view]), so an augmentation or a permutation does not depend on which worker runs it or
// when. Guarantees: the same stream on every platform (no std:: distributions involved).
#pragma once

#include <cstddef>
#include <cstdint>

namespace conveyor {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The seed of repeat `repeat` of a sample that a sampler draws several times in one epoch
// (RASampler: repeated augmentation). Repeat 0 is `seed` itself, so a sample drawn once keeps
// today's streams bit for bit; each other repeat mixes its number in, so that every per-sample
// stream keyed on (repeat_seed(seed, repeat), epoch, index[, view]) differs between repeats.
inline uint64_t repeat_seed(uint64_t seed, uint32_t repeat) {
  return repeat == 0 ? seed : splitmix64(seed ^ splitmix64(0x5245504541540000ull | repeat));
}

class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, size_t index)
      : state_(splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ static_cast<uint64_t>(index))) {}
  // View `view` of the sample (conveyor/image_plan.h): view 0 is the stream above, exactly; each
  // other view's stream starts from that state mixed with the view's number.
  SampleRng(uint64_t seed, uint64_t epoch, size_t index, uint64_t view)
      : SampleRng(seed, epoch, index) {
    if (view != 0) state_ = splitmix64(state_ ^ splitmix64(view));
  }
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return splitmix64(state_);
  }
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }
  // Uniform integer in [lo, hi_exclusive).
  int randint(int lo, int hi_exclusive) {
    uint64_t span = static_cast<uint64_t>(hi_exclusive - lo);
    return lo + static_cast<int>(next() % span);
  }

 private:
  uint64_t state_;
};

}  // namespace conveyor
