// workers = kAutoWorkers (issue 23): the tuner alone, on counters made up to order, then the loader
// on this (2-core) machine with work whose cost is not CPU: a source whose samples sleep a fixed
// time (a network or disk read) and a consumer that sleeps a fixed time per step (a training
// step). No assertion on speed: only on what the tuner chooses, on the consumer's share of time
// spent waiting (with wide margins), and on the batches' bytes.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include "test_support.h"
#include "worker_tuner.h"

namespace conveyor {
namespace {

using detail::WorkerTuner;
using testing::IndexSource;
using Clock = std::chrono::steady_clock;

// --- The tuner alone: each batch takes `step` seconds of the consumer's own time plus `wait`
// seconds waiting, and its samples took `busy_per_sample` seconds of worker time each.
struct Pace {
  double step, wait, busy_per_sample;
};

size_t feed(WorkerTuner& tuner, WorkerTuner::Counters& c, size_t batches, size_t batch_size,
            Pace pace) {
  for (size_t i = 0; i < batches; ++i) {
    c.seconds += pace.step + pace.wait;
    c.wait_seconds += pace.wait;
    c.busy_seconds += pace.busy_per_sample * static_cast<double>(batch_size);
    c.samples += batch_size;
    tuner.observe(c);
  }
  return tuner.active();
}

WorkerTuner::Options tuning(size_t max_workers, size_t initial) {
  WorkerTuner::Options o;
  o.max_workers = max_workers;
  o.initial_workers = initial;
  o.slots = max_workers + 4;
  return o;
}

TEST(WorkerTunerTest, AStarvedConsumerRaisesToTheBudgetInOneJudgedWindow) {
  WorkerTuner tuner(tuning(8, 2));
  WorkerTuner::Counters c;
  // The consumer does nothing and waits for every batch: the pipeline needs every worker.
  feed(tuner, c, 8, 32, {0.0001, 0.05, 0.002});  // the first window only refills
  EXPECT_EQ(tuner.active(), 8u);
  EXPECT_EQ(tuner.depth(), std::min<size_t>(8 + 2 + 2, 12));
  feed(tuner, c, 400, 32, {0.0001, 0.05, 0.002});
  EXPECT_EQ(tuner.active(), 8u) << "never above the budget";
  EXPECT_EQ(tuner.changes(), 1u);
}

TEST(WorkerTunerTest, ASlowConsumerLowersByHalvesToWhatItNeeds) {
  WorkerTuner tuner(tuning(8, 8));
  WorkerTuner::Counters c;
  // 1 ms of work per sample, 10 ms of consumer time per sample: a tenth of a worker keeps up.
  feed(tuner, c, 200, 16, {0.16, 0.0, 0.001});
  EXPECT_EQ(tuner.active(), 1u);
  EXPECT_EQ(tuner.depth(), 1u + 2 + 2);
  const std::vector<ActiveWorkers> h = tuner.history();
  ASSERT_EQ(h.size(), 4u);  // the start, then 8 -> 4 -> 2 -> 1
  const std::vector<size_t> workers = {h[0].workers, h[1].workers, h[2].workers, h[3].workers};
  EXPECT_EQ(workers, (std::vector<size_t>{8, 4, 2, 1}));
  // A refilling window, then two judged windows in a row, before each lowering.
  EXPECT_EQ(h[1].batch, 12u);
  EXPECT_EQ(h[2].batch, 24u);
  EXPECT_EQ(h[3].batch, 36u);
}

TEST(WorkerTunerTest, KeepsTheWorkersAConsumerNeedsWithHeadroom) {
  WorkerTuner tuner(tuning(16, 16));
  WorkerTuner::Counters c;
  // 4 ms of work per sample, 1 ms of consumer time: 4 workers keep up, 6 with the lowering rule's
  // headroom (1.5x), so the tuner lowers 16 -> 8 -> 6 and stops there.
  feed(tuner, c, 400, 8, {0.008, 0.0, 0.004});
  EXPECT_EQ(tuner.active(), 6u);
  EXPECT_EQ(tuner.history().size(), 3u);
}

TEST(WorkerTunerTest, OneWindowThatLooksIdleDoesNotLower) {
  WorkerTuner tuner(tuning(6, 6));
  WorkerTuner::Counters c;
  // A consumer that needs every worker, descheduled for one window (it then drains batches the
  // workers made meanwhile, without waiting): that window alone never lowers the count.
  for (int round = 0; round < 20; ++round) {
    feed(tuner, c, 4, 8, {0.0001, 0.01, 0.002});
    feed(tuner, c, 4, 8, {0.05, 0.0, 0.002});
  }
  EXPECT_EQ(tuner.active(), 6u);
  EXPECT_EQ(tuner.changes(), 0u);
}

TEST(WorkerTunerTest, AConsumerStarvedAfterALoweringBacksOffFromLoweringAgain) {
  WorkerTuner tuner(tuning(4, 2));
  WorkerTuner::Counters c;
  for (int round = 0; round < 6; ++round) {
    feed(tuner, c, 12, 8, {0.01, 0.0, 0.0001});   // idle: lowers to 1
    feed(tuner, c, 12, 8, {0.01, 0.01, 0.0001});  // starved: raises again
  }
  // Without the back-off this alternation changed the count twice per round (12 changes).
  EXPECT_LT(tuner.changes(), 12u);
  EXPECT_LE(tuner.active(), 4u);
}

// --- The loader with sleeping samples and a sleeping consumer.

struct EpochRun {
  std::vector<std::vector<int64_t>> batches;  // each batch's values, in order
  LoaderStats stats;
  double wait_share_after_settling = 0;  // of the consumer's time, after `settle` batches
};

// One epoch of `source` under `options`, the consumer sleeping step(n) after batch n; the
// consumer's waits are timed from `settle` batches on.
EpochRun run_epoch(std::shared_ptr<IndexSource> source, LoaderOptions options,
                   const std::function<std::chrono::microseconds(size_t)>& step, size_t settle) {
  EpochRun run;
  DataLoader loader(source, options);
  testing::finishes_within(std::chrono::seconds(240), "an epoch under the tuner", [&] {
    double waited = 0, total = 0;
    size_t n = 0;
    for (auto t0 = Clock::now();;) {
      const auto asked = Clock::now();
      std::optional<Batch> b = loader.next();
      const auto got = Clock::now();
      if (!b) break;
      if (n >= settle) {
        waited += std::chrono::duration<double>(got - asked).count();
        total += std::chrono::duration<double>(got - t0).count();
      }
      const at::Tensor v = b->field("value").contiguous();
      run.batches.emplace_back(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
      if (step(n).count() > 0) std::this_thread::sleep_for(step(n));
      t0 = got;
      ++n;
      EXPECT_LE(loader.stats().active_workers, options.max_workers) << "batch " << n;
    }
    run.wait_share_after_settling = total > 0 ? waited / total : 0;
  });
  run.stats = loader.stats();
  return run;
}

size_t most_workers(const LoaderStats& s) {
  size_t most = 0;
  for (const ActiveWorkers& a : s.active_workers_history) most = std::max(most, a.workers);
  return most;
}

TEST(WorkerTunerLoaderTest, ASlowConsumerSettlesAtFewWorkersAndStillBarelyWaits) {
  // 1 ms per sample, 8 per batch: one worker fills a batch in about 8 ms; the consumer takes 60 ms
  // per batch, so one worker keeps up with room to spare, even on a loaded machine.
  auto source = std::make_shared<IndexSource>(8 * 90);
  source->delay = std::chrono::milliseconds(1);
  LoaderOptions o;
  o.batch_size = 8;
  o.workers = kAutoWorkers;
  o.max_workers = 6;
  const EpochRun run = run_epoch(
      source, o, [](size_t) { return std::chrono::milliseconds(60); }, /*settle=*/48);
  ASSERT_EQ(run.batches.size(), 90u);
  const auto& history = run.stats.active_workers_history;
  ASSERT_FALSE(history.empty());
  EXPECT_EQ(history.front().workers, 6u) << "starts with the whole budget";
  EXPECT_LE(run.stats.active_workers, 2u) << "settles at few workers";
  EXPECT_LE(history.back().batch, 48u) << "settled within 48 batches";
  EXPECT_LE(most_workers(run.stats), 6u);
  EXPECT_LT(run.wait_share_after_settling, 0.05) << "the consumer waits under 5% of the time";
}

TEST(WorkerTunerLoaderTest, AConsumerThatTurnsFastGrowsTheWorkersToTheBudget) {
  // 2 ms per sample, 8 per batch (16 ms of sleep per batch and worker). The consumer takes 60 ms
  // per batch for its first 30 batches (one worker keeps up), then nothing: every worker is
  // needed from then on.
  auto source = std::make_shared<IndexSource>(8 * 150);
  source->delay = std::chrono::milliseconds(2);
  LoaderOptions o;
  o.batch_size = 8;
  o.workers = kAutoWorkers;
  o.max_workers = 6;
  constexpr size_t kSlowBatches = 30;
  const EpochRun run = run_epoch(
      source, o,
      [](size_t n) {
        return n < kSlowBatches ? std::chrono::microseconds(60000) : std::chrono::microseconds(0);
      },
      /*settle=*/0);
  ASSERT_EQ(run.batches.size(), 150u);
  const auto& history = run.stats.active_workers_history;
  ASSERT_GE(history.size(), 3u);
  size_t fewest_while_slow = 6;
  for (const ActiveWorkers& a : history) {
    if (a.batch <= kSlowBatches) fewest_while_slow = std::min(fewest_while_slow, a.workers);
  }
  EXPECT_LE(fewest_while_slow, 2u) << "few workers while the consumer is slow";
  std::string changes;  // for the messages: workers@batch
  for (const ActiveWorkers& a : history) {
    changes += " " + std::to_string(a.workers) + "@" + std::to_string(a.batch);
  }
  // It reaches the budget within 40 batches of the consumer turning fast, and then spends at
  // least 3/4 of the epoch's remaining batches there (a descheduled consumer on a loaded machine
  // may cost a lowering, which the next window undoes).
  uint64_t reached = 0, at_budget = 0;
  for (size_t i = 0; i < history.size(); ++i) {
    const uint64_t until = i + 1 < history.size() ? history[i + 1].batch : 150;
    if (history[i].workers == 6 && history[i].batch >= kSlowBatches) {
      if (reached == 0) reached = history[i].batch;
      const uint64_t from = std::max<uint64_t>(history[i].batch, kSlowBatches + 40);
      if (until > from) at_budget += until - from;
    }
  }
  EXPECT_GT(reached, 0u) << "grows to the budget:" << changes;
  EXPECT_LE(reached, kSlowBatches + 40) << "within 40 batches:" << changes;
  EXPECT_GE(at_budget, (150 - kSlowBatches - 40) * 3 / 4) << "stays there:" << changes;
  EXPECT_EQ(most_workers(run.stats), 6u) << "never above it";
}

TEST(WorkerTunerLoaderTest, BatchesAreTheSameWhateverTheTunerDoes) {
  // A consumer that is slow for the first half of the epoch and fast for the second, so the tuner
  // lowers and then raises the workers mid-epoch; shuffled, so rows come from all over.
  auto source = std::make_shared<IndexSource>(8 * 80 + 5);
  source->delay = std::chrono::microseconds(500);
  LoaderOptions o;
  o.batch_size = 8;
  o.workers = kAutoWorkers;
  o.max_workers = 4;
  o.chunk_size = 2;
  std::vector<std::vector<int64_t>> tuned;
  size_t changes = 0;
  {
    DataLoader loader(source, o, RandomSampler::make(7));
    testing::finishes_within(std::chrono::seconds(240), "a tuned epoch", [&] {
      for (Batch& b : loader) {
        const at::Tensor v = b.field("value").contiguous();
        tuned.emplace_back(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
        if (tuned.size() < 40) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      }
    });
    changes = loader.stats().active_workers_history.size() - 1;
  }
  EXPECT_GE(changes, 2u) << "the tuner changed the workers during the epoch";
  LoaderOptions fixed = o;
  fixed.workers = 3;
  fixed.max_workers = 0;
  std::vector<std::vector<int64_t>> reference;
  DataLoader loader(source, fixed, RandomSampler::make(7));
  for (Batch& b : loader) {
    const at::Tensor v = b.field("value").contiguous();
    reference.emplace_back(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
  }
  EXPECT_EQ(tuned, reference);
}

TEST(WorkerTunerLoaderTest, ImagesAreByteIdenticalToFixedWorkersAndResumeIsUnchanged) {
  testing::TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b"}, 20);
  auto images = [&] { return ImageSource::image_folder(dir.path(), ImageTransform::train(32)); };
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 3;
  o.workers = kAutoWorkers;
  o.max_workers = 3;
  LoaderOptions fixed = o;
  fixed.workers = 1;
  fixed.max_workers = 0;
  DataLoader tuned(images(), o, RandomSampler::make(5));
  DataLoader reference(images(), fixed, RandomSampler::make(5));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<Batch> a, b;
    for (Batch& x : tuned) a.push_back(x);
    for (Batch& x : reference) b.push_back(x);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i].images().equal(b[i].images())) << "epoch " << epoch << " batch " << i;
      EXPECT_TRUE(a[i].labels().equal(b[i].labels()));
    }
  }
  // A checkpoint taken under kAutoWorkers resumes on fixed workers, and the other way round.
  torch::serialize::OutputArchive saved;
  {
    DataLoader first(images(), o, RandomSampler::make(5));
    auto it = first.begin();
    ++it;  // two batches received
    first.save(saved);
  }
  std::stringstream bytes;
  saved.save_to(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  DataLoader resumed(images(), fixed, RandomSampler::make(5));
  resumed.load(archive);
  std::vector<Batch> rest;
  for (Batch& x : resumed) rest.push_back(x);
  DataLoader whole(images(), fixed, RandomSampler::make(5));
  std::vector<Batch> all;
  for (Batch& x : whole) all.push_back(x);
  ASSERT_EQ(rest.size() + 2, all.size());
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_TRUE(rest[i].images().equal(all[i + 2].images())) << "batch " << i + 2;
  }
}

}  // namespace
}  // namespace conveyor
