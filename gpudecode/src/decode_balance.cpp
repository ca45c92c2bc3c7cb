// fixed_share_decoder() and DecodeBalancer (conveyor/decode_balance.h).
#include "conveyor/decode_balance.h"

#include <algorithm>

namespace conveyor {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr size_t kCpu = 0, kGpu = 1;
size_t slot(Decoder d) { return d == Decoder::kCpu ? kCpu : kGpu; }

}  // namespace

Decoder fixed_share_decoder(double share, uint64_t seed, uint64_t epoch, size_t index) {
  if (!(share > 0.0)) return Decoder::kCpu;  // NaN and <= 0
  if (share >= 1.0) return Decoder::kGpu;
  // Its own stream (another constant than SampleRng's), so the decoder is independent of the
  // sample's crop and flip.
  const uint64_t h =
      splitmix64(splitmix64(splitmix64(seed ^ 0x6A09E667F3BCC909ull) ^ epoch) ^ uint64_t{index});
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return u < share ? Decoder::kGpu : Decoder::kCpu;
}

DecodeBalancer::DecodeBalancer(size_t cpu_workers, bool gpu_available,
                               std::chrono::nanoseconds cpu_prior_per_image, size_t gpu_batch)
    : workers_(std::max<size_t>(cpu_workers, 1)),
      gpu_available_(gpu_available),
      gpu_batch_(gpu_batch) {
  const double prior = std::max(1.0, static_cast<double>(cpu_prior_per_image.count()));
  cost_ns_[kCpu] = prior;
  cost_ns_[kGpu] = prior / static_cast<double>(workers_);
}

Decoder DecodeBalancer::assign(size_t images) {
  std::lock_guard<std::mutex> lock(mutex_);
  Decoder d = Decoder::kCpu;
  if (gpu_available_) {
    if (chunks_[kGpu] == 0 || backlog_[kGpu] < gpu_batch_) {
      d = Decoder::kGpu;  // the engines would idle, or decode a batch short
    } else if (chunks_[kCpu] < workers_) {
      d = Decoder::kCpu;  // a worker would idle
    } else {
      // Both busy: the queue that drains this chunk first (the CPU's workers share theirs).
      const double cpu_done = static_cast<double>(backlog_[kCpu] + images) * cost_ns_[kCpu] /
                              static_cast<double>(workers_);
      const double gpu_done = static_cast<double>(backlog_[kGpu] + images) * cost_ns_[kGpu];
      d = gpu_done < cpu_done ? Decoder::kGpu : Decoder::kCpu;
    }
  }
  ++chunks_[slot(d)];
  backlog_[slot(d)] += images;
  assigned_[slot(d)] += images;
  return d;
}

void DecodeBalancer::finished(Decoder decoder, size_t images, std::chrono::nanoseconds busy) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t s = slot(decoder);
  backlog_[s] -= std::min(backlog_[s], images);
  if (chunks_[s] > 0) --chunks_[s];
  if (images == 0) return;
  const double per_image =
      std::max(1.0, static_cast<double>(busy.count()) / static_cast<double>(images));
  cost_ns_[s] = measured_[s] ? 0.75 * cost_ns_[s] + 0.25 * per_image : per_image;
  measured_[s] = true;
}

void DecodeBalancer::abandoned(Decoder decoder, size_t images) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t s = slot(decoder);
  backlog_[s] -= std::min(backlog_[s], images);
  if (chunks_[s] > 0) --chunks_[s];
}

DecodeBalancer::Snapshot DecodeBalancer::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot s;
  s.cpu_images = assigned_[kCpu];
  s.gpu_images = assigned_[kGpu];
  s.cpu_backlog = backlog_[kCpu];
  s.gpu_backlog = backlog_[kGpu];
  s.cpu_ns_per_image = cost_ns_[kCpu];
  s.gpu_ns_per_image = cost_ns_[kGpu];
  return s;
}

}  // namespace conveyor
