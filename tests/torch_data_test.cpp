// The drop-in's promises: options, iterators, ordering, exactly-once delivery, exceptions and the
// timeout behave as torch::data's do. Where a behaviour is torch's, the same test runs torch's
// own loader next to Conveyor's, so any difference shows; where Conveyor deliberately differs
// (a new epoch after a break), the test shows both.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "test_support.h"

namespace conveyor {
namespace {

namespace td = torch::data;
using namespace std::chrono_literals;

struct BadSample : std::runtime_error {
  explicit BadSample(size_t index)
      : std::runtime_error("bad sample " + std::to_string(index)), index(index) {}
  size_t index;
};

// What the copies of a dataset share: failures, delays and who called get() on which copy.
struct Probe {
  std::set<size_t> fail_at;
  std::set<size_t> odd_shape_at;
  std::chrono::milliseconds delay{0};
  size_t slow_every = 0;  // with delay: only indices divisible by it are slow (0: all)
  std::atomic<int> shared_copy_calls{0};  // get() on a copy another thread used before
  std::mutex mutex;
  std::set<std::thread::id> threads;
};

// Sample i: data float [3,2,2] filled with i, target int64 i.
class Numbers : public td::datasets::Dataset<Numbers> {
 public:
  explicit Numbers(size_t n, std::shared_ptr<Probe> probe = std::make_shared<Probe>())
      : n_(n), probe_(std::move(probe)) {}
  td::Example<> get(size_t index) override {
    const std::thread::id me = std::this_thread::get_id();
    if (owner_ == std::thread::id()) owner_ = me;
    if (owner_ != me) probe_->shared_copy_calls.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(probe_->mutex);
      probe_->threads.insert(me);
    }
    if (probe_->delay.count() > 0 && (probe_->slow_every == 0 || index % probe_->slow_every == 0)) {
      std::this_thread::sleep_for(probe_->delay);
    }
    if (probe_->fail_at.count(index)) throw BadSample(index);
    const auto v = static_cast<double>(index);
    at::Tensor data =
        probe_->odd_shape_at.count(index) ? torch::full({3, 2, 3}, v) : torch::full({3, 2, 2}, v);
    return {data, torch::tensor(static_cast<int64_t>(index))};
  }
  std::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
  std::shared_ptr<Probe> probe_;
  std::thread::id owner_;  // per copy: the thread that uses this copy
};

// A dataset with its own get_batch: batches are plain vectors of squares.
class Squares : public td::datasets::BatchDataset<Squares, std::vector<int64_t>> {
 public:
  explicit Squares(size_t n) : n_(n) {}
  std::vector<int64_t> get_batch(c10::ArrayRef<size_t> indices) override {
    std::vector<int64_t> out;
    for (size_t i : indices) {
      if (i == fail_at_) throw BadSample(i);
      out.push_back(static_cast<int64_t>(i * i));
    }
    return out;
  }
  std::optional<size_t> size() const override { return n_; }
  size_t fail_at_ = SIZE_MAX;

 private:
  size_t n_;
};

// A stateful stream 0..n-1 handed out in chunks; shared by the workers.
class Countdown : public td::datasets::StatefulDataset<Countdown, std::vector<int64_t>> {
 public:
  explicit Countdown(size_t n) : n_(n), state_(std::make_shared<State>()) {}
  std::optional<std::vector<int64_t>> get_batch(size_t batch_size) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->next >= n_) return std::nullopt;
    std::vector<int64_t> out;
    for (size_t k = 0; k < batch_size && state_->next < n_; ++k) {
      out.push_back(static_cast<int64_t>(state_->next++));
    }
    return out;
  }
  std::optional<size_t> size() const override { return n_; }
  void reset() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->next = 0;
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}

 private:
  struct State {
    std::mutex mutex;
    size_t next = 0;
  };
  size_t n_;
  std::shared_ptr<State> state_;
};

auto stacked(size_t n, std::shared_ptr<Probe> probe = std::make_shared<Probe>()) {
  return Numbers(n, std::move(probe)).map(td::transforms::Stack<>());
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The targets of every batch of one epoch, checking each row's data holds its target.
template <typename Loader>
std::vector<std::vector<int64_t>> epoch_targets(Loader& loader) {
  std::vector<std::vector<int64_t>> batches;
  for (auto& batch : loader) {
    std::vector<int64_t> targets = to_vector(batch.target);
    at::Tensor data = batch.data.to(at::kCPU);
    for (size_t r = 0; r < targets.size(); ++r) {
      EXPECT_TRUE(
          data[static_cast<int64_t>(r)].eq(static_cast<double>(targets[r])).all().item<bool>())
          << "row " << r << " of a batch does not hold sample " << targets[r];
    }
    batches.push_back(std::move(targets));
  }
  return batches;
}

template <typename Loader>
std::vector<std::vector<int64_t>> epoch_vectors(Loader& loader) {
  std::vector<std::vector<int64_t>> batches;
  for (auto& batch : loader) batches.push_back(batch);
  return batches;
}

std::string message_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// ---------------------------------------------------------------------------------------------
// Options

void takes_options(const DataLoaderOptions& o, size_t expected_batch) {
  EXPECT_EQ(o.batch_size(), expected_batch);
}

TEST(TorchDataOptions, DefaultsSettersAndImplicitBatchSizeMatchTorch) {
  const td::DataLoaderOptions theirs;
  const DataLoaderOptions ours;
  EXPECT_EQ(ours.batch_size(), theirs.batch_size());
  EXPECT_EQ(ours.workers(), theirs.workers());
  EXPECT_EQ(ours.max_jobs(), theirs.max_jobs());
  EXPECT_EQ(ours.timeout(), theirs.timeout());
  EXPECT_EQ(ours.enforce_ordering(), theirs.enforce_ordering());
  EXPECT_EQ(ours.drop_last(), theirs.drop_last());
  // Conveyor's additions default to torch::data's behaviour: no pinning, batches on the CPU.
  EXPECT_FALSE(ours.pin_memory());
  EXPECT_TRUE(ours.device().is_cpu());
  EXPECT_EQ(ours.on_error(), ErrorPolicy::kRaise);

  takes_options(64, 64);  // implicit construction from a batch size, as torch's
  DataLoaderOptions chained = DataLoaderOptions(8)
                                  .workers(3)
                                  .max_jobs(5)
                                  .timeout(20ms)
                                  .enforce_ordering(false)
                                  .drop_last(true)
                                  .pin_memory(true)
                                  .prefetch_factor(4)
                                  .seed(9);
  EXPECT_EQ(chained.batch_size(), 8u);
  EXPECT_EQ(chained.workers(), 3u);
  EXPECT_EQ(chained.max_jobs(), std::optional<size_t>(5));
  EXPECT_EQ(chained.timeout(), std::optional<std::chrono::milliseconds>(20ms));
  EXPECT_FALSE(chained.enforce_ordering());
  EXPECT_TRUE(chained.drop_last());
  EXPECT_TRUE(chained.pin_memory());
  EXPECT_EQ(chained.prefetch_factor(), 4u);
  EXPECT_EQ(chained.seed(), 9u);
}

TEST(TorchDataOptions, ResolvedOptionsMatchTorchsLoader) {
  for (const auto& [workers, max_jobs] :
       std::vector<std::pair<size_t, std::optional<size_t>>>{{0, {}}, {3, {}}, {2, 7}}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    auto theirs = td::make_data_loader(
        stacked(10), td::DataLoaderOptions(4).workers(workers).max_jobs(max_jobs).drop_last(true));
    auto ours = make_data_loader(
        stacked(10), DataLoaderOptions(4).workers(workers).max_jobs(max_jobs).drop_last(true));
    EXPECT_EQ(ours->options().batch_size, theirs->options().batch_size);
    EXPECT_EQ(ours->options().workers, theirs->options().workers);
    EXPECT_EQ(ours->options().max_jobs, theirs->options().max_jobs);
    EXPECT_EQ(ours->options().timeout, theirs->options().timeout);
    EXPECT_EQ(ours->options().enforce_ordering, theirs->options().enforce_ordering);
    EXPECT_EQ(ours->options().drop_last, theirs->options().drop_last);
  }
}

TEST(TorchDataOptions, BadOptionsAreRejectedWithTheReason) {
  EXPECT_THROW(make_data_loader(stacked(4), DataLoaderOptions(0)), std::invalid_argument);
  if (!cuda_available()) {
    const std::string message =
        message_of([] { make_data_loader(stacked(4), DataLoaderOptions(2).device(torch::kCUDA)); });
    EXPECT_NE(message.find("no CUDA device is usable"), std::string::npos) << message;
  }
  // kSkip needs per-sample loading; a dataset with its own get_batch cannot honour it.
  EXPECT_THROW(make_data_loader(Squares(4), DataLoaderOptions(2).on_error(ErrorPolicy::kSkip)),
               std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Which path

TEST(TorchDataPaths, StackedPerSampleDatasetsAreCollatedOthersBatched) {
  auto plain = make_data_loader(stacked(6), DataLoaderOptions(2).workers(2));
  auto normalized =
      make_data_loader(Numbers(6)
                           .map(td::transforms::Normalize<>({0.5, 0.5, 0.5}, {2.0, 2.0, 2.0}))
                           .map(td::transforms::Stack<>()),
                       DataLoaderOptions(2).workers(2));
  auto unstacked = make_data_loader(Numbers(6), DataLoaderOptions(2).workers(2));
  auto custom = make_data_loader(Squares(6), DataLoaderOptions(2).workers(2));
  EXPECT_EQ(plain->mode().rfind("collated", 0), 0u) << plain->mode();
  EXPECT_EQ(normalized->mode().rfind("collated", 0), 0u) << normalized->mode();
  EXPECT_EQ(unstacked->mode().rfind("batched", 0), 0u) << unstacked->mode();
  EXPECT_EQ(custom->mode().rfind("batched", 0), 0u) << custom->mode();
  // Once running, the collated path says it is on Conveyor's engine.
  (void)epoch_targets(*plain);
  EXPECT_NE(plain->mode().find("host ring"), std::string::npos) << plain->mode();
}

TEST(TorchDataPaths, NormalizeThenStackGivesTorchsValues) {
  auto transform = td::transforms::Normalize<>({0.5, 1.0, 1.5}, {2.0, 4.0, 0.5});
  auto theirs = td::make_data_loader<td::samplers::SequentialSampler>(
      Numbers(9).map(transform).map(td::transforms::Stack<>()), td::DataLoaderOptions(4));
  auto ours = make_data_loader<td::samplers::SequentialSampler>(
      Numbers(9).map(transform).map(td::transforms::Stack<>()), DataLoaderOptions(4).workers(2));
  std::vector<td::Example<>> expected, got;
  for (auto& b : *theirs) expected.push_back(b);
  for (auto& b : *ours) got.push_back({b.data.clone(), b.target.clone()});
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].data.equal(expected[i].data)) << "batch " << i;
    EXPECT_TRUE(got[i].target.equal(expected[i].target)) << "batch " << i;
    EXPECT_EQ(got[i].data.sizes(), expected[i].data.sizes());
    EXPECT_EQ(got[i].data.scalar_type(), expected[i].data.scalar_type());
  }
}

// ---------------------------------------------------------------------------------------------
// Iterators

template <typename Loader>
void check_iterator_rules(Loader& loader, const char* who) {
  SCOPED_TRACE(who);
  auto end = loader.end();
  EXPECT_TRUE(end == loader.end());  // sentinels always compare equal
  auto it = loader.begin();
  auto copy = it;
  EXPECT_TRUE(it == it);
  EXPECT_TRUE(copy == it);  // a copy shares the position
  EXPECT_TRUE(it != end);
  EXPECT_TRUE(end != it);
  size_t batches = 0;
  for (; it != end; ++it) {
    EXPECT_EQ(it->target.size(0), batches < 2 ? 2 : 1);
    ++batches;
  }
  EXPECT_EQ(batches, 3u);
  EXPECT_TRUE(it == end);
  EXPECT_TRUE(copy == end);
  EXPECT_NE(
      message_of([&] { *it; }).find("Attempted to dereference iterator that was past the end"),
      std::string::npos);
  EXPECT_NE(message_of([&] { ++it; }).find("Attempted to increment iterator past the end"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              *end;
            }).find("Dereferencing the DataLoader's past-the-end iterator is not allowed"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ++end;
            }).find("Incrementing the DataLoader's past-the-end iterator is not allowed"),
            std::string::npos);
  EXPECT_THROW(*it, c10::Error);
  EXPECT_THROW(++end, c10::Error);
  // A whole second epoch after a finished one works for both.
  size_t second = 0;
  for (auto& b : loader) second += static_cast<size_t>(b.target.size(0));
  EXPECT_EQ(second, 5u);
}

TEST(TorchDataIterator, EqualityEndAndPastTheEndRulesMatchTorch) {
  static_assert(std::is_same_v<std::iterator_traits<Iterator<td::Example<>>>::iterator_category,
                               std::input_iterator_tag>);
  for (size_t workers : {0, 2}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    auto theirs = td::make_data_loader<td::samplers::SequentialSampler>(
        stacked(5), td::DataLoaderOptions(2).workers(workers));
    auto ours = make_data_loader<td::samplers::SequentialSampler>(
        stacked(5), DataLoaderOptions(2).workers(workers));
    auto batched = make_data_loader<td::samplers::SequentialSampler>(
        Numbers(5).map(td::transforms::Collate<td::Example<>>(
            [](std::vector<td::Example<>> e) { return td::transforms::Stack<>().apply_batch(e); })),
        DataLoaderOptions(2).workers(workers));
    ASSERT_EQ(batched->mode().rfind("batched", 0), 0u);
    check_iterator_rules(*theirs, "torch::data");
    check_iterator_rules(*ours, "conveyor collated");
    check_iterator_rules(*batched, "conveyor batched");
  }
}

TEST(TorchDataIterator, EmptyDatasetBeginEqualsEndLikeTorch) {
  auto theirs = td::make_data_loader(stacked(0), td::DataLoaderOptions(2).workers(1));
  auto ours = make_data_loader(stacked(0), DataLoaderOptions(2).workers(1));
  EXPECT_TRUE(theirs->begin() == theirs->end());
  EXPECT_TRUE(ours->begin() == ours->end());
}

// Deliberate difference: torch::data refuses begin() while batches are in flight; Conveyor starts
// a new epoch (and the replaced epoch's iterator refuses to go on).
TEST(TorchDataIterator, NewEpochAfterBreakWorksWhereTorchThrows) {
  auto theirs = td::make_data_loader<td::samplers::SequentialSampler>(
      stacked(20), td::DataLoaderOptions(2).workers(2));
  auto first = theirs->begin();
  (void)*first;
  EXPECT_NE(message_of([&] { theirs->begin(); })
                .find("Attempted to get a new DataLoader iterator while another iterator is not "
                      "yet exhausted"),
            std::string::npos);

  auto collated = make_data_loader<td::samplers::SequentialSampler>(
      stacked(20), DataLoaderOptions(2).workers(2));
  auto batched = make_data_loader<td::samplers::SequentialSampler>(Squares(20),
                                                                   DataLoaderOptions(2).workers(2));
  {
    auto old = collated->begin();
    EXPECT_EQ(to_vector(old->target), (std::vector<int64_t>{0, 1}));
    std::vector<int64_t> all;
    for (auto& b : *collated) {  // a new, complete epoch
      for (int64_t v : to_vector(b.target)) all.push_back(v);
    }
    std::vector<int64_t> expected(20);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected);
    const std::string message = message_of([&] { ++old; });
    EXPECT_NE(message.find("which a later begin() replaced"), std::string::npos) << message;
  }
  {
    auto old = batched->begin();
    EXPECT_EQ(*old, (std::vector<int64_t>{0, 1}));
    size_t rows = 0;
    for (auto& b : *batched) rows += b.size();
    EXPECT_EQ(rows, 20u);
    EXPECT_THROW(++old, c10::Error);
  }
}

// ---------------------------------------------------------------------------------------------
// Ordering and exactly-once

TEST(TorchDataDelivery, SameBatchesAsTorchForSequentialAndRandomSamplers) {
  struct Combo {
    size_t n, batch, workers;
    bool drop_last;
  };
  for (const Combo& c : std::vector<Combo>{{10, 4, 0, false},
                                           {10, 4, 2, true},
                                           {37, 5, 3, false},
                                           {64, 8, 4, true},
                                           {7, 16, 2, false}}) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " batch=" + std::to_string(c.batch) + " workers=" +
                 std::to_string(c.workers) + " drop_last=" + std::to_string(c.drop_last));
    auto probe = std::make_shared<Probe>();
    probe->delay = 2ms;
    probe->slow_every = 3;  // some samples slow, so workers finish out of order
    {
      auto theirs = td::make_data_loader<td::samplers::SequentialSampler>(
          stacked(c.n, probe),
          td::DataLoaderOptions(c.batch).workers(c.workers).drop_last(c.drop_last));
      auto ours = make_data_loader<td::samplers::SequentialSampler>(
          stacked(c.n, probe),
          DataLoaderOptions(c.batch).workers(c.workers).drop_last(c.drop_last));
      EXPECT_EQ(epoch_targets(*ours), epoch_targets(*theirs));
    }
    // torch's RandomSampler draws from torch's global generator; seeded alike, both loaders see
    // the same permutations, two epochs running.
    torch::manual_seed(1234);
    auto theirs = td::make_data_loader(
        stacked(c.n, probe),
        td::DataLoaderOptions(c.batch).workers(c.workers).drop_last(c.drop_last));
    auto expected = epoch_targets(*theirs);
    auto expected2 = epoch_targets(*theirs);
    torch::manual_seed(1234);
    auto ours = make_data_loader(
        stacked(c.n, probe), DataLoaderOptions(c.batch).workers(c.workers).drop_last(c.drop_last));
    EXPECT_EQ(epoch_targets(*ours), expected);
    EXPECT_EQ(epoch_targets(*ours), expected2);
    EXPECT_NE(expected, expected2);  // a new permutation each epoch
  }
}

TEST(TorchDataDelivery, UnorderedDeliversEveryIndexExactlyOnce) {
  auto probe = std::make_shared<Probe>();
  probe->delay = 3ms;
  probe->slow_every = 4;
  auto ours =
      make_data_loader(stacked(97, probe), DataLoaderOptions(5).workers(4).enforce_ordering(false));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(97, 0);
    size_t batches = 0;
    for (const auto& b : epoch_targets(*ours)) {
      ++batches;
      for (int64_t v : b) ++seen[static_cast<size_t>(v)];
    }
    EXPECT_EQ(batches, 20u);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 97);
  }
  const LoaderStats stats = ours->stats();
  EXPECT_EQ(stats.batches, 40u);
  EXPECT_EQ(stats.samples, 2u * 97u);
}

TEST(TorchDataDelivery, EachWorkerHasItsOwnCopyOfTheDatasetLikeTorch) {
  for (bool conveyor_loader : {false, true}) {
    SCOPED_TRACE(conveyor_loader ? "conveyor" : "torch::data");
    auto probe = std::make_shared<Probe>();
    probe->delay = 1ms;
    if (conveyor_loader) {
      auto loader = make_data_loader(stacked(64, probe), DataLoaderOptions(2).workers(4));
      (void)epoch_targets(*loader);
    } else {
      auto loader = td::make_data_loader(stacked(64, probe), td::DataLoaderOptions(2).workers(4));
      (void)epoch_targets(*loader);
    }
    EXPECT_EQ(probe->shared_copy_calls.load(), 0) << "two threads called get() on one copy";
    EXPECT_GE(probe->threads.size(), 2u);  // the work really was spread over workers
    EXPECT_LE(probe->threads.size(), 5u);  // 4 workers (+ Conveyor's read of sample 0)
  }
}

TEST(TorchDataDelivery, BatchedPathMatchesTorchForCustomSharedAndUnstackedDatasets) {
  for (size_t workers : {0, 3}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    {
      auto theirs = td::make_data_loader<td::samplers::SequentialSampler>(
          Squares(23), td::DataLoaderOptions(4).workers(workers));
      auto ours = make_data_loader<td::samplers::SequentialSampler>(
          Squares(23), DataLoaderOptions(4).workers(workers));
      EXPECT_EQ(epoch_vectors(*ours), epoch_vectors(*theirs));
    }
    {
      auto shared = td::datasets::make_shared_dataset<Squares>(11);
      auto theirs = td::make_data_loader<td::samplers::SequentialSampler>(
          shared, td::DataLoaderOptions(3).workers(workers));
      auto ours = make_data_loader<td::samplers::SequentialSampler>(
          shared, DataLoaderOptions(3).workers(workers));
      EXPECT_EQ(epoch_vectors(*ours), epoch_vectors(*theirs));
    }
    {
      auto ours = make_data_loader<td::samplers::SequentialSampler>(
          Numbers(7), DataLoaderOptions(3).workers(workers));
      std::vector<size_t> sizes;
      int64_t next = 0;
      for (std::vector<td::Example<>>& batch : *ours) {
        sizes.push_back(batch.size());
        for (auto& e : batch) EXPECT_EQ(e.target.item<int64_t>(), next++);
      }
      EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 1}));
    }
  }
}

TEST(TorchDataDelivery, StatefulDatasetIsResetEachEpochAndSharedByWorkers) {
  for (size_t workers : {0, 2}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    auto theirs = td::make_data_loader(Countdown(10), td::DataLoaderOptions(3).workers(workers));
    auto ours = make_data_loader(Countdown(10), DataLoaderOptions(3).workers(workers));
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int64_t> mine, torchs;
      for (auto& b : *ours) mine.insert(mine.end(), b.begin(), b.end());
      for (auto& b : *theirs) torchs.insert(torchs.end(), b.begin(), b.end());
      std::sort(mine.begin(), mine.end());
      std::sort(torchs.begin(), torchs.end());
      std::vector<int64_t> expected(10);
      std::iota(expected.begin(), expected.end(), 0);
      EXPECT_EQ(mine, expected);
      EXPECT_EQ(torchs, expected);
    }
  }
}

// torch's ChunkDataset, as its users build it: a ChunkDataReader behind make_shared_dataset.
// Chunk c holds the values 100 * c .. 100 * c + c (chunks of different lengths).
class CountingChunks : public td::datasets::ChunkDataReader<int64_t> {
 public:
  using BatchType = ChunkType;  // what ChunkDataset hands out per batch
  ChunkType read_chunk(size_t chunk_index) override {
    ChunkType chunk;
    for (size_t k = 0; k <= chunk_index; ++k)
      chunk.push_back(static_cast<int64_t>(100 * chunk_index + k));
    return chunk;
  }
  size_t chunk_count() override { return 5; }
  void reset() override {}
};

TEST(TorchDataDelivery, ChunkDatasetDeliversEveryExampleEachEpochLikeTorch) {
  using Chunks = td::datasets::ChunkDataset<CountingChunks, td::samplers::SequentialSampler,
                                            td::samplers::SequentialSampler>;
  auto make = [] {
    return td::datasets::make_shared_dataset<Chunks>(
        CountingChunks(), td::samplers::SequentialSampler(0), td::samplers::SequentialSampler(0),
        td::datasets::ChunkDatasetOptions(/*preloader_count=*/2, /*batch_size=*/4));
  };
  std::vector<int64_t> expected;
  for (int64_t c = 0; c < 5; ++c) {
    for (int64_t k = 0; k <= c; ++k) expected.push_back(100 * c + k);
  }
  for (size_t workers : {0, 2}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    auto theirs = td::make_data_loader(make(), td::DataLoaderOptions(4).workers(workers));
    auto ours = make_data_loader(make(), DataLoaderOptions(4).workers(workers));
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int64_t> mine, torchs;
      for (auto& b : *ours) {
        EXPECT_LE(b.size(), 4u);
        mine.insert(mine.end(), b.begin(), b.end());
      }
      for (auto& b : *theirs) torchs.insert(torchs.end(), b.begin(), b.end());
      std::sort(mine.begin(), mine.end());
      std::sort(torchs.begin(), torchs.end());
      EXPECT_EQ(mine, expected);
      EXPECT_EQ(torchs, expected);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Exceptions and the timeout

template <typename Loader>
void expect_original_kept(Loader& loader, size_t workers, const char* who) {
  SCOPED_TRACE(who);
  try {
    for (auto& b : loader) (void)b;
    ADD_FAILURE() << "no exception";
  } catch (const td::WorkerException& e) {
    EXPECT_GT(workers, 0u) << "without workers torch::data lets the original through";
    EXPECT_EQ(
        std::string(e.what()).rfind(
            "Caught exception in DataLoader worker thread. Original message: bad sample 5", 0),
        0u)
        << e.what();
    try {
      std::rethrow_exception(e.original_exception);
    } catch (const BadSample& original) {
      EXPECT_EQ(original.index, 5u);
    }
  } catch (const BadSample& original) {
    EXPECT_EQ(workers, 0u) << "with workers torch::data wraps the original";
    EXPECT_EQ(original.index, 5u);
  }
}

TEST(TorchDataErrors, WorkerExceptionsKeepTheOriginalLikeTorch) {
  for (size_t workers : {0, 2}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    auto probe = std::make_shared<Probe>();
    probe->fail_at = {5};
    auto theirs = td::make_data_loader<td::samplers::SequentialSampler>(
        stacked(12, probe), td::DataLoaderOptions(2).workers(workers));
    auto ours = make_data_loader<td::samplers::SequentialSampler>(
        stacked(12, probe), DataLoaderOptions(2).workers(workers));
    Squares failing(12);
    failing.fail_at_ = 5;
    auto batched = make_data_loader<td::samplers::SequentialSampler>(
        failing, DataLoaderOptions(2).workers(workers));
    expect_original_kept(*theirs, workers, "torch::data");
    expect_original_kept(*ours, workers, "conveyor collated");
    expect_original_kept(*batched, workers, "conveyor batched");
  }
}

// The collated path adds which sample failed. The whole message, word for word: torch's text,
// then Conveyor's context with its "conveyor: " prefix once (it used to read
// "(conveyor: conveyor: sample 5 ...").
TEST(TorchDataErrors, WorkerErrorMessageIsExact) {
  auto probe = std::make_shared<Probe>();
  probe->fail_at = {5};
  auto ours = make_data_loader<td::samplers::SequentialSampler>(stacked(12, probe),
                                                                DataLoaderOptions(2).workers(2));
  try {
    for (auto& b : *ours) (void)b;
    ADD_FAILURE() << "no exception";
  } catch (const WorkerError& e) {
    EXPECT_EQ(e.index(), 5u);
    EXPECT_EQ(std::string(e.what()),
              "Caught exception in DataLoader worker thread. Original message: bad sample 5 "
              "(conveyor: sample 5 (index 5 of the torch dataset) failed in batch 2 of epoch 0: "
              "bad sample 5)");
  }
}

TEST(TorchDataErrors, FailingFirstSampleIsReportedOnIterationNotConstruction) {
  auto probe = std::make_shared<Probe>();
  probe->fail_at = {0};
  auto ours = make_data_loader(stacked(4, probe), DataLoaderOptions(2).workers(2));
  auto it = ours->begin();
  EXPECT_THROW(*it, td::WorkerException);
}

TEST(TorchDataErrors, TimeoutThrowsLikeTorch) {
  for (bool conveyor_loader : {false, true}) {
    SCOPED_TRACE(conveyor_loader ? "conveyor" : "torch::data");
    auto probe = std::make_shared<Probe>();
    probe->delay = 400ms;
    std::string message;
    const auto t0 = std::chrono::steady_clock::now();
    if (conveyor_loader) {
      auto loader = make_data_loader<td::samplers::SequentialSampler>(
          stacked(2, probe), DataLoaderOptions(1).workers(1).timeout(50ms));
      auto it = loader->begin();  // Conveyor's first read of sample 0 is not under the timeout
      message = message_of([&] { *it; });
    } else {
      auto loader = td::make_data_loader<td::samplers::SequentialSampler>(
          stacked(2, probe), td::DataLoaderOptions(1).workers(1).timeout(50ms));
      auto it = loader->begin();
      message = message_of([&] { *it; });
    }
    EXPECT_NE(message.find("Timeout in DataLoader queue while waiting for next batch (timeout was "
                           "50 ms)"),
              std::string::npos)
        << message;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  }
}

TEST(TorchDataErrors, SkipPolicySubstitutesAndRecordsTheSample) {
  auto probe = std::make_shared<Probe>();
  probe->fail_at = {3};
  auto ours = make_data_loader<td::samplers::SequentialSampler>(
      stacked(10, probe), DataLoaderOptions(4).workers(2).on_error(ErrorPolicy::kSkip));
  size_t rows = 0;
  for (const auto& b : epoch_targets(*ours)) {
    rows += b.size();
    EXPECT_EQ(std::count(b.begin(), b.end(), 3), 0);
  }
  EXPECT_EQ(rows, 10u);
  const LoaderStats stats = ours->stats();
  EXPECT_EQ(stats.skipped, 1u);
  ASSERT_EQ(stats.skipped_samples.size(), 1u);
  EXPECT_EQ(stats.skipped_samples[0].index, 3u);
  EXPECT_EQ(stats.skipped_samples[0].path, "index 3 of the torch dataset");
  EXPECT_NE(stats.skipped_samples[0].message.find("bad sample 3"), std::string::npos);
}

TEST(TorchDataErrors, SampleOfAnotherShapeNamesTheSample) {
  auto probe = std::make_shared<Probe>();
  probe->odd_shape_at = {6};
  auto ours = make_data_loader<td::samplers::SequentialSampler>(stacked(8, probe),
                                                                DataLoaderOptions(4).workers(2));
  const std::string message = message_of([&] { (void)epoch_targets(*ours); });
  EXPECT_NE(message.find("sample 6 has data"), std::string::npos) << message;
  EXPECT_NE(message.find("same shape and dtype"), std::string::npos) << message;
}

TEST(TorchDataLifecycle, DestroyingMidEpochAndJoinReturnPromptly) {
  testing::finishes_within(20s, "destroy mid-epoch", [] {
    auto probe = std::make_shared<Probe>();
    probe->delay = 5ms;
    auto ours = make_data_loader(stacked(400, probe), DataLoaderOptions(4).workers(3));
    auto it = ours->begin();
    (void)*it;
    ours->join();
    EXPECT_THROW(ours->begin(), std::logic_error);
  });
}

// ---------------------------------------------------------------------------------------------
// Conveyor's image pipeline through the same entry point

TEST(TorchDataImages, ImageFolderThroughMakeDataLoader) {
  testing::TempDir dir;
  testing::make_small_folder(dir.path(), {"cat", "dog"}, 5);
  auto loader = make_data_loader(ImageSource::image_folder(dir.path(), ImageTransform::train(32)),
                                 DataLoaderOptions(4).workers(2).seed(3));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(10, 0);
    size_t batches = 0;
    for (Batch& b : *loader) {
      ++batches;
      EXPECT_EQ(b.images().scalar_type(), at::kByte);
      EXPECT_EQ(b.images().sizes(), (at::IntArrayRef{static_cast<int64_t>(b.size()), 3, 32, 32}));
      std::vector<int64_t> labels = to_vector(b.labels());
      for (size_t r = 0; r < b.size(); ++r) {
        ++seen[b.indices[r]];
        EXPECT_EQ(labels[r], b.indices[r] < 5 ? 0 : 1);
      }
    }
    EXPECT_EQ(batches, 3u);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 10);
  }
  EXPECT_EQ(loader->mode().rfind("collated", 0), 0u);
}

// ---------------------------------------------------------------------------------------------
// GPU

TEST(TorchDataGpu, CollatedBatchesArriveOnTheDeviceFromPinnedSlots) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device is usable on this machine";
  auto ours = make_data_loader<td::samplers::SequentialSampler>(
      stacked(21), DataLoaderOptions(4).workers(2).pin_memory(true).device(torch::kCUDA));
  std::vector<std::vector<int64_t>> expected;
  for (size_t b = 0; b < 21; b += 4) {
    std::vector<int64_t> v;
    for (size_t i = b; i < std::min<size_t>(21, b + 4); ++i) v.push_back(static_cast<int64_t>(i));
    expected.push_back(v);
  }
  for (auto& batch : *ours) {
    EXPECT_TRUE(batch.data.is_cuda());
    EXPECT_TRUE(batch.target.is_cuda());
  }
  EXPECT_EQ(epoch_targets(*ours), expected);  // values checked on the host copy of each batch
  EXPECT_NE(ours->mode().find("pinned host ring"), std::string::npos) << ours->mode();
  EXPECT_NE(ours->mode().find("side-stream copies"), std::string::npos) << ours->mode();
}

TEST(TorchDataGpu, BatchedPathPinsAndMovesToTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device is usable on this machine";
  auto ours = make_data_loader<td::samplers::SequentialSampler>(
      Numbers(9), DataLoaderOptions(4).workers(2).pin_memory(true).device(torch::kCUDA));
  int64_t next = 0;
  for (auto& batch : *ours) {
    for (auto& e : batch) {
      EXPECT_TRUE(e.data.is_cuda());
      EXPECT_EQ(e.target.item<int64_t>(), next++);
    }
  }
  EXPECT_EQ(next, 9);
}

}  // namespace
}  // namespace conveyor
