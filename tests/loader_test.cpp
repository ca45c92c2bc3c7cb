// The engine's promises: exactly-once delivery, ordering, determinism, lifecycle, errors,
// timeouts, slot-reuse safety and bounded memory.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>

#include <torch/serialize/archive.h>

#include "test_support.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;
using testing::finishes_within;
using testing::IndexSource;
using testing::LateCopyEngine;

std::vector<int64_t> values(const Batch& b) {
  at::Tensor v = b.field("value");
  return std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
}

struct Combo {
  size_t n, batch, workers;
  bool drop_last, ordered;
  size_t chunk = 0;  // LoaderOptions::chunk_size; 0 = the default
};

TEST(Loader, EveryIndexExactlyOncePerEpochAcrossCombinations) {
  const std::vector<Combo> combos = {
      {1, 1, 1, false, true},
      {7, 3, 2, false, true},
      {7, 3, 2, true, true},
      {64, 8, 8, false, false},
      {100, 7, 8, true, false},
      {100, 7, 1, false, true},
      {257, 32, 2, false, false},
      {33, 64, 8, false, true},
      {33, 64, 2, true, true},
      {1000, 10, 8, false, true},
      // Batches shared among workers in explicit chunks, including ragged last chunks.
      {100, 7, 2, false, true, 1},
      {257, 32, 8, false, false, 3},
      {64, 16, 2, true, true, 5},
      {50, 12, 3, false, true, 12},
  };
  for (const Combo& c : combos) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " batch=" + std::to_string(c.batch) + " workers=" +
                 std::to_string(c.workers) + " drop_last=" + std::to_string(c.drop_last) +
                 " ordered=" + std::to_string(c.ordered) + " chunk=" + std::to_string(c.chunk));
    LoaderOptions o;
    o.chunk_size = c.chunk;
    o.batch_size = c.batch;
    o.workers = c.workers;
    o.drop_last = c.drop_last;
    o.enforce_ordering = c.ordered;
    DataLoader loader(std::make_shared<IndexSource>(c.n), o, RandomSampler::make(3));
    const size_t expected = c.drop_last ? (c.n / c.batch) * c.batch : c.n;
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::vector<size_t> order;
      RandomSampler(3).indices(c.n, static_cast<uint64_t>(epoch), order);
      std::vector<int> seen(c.n, 0);
      size_t batches = 0, previous_sequence = 0, total = 0;
      for (Batch& b : loader) {
        if (c.ordered && batches > 0) {
          EXPECT_EQ(b.sequence, previous_sequence + 1);
        }
        previous_sequence = b.sequence;
        ++batches;
        if (c.drop_last) {
          EXPECT_EQ(b.size(), c.batch);
        }
        EXPECT_EQ(b.field("value").size(0), static_cast<int64_t>(b.size()));
        for (int64_t v : values(b)) {
          ASSERT_GE(v, 0);
          ASSERT_LT(v, static_cast<int64_t>(c.n));
          ++seen[static_cast<size_t>(v)];
          ++total;
        }
        EXPECT_EQ(values(b), std::vector<int64_t>(b.indices.begin(), b.indices.end()));
        // Rows in sampler order, whichever chunks and workers wrote them.
        ASSERT_LE(b.sequence * c.batch + b.size(), order.size());
        EXPECT_EQ(b.indices, std::vector<size_t>(
                                 order.begin() + static_cast<std::ptrdiff_t>(b.sequence * c.batch),
                                 order.begin() +
                                     static_cast<std::ptrdiff_t>(b.sequence * c.batch + b.size())));
      }
      EXPECT_EQ(batches, loader.batches_per_epoch());
      EXPECT_EQ(total, expected);
      EXPECT_EQ(static_cast<size_t>(std::count(seen.begin(), seen.end(), 1)), expected);
      EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](int s) { return s > 1; }), 0);
    }
  }
}

std::vector<int64_t> epoch_order(size_t workers, uint64_t epoch_count) {
  LoaderOptions o;
  o.batch_size = 5;
  o.workers = workers;
  DataLoader loader(std::make_shared<IndexSource>(103), o, RandomSampler::make(42));
  std::vector<int64_t> order;
  for (uint64_t e = 0; e < epoch_count; ++e) {
    order.clear();
    for (Batch& b : loader) {
      auto v = values(b);
      order.insert(order.end(), v.begin(), v.end());
    }
  }
  return order;
}

TEST(Loader, SameSeedAndEpochGiveTheSameOrderWithOneOrEightWorkers) {
  auto one = epoch_order(1, 1);
  auto eight = epoch_order(8, 1);
  EXPECT_EQ(one, eight);
  auto second_epoch = epoch_order(8, 2);
  EXPECT_NE(one, second_epoch) << "epochs must be shuffled differently";
  std::vector<int64_t> sorted = second_epoch;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> all(103);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all);
}

TEST(Loader, SetEpochChoosesTheNextEpochsOrder) {
  LoaderOptions o;
  o.batch_size = 5;
  o.workers = 2;
  DataLoader loader(std::make_shared<IndexSource>(103), o, RandomSampler::make(42));
  loader.set_epoch(1);
  std::vector<int64_t> order;
  for (Batch& b : loader) {
    EXPECT_EQ(b.epoch, 1u);
    auto v = values(b);
    order.insert(order.end(), v.begin(), v.end());
  }
  EXPECT_EQ(loader.epoch(), 1u);
  EXPECT_EQ(order, epoch_order(3, 2)) << "epoch 1 of a fresh loader is the same permutation";
}

TEST(Loader, SequentialSamplerIsInOrder) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 3;
  DataLoader loader(std::make_shared<IndexSource>(10), o);
  std::vector<int64_t> order;
  for (Batch& b : loader) {
    auto v = values(b);
    order.insert(order.end(), v.begin(), v.end());
  }
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(order, all);
}

TEST(Samplers, DistributedSamplerMatchesPyTorchSemantics) {
  // n=10, world 3, no shuffle: padded to 12 with indices 0,1; rank r takes r, r+3, ...
  std::vector<size_t> out;
  DistributedSampler(0, 3, false).indices(10, 0, out);
  EXPECT_EQ(out, (std::vector<size_t>{0, 3, 6, 9}));
  DistributedSampler(1, 3, false).indices(10, 0, out);
  EXPECT_EQ(out, (std::vector<size_t>{1, 4, 7, 0}));
  DistributedSampler(2, 3, false).indices(10, 0, out);
  EXPECT_EQ(out, (std::vector<size_t>{2, 5, 8, 1}));
  DistributedSampler(2, 3, false, 0, /*drop_last=*/true).indices(10, 0, out);
  EXPECT_EQ(out, (std::vector<size_t>{2, 5, 8}));
  // Shuffled: ranks are disjoint and together cover everything; epochs differ.
  std::multiset<size_t> all;
  for (size_t r = 0; r < 4; ++r) {
    DistributedSampler(r, 4, true, 7).indices(100, 3, out);
    EXPECT_EQ(out.size(), 25u);
    all.insert(out.begin(), out.end());
  }
  EXPECT_EQ(all.size(), 100u);
  EXPECT_EQ(std::set<size_t>(all.begin(), all.end()).size(), 100u);
  std::vector<size_t> e0, e1;
  DistributedSampler(0, 4, true, 7).indices(100, 0, e0);
  DistributedSampler(0, 4, true, 7).indices(100, 1, e1);
  EXPECT_NE(e0, e1);
  EXPECT_THROW(DistributedSampler(4, 4), std::invalid_argument);
}

TEST(Loader, BreakingOutEarlyThenANewEpochDeliversTheWholeEpoch) {
  // One chunk per batch, then batches of 8 chunks on 4 workers over 3 slots, so that cancelling
  // takes back some chunks of a batch while workers hold others.
  for (size_t chunk : {0, 2}) {
    SCOPED_TRACE("chunk_size=" + std::to_string(chunk));
    LoaderOptions o;
    o.batch_size = chunk ? 16 : 4;
    o.workers = chunk ? 4 : 2;
    o.chunk_size = chunk;
    if (chunk) o.slots = 3;
    const size_t n = chunk ? 160 : 40;
    auto source = std::make_shared<IndexSource>(n);
    source->delay = 200us;
    DataLoader loader(source, o, RandomSampler::make(1));
    finishes_within(20s, "early break", [&] {
      for (int round = 0; round < 5; ++round) {
        size_t taken = 0;
        for (Batch& b : loader) {
          (void)b;
          if (++taken == 2) break;
        }
        EXPECT_EQ(taken, 2u);
      }
      std::set<int64_t> seen;
      size_t total = 0;
      for (Batch& b : loader) {
        for (int64_t v : values(b)) seen.insert(v), ++total;
      }
      EXPECT_EQ(total, n);
      EXPECT_EQ(seen.size(), n);
      EXPECT_EQ(loader.epoch(), 5u);
      EXPECT_EQ(loader.stats().slot_states[static_cast<size_t>(SlotState::kFree)],
                loader.options().slots)
          << "every slot is back in the ring after a whole epoch";
    });
  }
}

TEST(Loader, DestroyingMidEpochReturnsPromptly) {
  for (size_t workers : {1, 2, 8}) {
    auto source = std::make_shared<IndexSource>(10000);
    source->delay = 1ms;
    finishes_within(10s, "destroy mid-epoch", [&] {
      LoaderOptions o;
      o.batch_size = 16;
      o.workers = workers;
      auto loader = std::make_unique<DataLoader>(source, o);
      auto it = loader->begin();
      ++it;
      auto start = std::chrono::steady_clock::now();
      loader.reset();
      EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
    });
  }
}

TEST(Loader, BatchesHeldByTheUserOutliveTheLoader) {
  std::optional<Batch> kept;
  {
    LoaderOptions o;
    o.batch_size = 3;
    o.workers = 2;
    DataLoader loader(std::make_shared<IndexSource>(9), o);
    kept = loader.next();
  }
  ASSERT_TRUE(kept);
  EXPECT_EQ(values(*kept), (std::vector<int64_t>{0, 1, 2}));
}

TEST(Loader, WorkerExceptionNamesTheSampleAndKeepsTheOriginal) {
  auto source = std::make_shared<IndexSource>(20);
  source->fail_at = {13};
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  DataLoader loader(source, o);
  size_t delivered = 0;
  bool thrown = false;
  while (true) {
    try {
      auto b = loader.next();
      if (!b) break;
      ++delivered;
    } catch (const SampleError& e) {
      thrown = true;
      EXPECT_EQ(e.index(), 13u);
      EXPECT_EQ(e.path(), "/data/item_13.bin");
      std::string what = e.what();
      EXPECT_NE(what.find("sample 13"), std::string::npos) << what;
      EXPECT_NE(what.find("/data/item_13.bin"), std::string::npos) << what;
      EXPECT_NE(what.find("synthetic failure in user dataset"), std::string::npos) << what;
      EXPECT_THROW(e.rethrow_original(), std::runtime_error);
    }
  }
  EXPECT_TRUE(thrown);
  EXPECT_EQ(delivered, 4u);  // the other batches still arrive
  EXPECT_EQ(loader.stats().errors, 1u);
}

TEST(Loader, AFailureInOneChunkFailsOnlyItsBatchWhileOtherChunksLoad) {
  auto source = std::make_shared<IndexSource>(48);
  source->fail_at = {21, 22};  // two failing samples in two chunks of batch 1
  LoaderOptions o;
  o.batch_size = 16;
  o.chunk_size = 1;
  o.workers = 8;
  o.slots = 2;  // a slot lost on the failure path would stall the second epoch
  DataLoader loader(source, o);
  finishes_within(20s, "failing chunk", [&] {
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<size_t> delivered;
      size_t failures = 0;
      for (int i = 0; i < 3; ++i) {
        try {
          auto b = loader.next();
          ASSERT_TRUE(b.has_value());
          delivered.push_back(b->sequence);
          EXPECT_EQ(values(*b), std::vector<int64_t>(b->indices.begin(), b->indices.end()));
        } catch (const SampleError& e) {
          ++failures;
          // The first failing sample in batch order, whichever chunk failed first.
          EXPECT_EQ(e.index(), 21u) << e.what();
          EXPECT_NE(std::string(e.what()).find("batch 1"), std::string::npos) << e.what();
        }
      }
      EXPECT_EQ(failures, 1u);
      EXPECT_EQ(delivered, (std::vector<size_t>{0, 2}));
      EXPECT_FALSE(loader.next().has_value());
      loader.start_epoch();
    }
  });
}

TEST(Loader, WorkersShareEachBatch) {
  auto source = std::make_shared<IndexSource>(64);
  source->record_workers = true;
  source->delay = 1ms;  // long enough for every worker to wake while batch 0 is being filled
  LoaderOptions o;
  o.batch_size = 64;
  o.workers = 4;
  o.chunk_size = 8;
  DataLoader loader(source, o);
  auto b = loader.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->size(), 64u);
  std::set<size_t> writers;
  for (const auto& [index, worker] : source->worker_of) writers.insert(worker);
  EXPECT_GE(writers.size(), 2u) << "one batch of 8 chunks was filled by a single worker";
}

TEST(Loader, SkipPolicyReplacesAndCountsFailedSamples) {
  for (size_t chunk : {0, 2}) {  // one chunk per batch; two chunks per batch
    SCOPED_TRACE("chunk_size=" + std::to_string(chunk));
    auto source = std::make_shared<IndexSource>(20);
    source->fail_at = {3, 13};
    LoaderOptions o;
    o.batch_size = 4;
    o.workers = 2;
    o.on_error = ErrorPolicy::kSkip;
    o.chunk_size = chunk;
    DataLoader loader(source, o);
    std::multiset<int64_t> seen;
    for (Batch& b : loader) {
      EXPECT_EQ(b.size(), 4u) << "a skipped sample is replaced so the batch stays full";
      for (int64_t v : values(b)) seen.insert(v);
      EXPECT_EQ(values(b), std::vector<int64_t>(b.indices.begin(), b.indices.end()));
    }
    EXPECT_EQ(seen.count(3), 0u);
    EXPECT_EQ(seen.count(13), 0u);
    EXPECT_EQ(seen.size(), 20u);
    LoaderStats s = loader.stats();
    EXPECT_EQ(s.skipped, 2u);
    ASSERT_EQ(s.skipped_samples.size(), 2u);
    std::set<std::string> paths;
    for (const auto& k : s.skipped_samples) paths.insert(k.path);
    EXPECT_EQ(paths, (std::set<std::string>{"/data/item_3.bin", "/data/item_13.bin"}));
  }
}

TEST(Loader, TimeoutTurnsAStuckWorkerIntoAnError) {
  auto source = std::make_shared<IndexSource>(8);
  source->stall_at = {5};
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  // The first batch must arrive within the timeout too, with threads starting on a loaded machine
  // under ThreadSanitizer (200 ms was once too short there), so the timeout is generous.
  o.timeout = 2000ms;
  DataLoader loader(source, o);
  EXPECT_TRUE(loader.next());
  try {
    loader.next();
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("2000 ms"), std::string::npos) << e.what();
  }
  source->unstall();
  auto late = loader.next();  // the batch still arrives once the worker is unstuck
  ASSERT_TRUE(late);
  EXPECT_EQ(values(*late), (std::vector<int64_t>{4, 5, 6, 7}));
}

TEST(Loader, NoSlotIsReusedBeforeItsCopyFinished) {
  auto engine = std::make_unique<LateCopyEngine>(15ms);
  LateCopyEngine* probe = engine.get();
  LoaderOptions o;
  o.batch_size = 8;
  o.workers = 4;
  o.slots = 3;  // few slots and slow copies: workers keep waiting for slots
  o.prefetch_factor = 2;
  o.chunk_size = 2;  // four workers share each batch
  DataLoader loader(std::make_shared<IndexSource>(400), o, nullptr, std::move(engine));
  size_t total = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> expected(8);
    size_t batch = 0;
    for (Batch& b : loader) {
      std::iota(expected.begin(), expected.end(), static_cast<int64_t>(batch * 8));
      EXPECT_EQ(values(b), expected) << "batch " << batch;
      ++batch;
      total += b.size();
    }
    EXPECT_EQ(batch, 50u);
  }
  EXPECT_EQ(total, 800u);
  EXPECT_EQ(probe->overwritten.load(), 0u);
  EXPECT_GE(probe->copies.load(), 100u);
}

// A copy stage that fails to start the copy of chosen batches (an out-of-memory on the device,
// say), handing the slot back as the CopyEngine contract requires.
class FailingCopyEngine : public LateCopyEngine {
 public:
  explicit FailingCopyEngine(std::set<int> fail_calls)
      : LateCopyEngine(1ms), fail_(std::move(fail_calls)) {}
  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent* event, std::function<void()> on_finished) override {
    if (fail_.count(calls_++)) {
      on_finished();
      throw std::runtime_error("synthetic device out of memory");
    }
    return LateCopyEngine::start(host, on_device, event, std::move(on_finished));
  }

 private:
  std::set<int> fail_;
  int calls_ = 0;
};

TEST(Loader, AFailedCopyFailsOnlyItsBatchAndTheLoaderGoesOn) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.slots = 3;
  DataLoader loader(std::make_shared<IndexSource>(40), o, nullptr,
                    std::make_unique<FailingCopyEngine>(std::set<int>{2, 3, 4}));
  std::vector<int64_t> seen;
  size_t failures = 0;
  finishes_within(20s, "failed copies", [&] {
    for (;;) {
      try {
        auto b = loader.next();
        if (!b) break;
        auto v = values(*b);
        seen.insert(seen.end(), v.begin(), v.end());
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("synthetic device out of memory"), std::string::npos);
        ++failures;
      }
    }
  });
  EXPECT_EQ(failures, 3u);
  EXPECT_EQ(seen.size(), 28u);  // the 7 other batches, each index once, in order
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_LT(seen[i - 1], seen[i]);
  // Every slot came back: a full second epoch runs.
  size_t rows = 0;
  for (Batch& b : loader) rows += b.size();
  EXPECT_EQ(rows, 40u);
}

// A sampler whose second epoch fails: begin() throws and the epoch in progress carries on.
class SecondEpochFails : public Sampler {
 public:
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override {
    if (epoch == 1) throw std::runtime_error("sampler broke");
    SequentialSampler().indices(n, epoch, out);
  }
};

TEST(Loader, AThrowingSamplerLeavesTheCurrentEpochIntact) {
  LoaderOptions o;
  o.batch_size = 5;
  o.workers = 2;
  DataLoader loader(std::make_shared<IndexSource>(20), o, std::make_unique<SecondEpochFails>());
  auto first = loader.next();
  ASSERT_TRUE(first);
  EXPECT_THROW(loader.start_epoch(), std::runtime_error);
  EXPECT_EQ(loader.epoch(), 0u);
  std::vector<int64_t> rest;
  finishes_within(10s, "epoch after a failed begin", [&] {
    while (auto b = loader.next()) {
      auto v = values(*b);
      rest.insert(rest.end(), v.begin(), v.end());
    }
  });
  std::vector<int64_t> expected(15);
  std::iota(expected.begin(), expected.end(), 5);
  EXPECT_EQ(rest, expected);
}

TEST(Loader, RingMemoryIsConstantAcrossFiftyEpochs) {
  LoaderOptions o;
  o.batch_size = 16;
  o.workers = 2;
  DataLoader loader(std::make_shared<testing::IndexSource>(64), o, RandomSampler::make(0));
  const size_t bytes = loader.pinned_bytes();
  EXPECT_GT(bytes, 0u);
  for (int e = 0; e < 50; ++e) {
    for (Batch& b : loader) (void)b;
    ASSERT_EQ(loader.pinned_bytes(), bytes);
  }
  auto states = loader.stats().slot_states;
  // Nothing held by the user after the loop, so no slot is stuck in a non-free state but the
  // ones idle workers hold while they wait for the next epoch.
  EXPECT_EQ(states[static_cast<size_t>(SlotState::kReady)], 0u);
  EXPECT_EQ(states[static_cast<size_t>(SlotState::kCopying)], 0u);
}

TEST(Loader, UserHoldingEveryBatchDoesNotDeadlock) {
  LoaderOptions o;
  o.batch_size = 2;
  o.workers = 2;
  o.slots = 3;
  DataLoader loader(std::make_shared<IndexSource>(40), o);
  std::vector<Batch> kept;
  finishes_within(10s, "hoarding consumer", [&] {
    for (Batch& b : loader) kept.push_back(b);
  });
  ASSERT_EQ(kept.size(), 20u);
  EXPECT_GT(loader.stats().copies_to_host, 0u) << "with every slot held, batches come as copies";
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(values(kept[i]),
              (std::vector<int64_t>{static_cast<int64_t>(2 * i), static_cast<int64_t>(2 * i + 1)}));
  }
}

TEST(Loader, ZeroCopyBatchesViewTheRingAndReleaseTheirSlot) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  o.slots = 4;
  DataLoader loader(std::make_shared<IndexSource>(16), o);
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->fields[0].is_cpu());
  auto states = loader.stats().slot_states;
  EXPECT_GE(states[static_cast<size_t>(SlotState::kReady)], 1u) << "held batch keeps its slot";
  b.reset();
  while (loader.next()) {
  }  // the rest of the epoch flows through the released slots
  EXPECT_EQ(loader.stats().batches, 4u);
}

TEST(Loader, ReportsTheCpuPathWithoutAGpu) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  LoaderOptions o;
  o.workers = 1;
  DataLoader loader(std::make_shared<IndexSource>(4), o);
  EXPECT_FALSE(loader.is_pinned());
  EXPECT_NE(loader.mode().find("CPU only"), std::string::npos) << loader.mode();
  LoaderOptions gpu = o;
  gpu.device = c10::Device("cuda:0");
  try {
    DataLoader bad(std::make_shared<IndexSource>(4), gpu);
    ADD_FAILURE() << "a CUDA device without a GPU must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(Loader, IteratorMisuseIsAnError) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  DataLoader loader(std::make_shared<IndexSource>(4), o);
  auto it = loader.begin();
  EXPECT_NE(it, loader.end());
  ++it;
  EXPECT_EQ(it, loader.end());
  EXPECT_THROW(*it, std::out_of_range);
  EXPECT_THROW(++it, std::out_of_range);
  auto old = loader.begin();
  auto fresh = loader.begin();
  EXPECT_THROW(*old, std::logic_error);
  EXPECT_NO_THROW(*fresh);
  LoaderOptions zero;
  zero.batch_size = 0;
  EXPECT_THROW(DataLoader(std::make_shared<IndexSource>(4), zero), std::invalid_argument);
}

// An iterator belongs to the begin() that made it (issue 22). set_epoch(epoch()) then begin()
// starts the same epoch number again: the old iterator must not walk the new epoch.
TEST(Loader, AnIteratorOfAReplacedEpochThrowsEvenWithTheSameEpochNumber) {
  LoaderOptions o;
  o.batch_size = 2;
  o.workers = 1;
  DataLoader loader(std::make_shared<IndexSource>(8), o);
  auto old = loader.begin();
  ++old;  // batch 1 of epoch 0
  loader.set_epoch(loader.epoch());
  auto fresh = loader.begin();
  EXPECT_EQ(loader.epoch(), 0u);
  EXPECT_THROW(*old, std::logic_error);
  EXPECT_THROW(++old, std::logic_error);
  std::vector<size_t> sequences;
  for (; fresh != loader.end(); ++fresh) sequences.push_back(fresh->sequence);
  EXPECT_EQ(sequences, (std::vector<size_t>{0, 1, 2, 3}));  // the new epoch, whole
  // A load() replaces the epoch in progress too: the next batch comes from the checkpoint.
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive saved;
    loader.save(saved);
    saved.save_to(bytes);
  }
  auto before_load = loader.begin();
  torch::serialize::InputArchive checkpoint;
  checkpoint.load_from(bytes);
  loader.load(checkpoint);
  EXPECT_THROW(*before_load, std::logic_error);
  EXPECT_THROW(++before_load, std::logic_error);
}

// A sampler whose order has n - epoch % 2 entries, counting its calls.
class CountingSampler : public Sampler {
 public:
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override {
    calls.fetch_add(1);
    out.resize(n - epoch % 2);
    std::iota(out.begin(), out.end(), size_t{0});
  }
  mutable std::atomic<int> calls{0};
};

// batches_per_epoch() does not build the epoch's order on every call (issue 22): it is counted
// once per epoch, and is what the epoch delivers, for every sampler.
TEST(Loader, BatchesPerEpochIsCountedOncePerEpochAndIsWhatTheEpochDelivers) {
  LoaderOptions o;
  o.batch_size = 3;
  o.workers = 2;
  auto counting = std::make_unique<CountingSampler>();
  const CountingSampler& sampler = *counting;
  DataLoader loader(std::make_shared<IndexSource>(10), o, std::move(counting));
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    const int before = sampler.calls.load();
    size_t delivered = 0;
    for (Batch& b : loader) {
      (void)b;
      ++delivered;
      for (int i = 0; i < 100; ++i) ASSERT_EQ(loader.batches_per_epoch(), epoch % 2 ? 3u : 4u);
    }
    EXPECT_EQ(delivered, epoch % 2 ? 3u : 4u);  // 10 samples, then 9, in batches of 3
    EXPECT_LE(sampler.calls.load() - before, 2) << "epoch " << epoch;
  }
  struct Case {
    const char* name;
    std::function<std::unique_ptr<Sampler>()> make;
    size_t n;
    bool drop_last;
  };
  std::vector<Case> cases;
  for (size_t n : {10, 11, 12}) {
    for (bool drop_last : {false, true}) {
      cases.push_back({"sequential", [] { return SequentialSampler::make(); }, n, drop_last});
      cases.push_back({"random", [] { return RandomSampler::make(5); }, n, drop_last});
      for (bool sampler_drop_last : {false, true}) {
        cases.push_back({sampler_drop_last ? "distributed, drop_last" : "distributed",
                         [sampler_drop_last] {
                           return DistributedSampler::make(1, 4, true, 5, sampler_drop_last);
                         },
                         n, drop_last});
      }
    }
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + " n=" + std::to_string(c.n) +
                 " drop_last=" + std::to_string(c.drop_last));
    LoaderOptions d = o;
    d.drop_last = c.drop_last;
    DataLoader each(std::make_shared<IndexSource>(c.n), d, c.make());
    for (int epoch = 0; epoch < 2; ++epoch) {
      const size_t expected = each.batches_per_epoch();
      size_t delivered = 0;
      for (Batch& b : each) {
        (void)b;
        ++delivered;
      }
      EXPECT_EQ(delivered, expected);
      EXPECT_EQ(each.batches_per_epoch(), expected);
    }
  }
}

// poll(): a bounded wait that never loses or doubles a batch, on the CPU path and through a copy
// stage, and whose `timeout` counts from the first wait for a batch, across polls.
TEST(Loader, PollWaitsAtMostItsTimeAndLosesNothing) {
  for (bool copy_stage : {false, true}) {
    auto source = std::make_shared<IndexSource>(48);
    source->delay = 3ms;  // each batch of 8 takes about 24 ms on one worker
    LoaderOptions o;
    o.batch_size = 8;
    o.workers = 1;
    o.slots = 2;
    DataLoader loader(source, o, nullptr,
                      copy_stage ? std::make_unique<LateCopyEngine>(5ms) : nullptr);
    std::vector<int64_t> seen;
    size_t nothing_yet = 0;
    for (int epoch = 0; epoch < 2; ++epoch) {
      seen.clear();
      for (;;) {
        DataLoader::Poll p = loader.poll(epoch == 0 ? 0ms : 2ms);
        if (p.end) break;
        if (!p.batch) {
          ++nothing_yet;
          continue;
        }
        auto v = values(*p.batch);
        seen.insert(seen.end(), v.begin(), v.end());
      }
      std::vector<int64_t> expected(48);
      std::iota(expected.begin(), expected.end(), 0);
      EXPECT_EQ(seen, expected) << (copy_stage ? "copy stage" : "cpu") << ", epoch " << epoch;
      EXPECT_TRUE(loader.poll(0ms).end);  // the end stays the end until the next begin()
      loader.start_epoch();
    }
    EXPECT_GT(nothing_yet, 0u) << "a 0 ms poll found a batch ready every time";
  }
}

TEST(Loader, TheTimeoutCountsAcrossPolls) {
  auto source = std::make_shared<IndexSource>(16);
  source->stall_at = {4};
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  o.timeout = 400ms;
  DataLoader loader(source, o);
  ASSERT_TRUE(loader.next());  // batch 0; batch 1 stalls
  size_t polls = 0;
  finishes_within(20s, "polling a stalled batch", [&] {
    try {
      for (;;) {
        DataLoader::Poll p = loader.poll(50ms);
        ASSERT_FALSE(p.batch || p.end);
        ++polls;
      }
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("400 ms"), std::string::npos) << e.what();
    }
  });
  EXPECT_GE(polls, 2u);  // several short polls, then the loader's own timeout
  source->unstall();
  auto late = loader.next();  // the batch still arrives once the worker is unstuck
  ASSERT_TRUE(late);
  EXPECT_EQ(values(*late), (std::vector<int64_t>{4, 5, 6, 7}));
}

// A source whose fields are known only once a sample is read (SampleSource::learns_fields): each
// sample is `width` int64 values, index * 100 + k, and `width` is learnt from the sample read.
class LearningSource : public SampleSource {
 public:
  LearningSource(size_t n, int64_t width) : n_(n), width_(width) {}
  size_t size() const override { return n_; }
  bool learns_fields() const override { return true; }
  std::vector<FieldSpec> fields() const override { return fields_; }
  std::vector<FieldSpec> learn_fields(size_t index) override {
    learnt_from.push_back(index);
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (fail_at.count(index)) throw std::runtime_error("synthetic failure reading the shapes");
    fields_ = {{"value", c10::ScalarType::Long, {width_}}};
    return fields_;
  }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    auto* out = reinterpret_cast<int64_t*>(fields[0]);
    for (int64_t k = 0; k < width_; ++k) out[k] = static_cast<int64_t>(ctx.index) * 100 + k;
  }
  std::string describe(size_t index) const override {
    return "/data/row_" + std::to_string(index) + ".bin";
  }

  std::set<size_t> fail_at;            // set before the loader starts
  std::chrono::milliseconds delay{0};  // per learn_fields call
  std::vector<size_t> learnt_from;     // written by the probe thread, read after it

 private:
  size_t n_;
  int64_t width_;
  std::vector<FieldSpec> fields_;
};

TEST(Loader, ASourceThatLearnsItsFieldsIsReadForThemWhenTheFirstEpochStarts) {
  auto source = std::make_shared<LearningSource>(10, 3);
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  DataLoader loader(source, o);  // nothing is read yet
  EXPECT_TRUE(source->learnt_from.empty());
  EXPECT_NE(loader.mode().find("not started"), std::string::npos) << loader.mode();
  std::vector<int64_t> seen;
  for (const Batch& b : loader) {
    const at::Tensor v = b.field("value");
    ASSERT_EQ(v.sizes(), (c10::IntArrayRef{static_cast<int64_t>(b.size()), 3}));
    for (size_t r = 0; r < b.size(); ++r) {
      for (int64_t k = 0; k < 3; ++k) {
        EXPECT_EQ(v[static_cast<int64_t>(r)][k].item<int64_t>(),
                  static_cast<int64_t>(b.indices[r]) * 100 + k);
      }
      seen.push_back(static_cast<int64_t>(b.indices[r]));
    }
  }
  EXPECT_EQ(source->learnt_from, (std::vector<size_t>{0}));  // once: the first of the order
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all);
  EXPECT_NE(loader.mode().find("host ring"), std::string::npos) << loader.mode();
  size_t second = 0;
  for (const Batch& b : loader) second += b.size();  // a second epoch: no new read
  EXPECT_EQ(second, 10u);
  EXPECT_EQ(source->learnt_from.size(), 1u);
}

TEST(Loader, ASampleThatFailsToTellTheFieldsFailsItsBatchAndTheEpochGoesOn) {
  auto source = std::make_shared<LearningSource>(10, 2);
  source->fail_at = {0};
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  DataLoader loader(source, o);
  try {
    loader.next();
    ADD_FAILURE() << "expected the failure of sample 0";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), 0u);
    EXPECT_EQ(e.path(), "/data/row_0.bin");
    const std::string what = e.what();
    EXPECT_NE(what.find("sample 0 (/data/row_0.bin) failed in batch 0 of epoch 0"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("synthetic failure reading the shapes"), std::string::npos) << what;
  }
  std::vector<size_t> rest;  // batch 0 is passed over, not delivered later
  while (auto b = loader.next()) rest.insert(rest.end(), b->indices.begin(), b->indices.end());
  EXPECT_EQ(rest, (std::vector<size_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(source->learnt_from, (std::vector<size_t>{0, 4}));

  // Under kSkip the next samples of the batch are tried, as substitutes are.
  auto skipping = std::make_shared<LearningSource>(10, 2);
  skipping->fail_at = {0, 1};
  o.on_error = ErrorPolicy::kSkip;
  DataLoader skipper(skipping, o);
  auto first = skipper.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(skipping->learnt_from, (std::vector<size_t>{0, 1, 2}));
}

TEST(Loader, AProbeSlowerThanTheTimeoutNamesItsSampleAndThenArrives) {
  auto source = std::make_shared<LearningSource>(8, 1);
  source->delay = 600ms;
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  o.timeout = 100ms;
  DataLoader loader(source, o);
  try {
    loader.next();
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sample 0 (/data/row_0.bin), the first of batch 0 of epoch 0, read to "
                        "learn the shapes of the batch's tensors, did not load within 100 ms"),
              std::string::npos)
        << what;
  }
  // The probe goes on; a later wait gets the batch, read once.
  std::optional<Batch> batch;
  for (int i = 0; i < 50 && !batch; ++i) {
    try {
      batch = loader.next();
    } catch (const TimeoutError&) {
    }
  }
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->indices, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(source->learnt_from, (std::vector<size_t>{0}));

  // Polled in short waits, the probe's timeout still runs from the first wait, as a batch's does.
  auto polled_source = std::make_shared<LearningSource>(8, 1);
  polled_source->delay = 600ms;
  DataLoader polled(polled_source, o);
  const auto t0 = std::chrono::steady_clock::now();
  bool timed_out = false;
  for (int i = 0; i < 100 && !timed_out; ++i) {
    try {
      const DataLoader::Poll p = polled.poll(10ms);
      EXPECT_FALSE(p.batch || p.end);
    } catch (const TimeoutError& e) {
      timed_out = true;
      EXPECT_NE(std::string(e.what()).find("read to learn the shapes"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(timed_out) << "10 ms polls never reached the 100 ms timeout";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 550ms);  // before the read ended
}

}  // namespace
}  // namespace conveyor
