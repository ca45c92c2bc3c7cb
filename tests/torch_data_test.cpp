// The drop-in's promises: options, the path each dataset takes, and iterators behave as
// torch::data's do. Where a behaviour is torch's, the same test runs torch's own loader next to
// Conveyor's, so any difference shows; where Conveyor deliberately differs (a new epoch after a
// break), the test shows both. Delivery: torch_data_delivery_test.cpp; errors, the timeout and
// the GPU: torch_data_errors_test.cpp.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <numeric>

#include "test_support.h"
#include "torch_data_test_support.h"

namespace conveyor {
namespace {

using namespace torch_data_test;

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
    // max_jobs: torch's when given; unset, the collated path's default number of batch slots
    // (workers + prefetch_factor + 2, one worker at least), which is what it uses (issue 22).
    EXPECT_EQ(ours->options().max_jobs,
              max_jobs ? theirs->options().max_jobs : std::max<size_t>(1, workers) + 2 + 2);
    EXPECT_EQ(ours->options().timeout, theirs->options().timeout);
    EXPECT_EQ(ours->options().enforce_ordering, theirs->options().enforce_ordering);
    EXPECT_EQ(ours->options().drop_last, theirs->options().drop_last);
  }
}

// options().max_jobs is the number of batch slots the engine really has (issue 22: it said
// 2 * workers on the collated path), on the collated path and for SampleSources.
TEST(TorchDataOptions, MaxJobsIsTheBatchSlotsInUse) {
  const auto slots_in_use = [](const LoaderStats& stats) {
    return std::accumulate(stats.slot_states.begin(), stats.slot_states.end(), size_t{0});
  };
  for (const auto& [workers, max_jobs] :
       std::vector<std::pair<size_t, std::optional<size_t>>>{{0, {}}, {3, {}}, {2, 7}, {2, 1}}) {
    SCOPED_TRACE("workers=" + std::to_string(workers));
    const DataLoaderOptions options = DataLoaderOptions(4).workers(workers).max_jobs(max_jobs);
    auto collated = make_data_loader(stacked(10), options);
    auto source = make_data_loader(std::make_shared<testing::IndexSource>(10), options);
    for (Batch& b : *source) (void)b;
    for (auto& b : *collated) (void)b;
    EXPECT_EQ(collated->options().max_jobs, slots_in_use(collated->stats()));
    EXPECT_EQ(source->options().max_jobs, slots_in_use(source->stats()));
    if (max_jobs && *max_jobs >= 2) {
      EXPECT_EQ(collated->options().max_jobs, *max_jobs);
    }
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

}  // namespace
}  // namespace conveyor
