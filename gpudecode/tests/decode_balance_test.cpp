// The hybrid's balance (conveyor/decode_balance.h) with simulated decoders: W CPU workers and one
// GPU decoder whose costs per image are given, on a simulated clock, fed chunk by chunk with a
// bounded number of chunks in flight as the loader's slots bound them.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <queue>
#include <vector>

#include "conveyor/decode_balance.h"

namespace conveyor {
namespace {

using std::chrono::nanoseconds;

struct SimResult {
  double makespan_ns = 0;
  double ideal_ns = 0;     // images / (sum of both rates)
  double cpu_idle_ns = 0;  // CPU worker time idle while the GPU had work queued
  double gpu_idle_ns = 0;  // GPU time idle while the CPU had work queued
  double gpu_share = 0;    // of the images
};

// The GPU's cost per image may change after `change_at` images were assigned (a slowdown).
SimResult simulate(size_t workers, double cpu_ns, double gpu_ns, size_t images, size_t chunk,
                   size_t max_in_flight, double gpu_ns_later = -1, size_t change_at = 0) {
  DecodeBalancer balancer(workers, true, nanoseconds(3'000'000));
  struct Event {
    double time;
    Decoder decoder;
    size_t images;
    double cost;
    bool operator>(const Event& o) const { return time > o.time; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> running;
  std::deque<size_t> cpu_queue, gpu_queue;
  size_t free_workers = workers, remaining = images, in_flight = 0, assigned = 0, to_gpu = 0;
  bool gpu_busy = false;
  double now = 0;
  SimResult r;
  for (;;) {
    while (in_flight < max_in_flight && remaining > 0) {
      const size_t n = std::min(chunk, remaining);
      const Decoder d = balancer.assign(n);
      (d == Decoder::kGpu ? gpu_queue : cpu_queue).push_back(n);
      if (d == Decoder::kGpu) to_gpu += n;
      remaining -= n;
      assigned += n;
      ++in_flight;
    }
    const double gpu_cost = gpu_ns_later > 0 && assigned >= change_at ? gpu_ns_later : gpu_ns;
    while (free_workers > 0 && !cpu_queue.empty()) {
      const size_t n = cpu_queue.front();
      cpu_queue.pop_front();
      --free_workers;
      running.push({now + double(n) * cpu_ns, Decoder::kCpu, n, double(n) * cpu_ns});
    }
    if (!gpu_busy && !gpu_queue.empty()) {
      const size_t n = gpu_queue.front();
      gpu_queue.pop_front();
      gpu_busy = true;
      running.push({now + double(n) * gpu_cost, Decoder::kGpu, n, double(n) * gpu_cost});
    }
    if (running.empty()) break;
    const Event e = running.top();
    running.pop();
    const double dt = e.time - now;
    if (!gpu_queue.empty()) r.cpu_idle_ns += dt * double(free_workers);
    if (!gpu_busy && !cpu_queue.empty()) r.gpu_idle_ns += dt;
    now = e.time;
    balancer.finished(e.decoder, e.images, nanoseconds(static_cast<int64_t>(e.cost)));
    if (e.decoder == Decoder::kCpu) {
      ++free_workers;
    } else {
      gpu_busy = false;
    }
    --in_flight;
  }
  r.makespan_ns = now;
  r.ideal_ns = double(images) / (double(workers) / cpu_ns + 1.0 / gpu_ns);
  r.gpu_share = double(to_gpu) / double(images);
  return r;
}

// 16 workers at 1.2 ms an image (13,300 images/s) and a GPU at 8,300 images/s: the hybrid runs
// near the sum of both, the GPU's share near its part of that sum, and neither idles while the
// other has work waiting (beyond one chunk at the end).
TEST(DecodeBalancer, FeedsBothDecodersAtTheSumOfTheirRates) {
  const double cpu_ns = 1.2e6, gpu_ns = 1e9 / 8300.0;
  const SimResult r = simulate(16, cpu_ns, gpu_ns, 40000, 16, 40);
  const double expected_share = (1.0 / gpu_ns) / (16.0 / cpu_ns + 1.0 / gpu_ns);
  EXPECT_LT(r.makespan_ns, 1.05 * r.ideal_ns) << r.makespan_ns / r.ideal_ns;
  EXPECT_NEAR(r.gpu_share, expected_share, 0.03);
  EXPECT_LT(r.gpu_idle_ns, 0.02 * r.makespan_ns);
  EXPECT_LT(r.cpu_idle_ns / 16.0, 0.02 * r.makespan_ns);
  std::printf(
      "simulated hybrid: %.3fx the ideal, GPU share %.3f (ideal %.3f), idle with the other "
      "backlogged: GPU %.2f%%, CPU %.2f%%\n",
      r.makespan_ns / r.ideal_ns, r.gpu_share, expected_share, 100 * r.gpu_idle_ns / r.makespan_ns,
      100 * r.cpu_idle_ns / 16.0 / r.makespan_ns);
}

// Whichever decoder is the faster one, including one far faster, the split follows the rates.
TEST(DecodeBalancer, TheShareFollowsTheMeasuredRates) {
  for (double gpu_rate : {1000.0, 4000.0, 20000.0, 60000.0}) {
    const double cpu_ns = 2e6, gpu_ns = 1e9 / gpu_rate;
    const SimResult r = simulate(8, cpu_ns, gpu_ns, 30000, 8, 24);
    const double expected = gpu_rate / (8 * 500.0 + gpu_rate);
    EXPECT_NEAR(r.gpu_share, expected, 0.04) << gpu_rate;
    EXPECT_LT(r.makespan_ns, 1.06 * r.ideal_ns) << gpu_rate;
  }
}

// The GPU slows to a fifth of its speed halfway (another process takes the engines): the share
// moves, and the run still ends near the best it could.
TEST(DecodeBalancer, AdaptsWhenADecoderSlowsDown) {
  const double cpu_ns = 1e6, gpu_ns = 1e9 / 8000.0;
  const SimResult steady = simulate(8, cpu_ns, gpu_ns, 40000, 16, 24);
  const SimResult slowed = simulate(8, cpu_ns, gpu_ns, 40000, 16, 24, 5 * gpu_ns, 20000);
  EXPECT_LT(slowed.gpu_share, steady.gpu_share - 0.1);
  // Half the images at the first rates, half at the second: the ideal of each half.
  const double ideal = 20000 / (8 / cpu_ns + 1 / gpu_ns) + 20000 / (8 / cpu_ns + 1 / (5 * gpu_ns));
  EXPECT_LT(slowed.makespan_ns, 1.06 * ideal) << slowed.makespan_ns / ideal;
}

TEST(DecodeBalancer, WithoutAGpuEverythingGoesToTheCpu) {
  DecodeBalancer b(4, false);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b.assign(8), Decoder::kCpu);
  EXPECT_EQ(b.snapshot().gpu_images, 0u);
  EXPECT_EQ(b.snapshot().cpu_backlog, 800u);
  b.finished(Decoder::kCpu, 8, std::chrono::milliseconds(8));
  EXPECT_EQ(b.snapshot().cpu_backlog, 792u);
  EXPECT_DOUBLE_EQ(b.snapshot().cpu_ns_per_image, 1e6);
}

// A chunk that leaves its queue undecoded (a cancelled epoch) no longer counts as queued and does
// not change the cost estimate: after a burst of abandoned GPU chunks the GPU is idle again and
// gets the next chunk, and its cost is the one measured before.
TEST(DecodeBalancer, AbandonedChunksLeaveTheQueueWithoutAMeasurement) {
  DecodeBalancer b(2, true, nanoseconds(1'000'000));
  ASSERT_EQ(b.assign(8), Decoder::kGpu);
  b.finished(Decoder::kGpu, 8, std::chrono::microseconds(800));  // 100 us an image
  for (int i = 0; i < 6; ++i) b.assign(8);
  const DecodeBalancer::Snapshot queued = b.snapshot();
  ASSERT_GT(queued.gpu_backlog, 0u);
  ASSERT_GT(queued.cpu_backlog, 0u);
  for (size_t k = 0; k < queued.gpu_backlog / 8; ++k) b.abandoned(Decoder::kGpu, 8);
  for (size_t k = 0; k < queued.cpu_backlog / 8; ++k) b.abandoned(Decoder::kCpu, 8);
  const DecodeBalancer::Snapshot after = b.snapshot();
  EXPECT_EQ(after.gpu_backlog, 0u);
  EXPECT_EQ(after.cpu_backlog, 0u);
  EXPECT_DOUBLE_EQ(after.gpu_ns_per_image, 100'000.0);
  EXPECT_DOUBLE_EQ(after.cpu_ns_per_image, 1'000'000.0);
  EXPECT_EQ(b.assign(8), Decoder::kGpu);  // nothing queued there: the engines would idle
}

// With a GPU batch, the GPU always has a whole batch queued before the other rules apply (its
// decode thread takes several chunks per call), and the CPU still gets a chunk per idle worker.
TEST(DecodeBalancer, KeepsAWholeGpuBatchQueued) {
  DecodeBalancer b(4, true, nanoseconds(1'000'000), /*gpu_batch=*/64);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b.assign(8), Decoder::kGpu) << i;
  EXPECT_EQ(b.snapshot().gpu_backlog, 64u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.assign(8), Decoder::kCpu) << i;  // an idle worker each
  for (int i = 0; i < 4; ++i) {  // one call decoded 4 chunks
    b.finished(Decoder::kGpu, 8, std::chrono::microseconds(800));
  }
  EXPECT_EQ(b.assign(8), Decoder::kGpu);  // 32 images queued there, fewer than a batch
}

// The fixed share: a pure function of (seed, epoch, index), near the share over many samples,
// different per epoch, and all or nothing at 1 and 0.
TEST(FixedShare, IsAPureFunctionOfTheSampleNearTheShare) {
  for (double share : {0.1, 0.5, 0.65, 0.9}) {
    size_t gpu = 0;
    for (size_t i = 0; i < 100000; ++i) gpu += fixed_share_decoder(share, 7, 3, i) == Decoder::kGpu;
    EXPECT_NEAR(double(gpu) / 100000.0, share, 0.01) << share;
  }
  size_t same = 0, differs_by_epoch = 0;
  for (size_t i = 0; i < 10000; ++i) {
    same += fixed_share_decoder(0.5, 1, 2, i) == fixed_share_decoder(0.5, 1, 2, i);
    differs_by_epoch += fixed_share_decoder(0.5, 1, 2, i) != fixed_share_decoder(0.5, 1, 3, i);
  }
  EXPECT_EQ(same, 10000u);
  EXPECT_GT(differs_by_epoch, 4000u);
  EXPECT_LT(differs_by_epoch, 6000u);
  for (size_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(fixed_share_decoder(0.0, 1, 0, i), Decoder::kCpu);
    EXPECT_EQ(fixed_share_decoder(1.0, 1, 0, i), Decoder::kGpu);
    EXPECT_EQ(fixed_share_decoder(std::nan(""), 1, 0, i), Decoder::kCpu);
  }
}

}  // namespace
}  // namespace conveyor
