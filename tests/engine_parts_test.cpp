// The engine's parts (loader/src), each driven alone: options, the job and slot queues, the
// reorderer, the batch filler, the CPU path's slot lease and the device stager.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "batch_filler.h"
#include "device_stager.h"
#include "host_batch.h"
#include "job_queue.h"
#include "options.h"
#include "reorderer.h"
#include "test_support.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;
using detail::BatchFiller;
using detail::IndexQueue;
using detail::Job;
using detail::JobQueue;
using detail::Reorderer;
using detail::SlotMeta;
using testing::IndexSource;
using testing::LateCopyEngine;

// --- Options

TEST(ResolvedOptions, FillsEveryDefaultFromTheWorkerCount) {
  LoaderOptions o;
  o.batch_size = 256;
  o.workers = 4;
  const detail::ResolvedOptions r = detail::resolve_options(o);
  EXPECT_EQ(r.slots, 4u + 2u + 2u);     // workers + prefetch_factor + 2
  EXPECT_EQ(r.chunk_size, 256u / 16u);  // batch_size / (4 * workers)
  EXPECT_EQ(r.chunks_per_batch, 16u);
  o.workers = 1;
  EXPECT_EQ(detail::resolve_options(o).chunk_size, 256u);  // one worker: one chunk per batch
  o.workers = 0;
  EXPECT_GE(detail::resolve_options(o).workers, 1u);
  o.batch_size = 10;
  o.workers = 4;
  o.chunk_size = 64;  // clamped to the batch
  EXPECT_EQ(detail::resolve_options(o).chunk_size, 10u);
}

TEST(ResolvedOptions, RefusesWhatNoLoaderCanHonourNamingTheOption) {
  LoaderOptions zero;
  zero.batch_size = 0;
  try {
    detail::resolve_options(zero);
    ADD_FAILURE() << "batch_size 0 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size"), std::string::npos) << e.what();
  }
  LoaderOptions negative;
  negative.timeout = std::chrono::milliseconds(-1);
  EXPECT_THROW(detail::resolve_options(negative), std::invalid_argument);
  LoaderOptions jobs;
  jobs.batch_size = 1 << 20;
  jobs.chunk_size = 1;
  jobs.slots = 64;  // 64 x 2^20 jobs do not fit a 32-bit job number
  EXPECT_THROW(detail::resolve_options(jobs), std::invalid_argument);
  LoaderOptions gpu;
  gpu.device = c10::Device("cuda:0");
  if (!cuda_available()) {
    EXPECT_THROW(detail::resolve_options(gpu), std::invalid_argument);
    EXPECT_NO_THROW(detail::resolve_options(gpu, /*check_device=*/false));
  }
}

// --- Queues

TEST(IndexQueue, EveryPushedIndexIsPoppedExactlyOnceAcrossThreads) {
  constexpr uint32_t kPerProducer = 20000;
  IndexQueue queue(1024);
  std::vector<std::atomic<int>> seen(2 * kPerProducer);
  std::vector<std::thread> threads;
  // Never overfill the bounded queue: a producer claims room before it pushes, atomically, so
  // that two producers cannot both take the last place.
  std::atomic<uint32_t> pushed_room{1024};
  const auto claim_room = [&] {
    uint32_t room = pushed_room.load();
    while (room == 0 || !pushed_room.compare_exchange_weak(room, room - 1)) {
      if (room == 0) {
        std::this_thread::yield();
        room = pushed_room.load();
      }
    }
  };
  for (uint32_t p = 0; p < 2; ++p) {
    threads.emplace_back([&, p] {
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        claim_room();
        queue.push(p * kPerProducer + i);
      }
    });
  }
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&] {
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        seen[queue.pop()].fetch_add(1);
        pushed_room.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].load(), 1) << "index " << i;
  EXPECT_FALSE(queue.try_pop().has_value());
}

TEST(IndexQueue, PopForGivesUpAfterItsTimeout) {
  IndexQueue queue(4);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(queue.pop_for(30ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
  queue.push(3);
  EXPECT_EQ(queue.pop_for(30ms), std::optional<uint32_t>(3));
}

// close() ends every wait, now and later, and an index pushed after it is still queued (a slot
// released after the ring closed is not lost).
TEST(IndexQueue, CloseWakesEveryWaiterAndKeepsLaterPushes) {
  IndexQueue queue(8);
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int w = 0; w < 3; ++w) {
    waiters.emplace_back([&] {
      if (!queue.wait().has_value()) woke.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(20ms);  // let them block
  testing::finishes_within(10s, "IndexQueue::close wakes the waiters", [&] {
    queue.close();
    for (auto& t : waiters) t.join();
  });
  EXPECT_EQ(woke.load(), 3);
  queue.push(5);
  EXPECT_FALSE(queue.wait().has_value());
  EXPECT_FALSE(queue.try_pop().has_value());
  EXPECT_FALSE(queue.pop_for(1ms).has_value());
  EXPECT_TRUE(queue.closed());
}

// A broken invariant of the machinery (here: more indices in flight than the queue was sized
// for) has one policy, in the slot ring and the job queues alike: the process stops, naming it.
TEST(IndexQueueDeathTest, OverfillingStopsTheProcessNamingTheInvariant) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        IndexQueue queue(2);
        for (uint32_t i = 0; i < 64; ++i) queue.push(i);
      },
      "internal invariant broken.*sized for every index in flight");
}

TEST(JobQueue, CarriesEachChunkOfEachSlotAndGivesBackUnstartedOnes) {
  JobQueue jobs(/*slots=*/3, /*chunks_per_batch=*/4);
  jobs.push_batch(2, 4);
  jobs.push_batch(0, 2);  // a short last batch: fewer chunks
  std::vector<Job> got;
  for (int i = 0; i < 3; ++i) got.push_back(*jobs.wait());
  EXPECT_EQ(got, (std::vector<Job>{{2, 0}, {2, 1}, {2, 2}}));
  EXPECT_EQ(jobs.try_take_back(), std::optional<Job>(Job{2, 3}));
  EXPECT_EQ(jobs.try_take_back(), std::optional<Job>(Job{0, 0}));
  EXPECT_EQ(jobs.try_take_back(), std::optional<Job>(Job{0, 1}));
  EXPECT_FALSE(jobs.try_take_back().has_value());
}

TEST(JobQueue, StopWakesEveryWaitingWorker) {
  JobQueue jobs(2, 1);
  std::atomic<int> woke{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&] {
      if (!jobs.wait().has_value()) woke.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(20ms);  // let them block
  testing::finishes_within(10s, "JobQueue::stop wakes the workers", [&] {
    jobs.stop();
    for (auto& t : workers) t.join();
  });
  EXPECT_EQ(woke.load(), 3);
}

// --- Reorderer

TEST(Reorderer, HandsOutBatchesInSequenceWhateverOrderTheyComplete) {
  Reorderer reorder(4);
  reorder.put(2, 7);
  reorder.put(0, 5);
  EXPECT_FALSE(reorder.take(1).has_value());  // not there yet
  EXPECT_EQ(reorder.take(0), std::optional<uint32_t>(5));
  reorder.put(1, 6);
  reorder.put(4, 1);  // position 0 again, freed by take(0)
  EXPECT_EQ(reorder.take(1), std::optional<uint32_t>(6));
  EXPECT_EQ(reorder.take(2), std::optional<uint32_t>(7));
  EXPECT_EQ(reorder.held(), 1u);
  std::vector<uint32_t> released;
  reorder.clear([&](uint32_t slot) { released.push_back(slot); });
  EXPECT_EQ(released, std::vector<uint32_t>{1});
  EXPECT_EQ(reorder.held(), 0u);
}

TEST(ReordererDeathTest, ACollisionStopsInsteadOfOverwritingABatch) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Reorderer reorder(4);
        reorder.put(1, 0);
        reorder.put(5, 1);  // more than `slots` batches in flight: 1 and 5 share a position
      },
      "never collides");
}

// --- BatchFiller

struct FillerRig {
  explicit FillerRig(size_t n, LoaderOptions o)
      : source(n), options(detail::resolve_options(o)), ring(ring_options(source, options)) {
    order.resize(n);
    for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;  // reversed: rows are not indices
    meta.indices.reserve(options.batch_size);
    meta.repeats.reserve(options.batch_size);
    filler = std::make_unique<BatchFiller>(source, ring, options, order, generation);
  }
  static SlotRing::Options ring_options(const IndexSource& s, const LoaderOptions& o) {
    SlotRing::Options r;
    r.slots = 2;
    r.memory = HostBuffer::Kind::kPageable;
    for (const auto& f : s.fields())
      r.layout.field_bytes.push_back(f.sample_bytes() * o.batch_size);
    return r;
  }
  // Starts batch `sequence` in slot 0, as the consumer does.
  size_t start(size_t sequence) {
    const uint32_t slot = *ring.try_acquire();
    EXPECT_EQ(slot, 0u);
    const size_t rows = std::min(options.batch_size, order.size() - sequence * options.batch_size);
    const size_t chunks = (rows + options.chunk_size - 1) / options.chunk_size;
    meta.reset(sequence, generation.load(), /*epoch=*/3, rows, chunks, nullptr);
    return chunks;
  }
  int64_t row(size_t r) const {
    int64_t v = 0;
    std::memcpy(&v, ring.field(0, 0) + r * sizeof v, sizeof v);
    return v;
  }

  IndexSource source;
  detail::ResolvedOptions options;
  SlotRing ring;
  std::vector<size_t> order;
  std::atomic<uint64_t> generation{1};
  SlotMeta meta;
  std::unique_ptr<BatchFiller> filler;
};

LoaderOptions chunked(size_t batch, size_t chunk) {
  LoaderOptions o;
  o.batch_size = batch;
  o.chunk_size = chunk;
  o.workers = 2;
  return o;
}

TEST(BatchFiller, WritesEachRowFromTheSamplerOrderAndTheLastChunkMarksTheSlotReady) {
  FillerRig rig(20, chunked(8, 3));
  const size_t chunks = rig.start(/*sequence=*/1);  // rows 8..15 of the order
  ASSERT_EQ(chunks, 3u);
  EXPECT_FALSE(rig.filler->fill(0, 0, 2, rig.meta));  // chunks finish in any order
  EXPECT_FALSE(rig.filler->fill(1, 0, 0, rig.meta));
  EXPECT_EQ(rig.ring.state(0), SlotState::kFilling);
  EXPECT_TRUE(rig.filler->fill(0, 0, 1, rig.meta));  // the last one owns the slot
  EXPECT_EQ(rig.ring.state(0), SlotState::kReady);
  for (size_t r = 0; r < 8; ++r) {
    EXPECT_EQ(rig.meta.indices[r], rig.order[8 + r]);
    EXPECT_EQ(rig.row(r), static_cast<int64_t>(rig.order[8 + r]));
  }
}

TEST(BatchFiller, TheBatchFailsWithItsLowestFailingRowWhicheverChunkFailsFirst) {
  FillerRig rig(16, chunked(8, 2));
  rig.source.fail_at = {rig.order[6], rig.order[1]};  // rows 6 and 1
  rig.start(0);
  EXPECT_FALSE(rig.filler->fill(0, 0, 3, rig.meta));  // row 6 fails first
  EXPECT_EQ(rig.meta.failed_row.load(), 6u);
  EXPECT_FALSE(rig.filler->fill(0, 0, 2, rig.meta));
  EXPECT_FALSE(rig.filler->fill(0, 0, 0, rig.meta));  // row 1: earlier, so its error wins
  EXPECT_TRUE(rig.filler->fill(0, 0, 1, rig.meta));
  EXPECT_EQ(rig.meta.failed_row.load(), 1u);
  EXPECT_EQ(rig.meta.error_index, rig.order[1]);
  EXPECT_EQ(rig.meta.error_path, "/data/item_" + std::to_string(rig.order[1]) + ".bin");
  EXPECT_EQ(rig.ring.state(0), SlotState::kFilling);  // not ready: the consumer raises
  EXPECT_EQ(rig.filler->errors(), 2u);
}

TEST(BatchFiller, SkipPolicySubstitutesTheNextIndexThatLoadsAndLogsTheSkip) {
  LoaderOptions o = chunked(4, 4);
  o.on_error = ErrorPolicy::kSkip;
  FillerRig rig(8, o);
  const size_t bad = rig.order[0];            // index 7; the batch holds 7, 6, 5, 4
  rig.source.fail_at = {bad, (bad + 1) % 8};  // the first substitute (0) fails too
  rig.start(0);
  EXPECT_TRUE(rig.filler->fill(0, 0, 0, rig.meta));
  EXPECT_EQ(rig.ring.state(0), SlotState::kReady);
  EXPECT_EQ(rig.meta.indices[0], (bad + 2) % 8);
  EXPECT_EQ(rig.row(0), static_cast<int64_t>((bad + 2) % 8));
  EXPECT_EQ(rig.filler->skipped().count(), 1u);
  ASSERT_EQ(rig.filler->skipped().records().size(), 1u);
  EXPECT_EQ(rig.filler->skipped().records()[0].index, bad);
  EXPECT_EQ(rig.filler->skipped().records()[0].epoch, 3u);
  EXPECT_EQ(rig.filler->errors(), 2u);
}

TEST(BatchFiller, AChunkOfACancelledEpochStopsAndMarksTheBatchCancelled) {
  FillerRig rig(8, chunked(8, 4));
  rig.start(0);
  rig.generation.fetch_add(1);  // the consumer cancelled the epoch
  EXPECT_FALSE(rig.filler->fill(0, 0, 0, rig.meta));
  EXPECT_TRUE(rig.meta.cancelled.load());
  EXPECT_EQ(rig.source.calls.load(), 0u);
  EXPECT_TRUE(BatchFiller::abandon(rig.meta));  // the other chunk, taken back: the last
  EXPECT_EQ(rig.ring.state(0), SlotState::kFilling);
}

// --- HostBatches (the CPU path's slot lease)

TEST(HostBatches, ABatchViewsItsSlotUntilItsLastTensorIsReleased) {
  SlotRing::Options r;
  r.slots = 3;
  r.memory = HostBuffer::Kind::kPageable;
  r.layout.field_bytes = {4 * sizeof(int64_t)};
  auto shared = std::make_shared<detail::SharedRing>(r);
  std::vector<FieldSpec> fields{{"value", c10::ScalarType::Long, {}}};
  detail::HostBatches batches(shared, fields, /*batch_size=*/4, /*pin_memory=*/false);
  const uint32_t slot = *shared->ring.try_acquire();
  shared->ring.mark_ready(slot);
  auto* values = reinterpret_cast<int64_t*>(shared->ring.field(slot, 0));
  for (int i = 0; i < 4; ++i) values[i] = 10 + i;
  at::Tensor kept;
  {
    Batch batch = batches.make(slot, {{0, 1, 2, 3}, 0, 0});
    EXPECT_EQ(batch.fields[0].data_ptr(), shared->ring.field(slot, 0));  // no copy
    EXPECT_EQ(batch.fields[0][3].item<int64_t>(), 13);
    EXPECT_EQ(batch.names, std::vector<std::string>{"value"});
    kept = batch.fields[0];
  }
  EXPECT_EQ(shared->ring.state(slot), SlotState::kReady);  // `kept` still views it
  EXPECT_EQ(shared->held.load(), 1u);
  kept = at::Tensor();
  EXPECT_EQ(shared->ring.state(slot), SlotState::kFree);
  EXPECT_EQ(shared->held.load(), 0u);
}

TEST(HostBatches, WhenTheUserHoldsEveryOtherSlotTheBatchIsACopy) {
  SlotRing::Options r;
  r.slots = 3;
  r.memory = HostBuffer::Kind::kPageable;
  r.layout.field_bytes = {sizeof(int64_t)};
  auto shared = std::make_shared<detail::SharedRing>(r);
  detail::HostBatches batches(shared, {{"value", c10::ScalarType::Long, {}}}, 1, false);
  std::vector<Batch> held;
  for (int i = 0; i < 3; ++i) {
    const uint32_t slot = *shared->ring.try_acquire();
    shared->ring.mark_ready(slot);
    held.push_back(batches.make(slot, {{0}, 0, static_cast<size_t>(i)}));
  }
  // Two leases leave one slot: the third batch is a copy and its slot is free again.
  EXPECT_EQ(shared->held.load(), 2u);
  EXPECT_EQ(batches.copies_to_host(), 1u);
  EXPECT_EQ(shared->ring.count_states()[static_cast<size_t>(SlotState::kFree)], 1u);
  held.clear();
  EXPECT_EQ(shared->ring.count_states()[static_cast<size_t>(SlotState::kFree)], 3u);
}

// --- DeviceStager

TEST(DeviceStager, DeliversInStageOrderFailuresInTheirTurnAndEverySlotComesBack) {
  std::atomic<int> finished{0};
  {
    detail::DeviceStager stager(std::make_unique<LateCopyEngine>(5ms), /*depth=*/3);
    auto batch_of = [](size_t sequence) {
      Batch b;
      b.sequence = sequence;
      b.indices = {sequence};
      b.names = {"value"};
      b.fields.resize(1);  // the copy's place
      b.offsets.resize(1);
      return b;
    };
    stager.stage(batch_of(0), {at::full({1}, 100, at::kLong)}, {{0}}, {}, nullptr,
                 [&] { finished.fetch_add(1); });
    stager.stage_failure(std::make_exception_ptr(std::runtime_error("batch 1 failed")));
    stager.stage(batch_of(2), {at::full({1}, 102, at::kLong)}, {{0}}, {}, nullptr,
                 [&] { finished.fetch_add(1); });
    EXPECT_TRUE(stager.full());
    detail::DeviceStager::Delivered first = stager.deliver();
    ASSERT_TRUE(first.batch);
    EXPECT_EQ(first.batch->sequence, 0u);
    EXPECT_EQ(first.batch->fields[0].item<int64_t>(), 100);  // the copy is done once delivered
    ASSERT_NE(first.batch->copy_fence, nullptr);
    EXPECT_TRUE(first.batch->copy_fence->done());
    detail::DeviceStager::Delivered second = stager.deliver();
    EXPECT_FALSE(second.batch);
    EXPECT_THROW(std::rethrow_exception(second.failure), std::runtime_error);
    detail::DeviceStager::Delivered third = stager.deliver();
    ASSERT_TRUE(third.batch);
    EXPECT_EQ(third.batch->fields[0].item<int64_t>(), 102);
    EXPECT_TRUE(stager.empty());
    stager.stage(batch_of(3), {at::full({1}, 103, at::kLong)}, {{0}}, {}, nullptr,
                 [&] { finished.fetch_add(1); });
    stager.clear();  // a cancelled epoch: the copy still finishes and hands its slot back
  }
  EXPECT_EQ(finished.load(), 3);  // on_finished ran once per staged copy
}

}  // namespace
}  // namespace conveyor
