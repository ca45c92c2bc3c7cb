// Tar shards in streaming mode (issue 13): whole shards read in order through libarchive, locally
// or over HTTP from a real nginx, through a shuffle buffer. Each epoch gives every sample of the
// ImageFolder exactly once, in an order that is a pure function of (seed, epoch) whatever the
// workers; ranks split the shards with equal batches; resume is bit-exact; a truncated shard and
// a corrupt member go through the error policy; memory stays flat over a dataset 20 times the
// shuffle buffer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <torch/serialize.h>

#include "conveyor/loader.h"
#include "nginx_server.h"
#include "shards_test_support.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::finishes_within;
using testing::make_small_folder;
using testing::NginxServer;
using testing::TempDir;
using namespace testing::shards;

TEST(ShardStream, EachEpochGivesEverySampleOfTheFolderOnce) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  auto folder = std::shared_ptr<ImageSource>(ImageSource::image_folder(p.folder, fixed()));
  const auto everything = as_set(samples_of(read_stream(folder)));
  ASSERT_EQ(everything.size(), 21u);

  auto with_index = shards_source(p.shard_paths(), streamed());
  ASSERT_EQ(with_index->size(), 21u);
  std::vector<std::vector<Sample>> orders;
  for (uint64_t epoch : {0, 1}) {
    const auto got = samples_of(read_stream(with_index, epoch));
    EXPECT_EQ(as_set(got), everything) << "epoch " << epoch;
    orders.push_back(got);
  }
  EXPECT_NE(orders[0], orders[1]) << "each epoch has its own order";

  // Without the index the shards are streamed anyway, counted by a pass over their headers.
  fs::remove(p.prefix.string() + ".index.json");
  ShardOptions automatic = streamed();
  automatic.streaming = false;
  auto without_index = shards_source(p.shard_paths(), automatic);
  ASSERT_EQ(without_index->size(), 21u);
  EXPECT_NE(without_index->describe(0).find("stream position 0"), std::string::npos)
      << "nothing read yet: " << without_index->describe(0);
  EXPECT_EQ(samples_of(read_stream(without_index, 1)), orders[1])
      << "the order depends on the shards' contents, not on the index";
  EXPECT_NE(without_index->describe(0).find(".tar (member "), std::string::npos)
      << "once read, a position names its shard and member: " << without_index->describe(0);
}

TEST(ShardStream, TheOrderIsAPureFunctionOfSeedAndEpoch) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  auto source = shards_source(p.shard_paths(), streamed());
  const auto one_worker = samples_of(read_stream(source, 3, 1));
  EXPECT_EQ(samples_of(read_stream(source, 3, 3)), one_worker) << "3 workers, same order";
  EXPECT_EQ(samples_of(read_stream(shards_source(p.shard_paths(), streamed()), 3, 2)), one_worker)
      << "a new source, same order";
  EXPECT_NE(samples_of(read_stream(source, 3, 2, /*seed=*/8)), one_worker) << "another seed";
  // A buffer of 1 keeps the shards' own order within each shard.
  auto unshuffled = shards_source(p.shard_paths(), streamed(1));
  const auto plain = samples_of(read_stream(unshuffled, 0));
  EXPECT_EQ(as_set(plain), as_set(one_worker));
}

TEST(ShardStream, RanksSplitTheShardsAndYieldEqualBatches) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto shards = p.shard_paths();
  auto folder = std::shared_ptr<ImageSource>(ImageSource::image_folder(p.folder, fixed()));
  const auto everything = as_set(samples_of(read_stream(folder)));
  for (uint64_t epoch : {0, 1}) {
    std::vector<std::vector<Sample>> per_rank;
    for (size_t rank : {0, 1}) {
      ShardOptions o = streamed();
      o.rank = rank;
      o.world_size = 2;
      per_rank.push_back(samples_of(read_stream(shards_source(shards, o), epoch)));
    }
    EXPECT_EQ(per_rank[0].size(), per_rank[1].size()) << "equal batches on every rank";
    EXPECT_GE(per_rank[0].size(), 5u);
    std::multiset<Sample> both(per_rank[0].begin(), per_rank[0].end());
    both.insert(per_rank[1].begin(), per_rank[1].end());
    EXPECT_EQ(std::set<Sample>(both.begin(), both.end()).size(), both.size())
        << "no sample on both ranks";
    for (const Sample& s : both) EXPECT_EQ(everything.count(s), 1u);
  }
  ShardOptions bad = streamed();
  bad.rank = 2;
  bad.world_size = 2;
  EXPECT_THROW(ImageSource::tar_shards(shards, fixed(), bad), std::invalid_argument);
}

TEST(ShardStream, ResumeMidEpochIsBitExact) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  auto make = [&] {  // random crops: positions must match exactly
    return std::shared_ptr<ImageSource>(
        ImageSource::tar_shards(p.shard_paths(), small_train(), streamed()));
  };
  const Epoch whole = read_stream(make(), 1);
  expect_resumes_exactly([&] { return std::make_unique<DataLoader>(make(), small_batches()); },
                         whole, 1);
}

TEST(ShardStream, OverHttpAsFromDisk) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto shards = p.shard_paths();
  NginxServer server(p.prefix.parent_path(), p.dir / "nginx");
  char last[16];
  std::snprintf(last, sizeof last, "%06zu", shards.size() - 1);
  const std::string pattern = server.url("train-{000000.." + std::string(last) + "}.tar");
  const auto local = samples_of(read_stream(shards_source(shards, streamed()), 2));
  EXPECT_EQ(samples_of(read_stream(shards_source({pattern}, streamed()), 2)), local);

  // Without an index over HTTP the sample count cannot be known: it must be given.
  fs::remove(p.prefix.string() + ".index.json");
  try {
    ImageSource::tar_shards({pattern}, fixed(), streamed());
    ADD_FAILURE() << "no exception without an index or epoch_samples";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("epoch_samples"), std::string::npos) << e.what();
  }
  ShardOptions counted = streamed();
  counted.epoch_samples = 21;
  EXPECT_EQ(samples_of(read_stream(shards_source({pattern}, counted), 2)), local);

  // The server dies: the stream ends early, and the samples it could not read fail naming the
  // URL, through the error policy.
  ShardOptions quick = counted;
  quick.retries = 1;
  quick.backoff_initial = 10ms;
  quick.request_timeout = 1000ms;
  auto doomed = shards_source({pattern}, quick);
  server.stop();
  finishes_within(30s, "dead server, streaming", [&] {
    LoaderOptions options;
    options.batch_size = 5;
    options.workers = 2;
    DataLoader loader(doomed, options);
    try {
      for (Batch& batch : loader) (void)batch;
      ADD_FAILURE() << "no error with the server gone";
    } catch (const SampleError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(server.url("train-0000")), std::string::npos) << what;
      EXPECT_NE(what.find("ended after 0 of 21"), std::string::npos) << what;
    }
  });
}

// A shard cut inside its second member loses that member's sample and those after it; another's
// first member is junk. With the index's count the stream then ends early: under kSkip the
// missing positions and the corrupt sample are skipped and counted, and every other sample
// arrives once; under kRaise the error names the truncated shard.
TEST(ShardStream, ATruncatedShardAndACorruptMemberGoThroughTheErrorPolicy) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto shards = p.shard_paths();
  const auto members = indexed_members(p.prefix.string() + ".index.json");
  const std::string cut_name = fs::path(shards[1]).filename().string();
  std::vector<size_t> in_cut;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].shard == cut_name) in_cut.push_back(i);
  }
  ASSERT_GE(in_cut.size(), 2u);
  fs::resize_file(shards[1], members[in_cut[1]].offset + members[in_cut[1]].size / 2);
  const size_t lost = in_cut.size() - 1;
  const std::string corrupt_name = fs::path(shards[2]).filename().string();
  for (const auto& m : members) {
    if (m.shard != corrupt_name) continue;
    std::fstream f(shards[2], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(m.offset));
    const std::string junk(64, 'x');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    break;
  }
  auto folder = std::shared_ptr<ImageSource>(ImageSource::image_folder(p.folder, fixed()));
  const auto everything = as_set(samples_of(read_stream(folder)));

  auto source = shards_source(shards, streamed());
  ASSERT_EQ(source->size(), 21u) << "the count comes from the index";
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  options.on_error = ErrorPolicy::kSkip;
  {
    DataLoader loader(source, options);
    std::set<Sample> seen;
    for (Batch& batch : loader) {
      Epoch one;
      keep(one, batch);
      for (auto& s : samples_of(one)) seen.insert(s);
    }
    EXPECT_EQ(seen.size(), 21u - lost - 1) << "every readable sample arrives";
    for (const Sample& s : seen) EXPECT_EQ(everything.count(s), 1u);
    EXPECT_EQ(loader.stats().skipped, lost + 1);
  }
  options.on_error = ErrorPolicy::kRaise;
  DataLoader loader(source, options);
  bool named = false;
  try {
    for (Batch& batch : loader) (void)batch;
    ADD_FAILURE() << "no error";
  } catch (const SampleError& e) {
    named = std::string(e.what()).find(shards[1]) != std::string::npos ||
            std::string(e.what()).find(shards[2]) != std::string::npos;
    EXPECT_TRUE(named) << e.what();
  }
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// 320 photo-like JPEGs (about 35 MB) streamed through a shuffle buffer of 16 with a window of 32
// (20 times the buffer): resident memory after the fourth epoch is within a few MB of that after
// the first, and never grows by more than the stream's bound plus slack within an epoch.
TEST(ShardStream, ResidentMemoryStaysFlatOverTwentyBuffers) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a sanitizer's shadow memory and delayed frees make RSS meaningless here; the "
                  "plain build runs this test";
#endif
  TempDir dir;
  make_small_folder(dir / "folder", {"a", "b", "c", "d"}, 80, 500, 375);
  const auto result = prepare((dir / "folder").string() + " " + (dir / "shards" / "big").string() +
                                  " --format wds --shard-size 4M --workers 2",
                              dir);
  ASSERT_EQ(result.status, 0) << result.err;
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(dir / "shards")) {
    if (entry.path().extension() == ".tar") shards.push_back(entry.path().string());
  }
  std::sort(shards.begin(), shards.end());
  uint64_t bytes = 0;
  for (const auto& s : shards) bytes += fs::file_size(s);
  ShardOptions o = streamed(16);
  o.stream_window = 32;
  o.stream_lookahead = 16;
  auto source = shards_source(shards, o);
  ASSERT_EQ(source->size(), 320u);
  ASSERT_GE(source->size(), 20 * o.shuffle_buffer);
  LoaderOptions options;
  options.batch_size = 8;
  options.workers = 2;
  options.slots = 3;  // 24 samples in flight at most: within the window
  DataLoader loader(source, options);
  const size_t baseline = resident_bytes();
  size_t after_first = 0;
  size_t peak = 0;
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    size_t samples = 0;
    for (Batch& batch : loader) {
      samples += batch.size();
      peak = std::max(peak, resident_bytes());
    }
    EXPECT_EQ(samples, 320u);
    if (epoch == 0) after_first = resident_bytes();
  }
  const size_t after_last = resident_bytes();
  const double mb = 1024.0 * 1024.0;
  EXPECT_LT(after_last, after_first + 8 * 1024 * 1024)
      << "RSS after epoch 1: " << after_first / mb << " MB, after epoch 4: " << after_last / mb
      << " MB, while each epoch streams " << bytes / mb << " MB";
  EXPECT_LT(peak, baseline + bytes / 2)
      << "peak " << peak / mb << " MB from " << baseline / mb
      << " MB before the first epoch: the stream must not hold the epoch";
}

}  // namespace
}  // namespace conveyor
