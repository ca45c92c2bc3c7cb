// pipe:COMMAND shards (issue 20): the command's standard output is the shard, as in WebDataset
// ("pipe:aws s3 cp s3://bucket/train-000003.tar -"). `pipe:cat FILE` streams every sample once
// per epoch as the file itself does, under 1 and 2 ranks, with the index found by the same
// command. A command that fails after half its shard, or never writes, is run again `retries`
// times, then its shard fails through on_error naming the command, its exit status and its
// stderr (kRaise), or its lost samples are skipped (kSkip). A loader and source destroyed while a
// command is in the middle of its shard leave no process behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/loader.h"
#include "shards_test_support.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::finishes_within;
using namespace testing::shards;

ShardOptions quick_pipes() {
  ShardOptions o = streamed();
  o.retries = 2;
  o.backoff_initial = 10ms;
  o.backoff_max = 50ms;
  o.request_timeout = 3000ms;
  return o;
}

// The lines of a file (a command's run counter).
size_t lines_in(const fs::path& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// "pipe:cat SHARD" for each shard, with `replaced` (shard index -> command) instead where given.
std::vector<std::string> cat_each(const std::vector<std::string>& shards,
                                  const std::map<size_t, std::string>& replaced = {}) {
  std::vector<std::string> out;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto found = replaced.find(i);
    out.push_back("pipe:" + (found != replaced.end() ? found->second : "cat " + shards[i]));
  }
  return out;
}

TEST(PipeShards, CatStreamsEverySampleOnceAsTheFileDoes) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto local = p.shard_paths();
  const auto everything = folder_samples(p.folder);
  // One pattern, brace-expanded inside the command as WebDataset does; the index comes from
  // `cat train.index.json`, the same command for the index.
  const std::string pattern =
      "pipe:cat " + shard_pattern(p.prefix.parent_path().string() + "/", local.size());
  auto piped = shards_source({pattern}, quick_pipes());
  ASSERT_EQ(piped->size(), 21u) << "the count comes from the index the command wrote";
  EXPECT_EQ(piped->classes(), kClasses);
  for (uint64_t epoch : {0, 1}) {
    const auto got = samples_of(read_stream(piped, epoch));
    EXPECT_EQ(as_set(got), everything) << "epoch " << epoch;
    EXPECT_EQ(got, samples_of(read_stream(shards_source(local, quick_pipes()), epoch)))
        << "epoch " << epoch << ": the file's order";
    std::multiset<Sample> both;
    std::vector<size_t> sizes;
    for (size_t rank : {0, 1}) {
      ShardOptions o = quick_pipes();
      o.rank = rank;
      o.world_size = 2;
      const auto mine = samples_of(read_stream(shards_source({pattern}, o), epoch));
      EXPECT_EQ(mine, samples_of(read_stream(shards_source(local, o), epoch))) << "rank " << rank;
      sizes.push_back(mine.size());
      both.insert(mine.begin(), mine.end());
    }
    EXPECT_EQ(sizes[0], sizes[1]);
    EXPECT_EQ(std::set<Sample>(both.begin(), both.end()).size(), both.size());
  }
  piped.reset();  // its reader reaps the last command once it has emitted the last position
  EXPECT_TRUE(child_processes().empty()) << "every command was reaped";

  // Without an index the count cannot be known: the error says so, and why the command for the
  // index gave none.
  fs::remove(p.prefix.string() + ".index.json");
  try {
    ImageSource::tar_shards({pattern}, fixed(), quick_pipes());
    ADD_FAILURE() << "no exception without an index or epoch_samples";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("epoch_samples"), std::string::npos) << what;
    EXPECT_NE(what.find("pipe:cat " + p.prefix.string() + ".index.json"), std::string::npos)
        << what;
    EXPECT_NE(what.find("exited with status 1"), std::string::npos) << what;
  }
  ShardOptions counted = quick_pipes();
  counted.epoch_samples = 21;
  EXPECT_EQ(as_set(samples_of(read_stream(shards_source({pattern}, counted), 1))), everything);
}

// Shard k's command writes its first two samples (up to the third one's data) and exits 3 with a
// line on stderr. Each of the 3 attempts reads the same bytes again; then the shard fails. Under
// kRaise the error names the command, its status and its stderr; under kSkip its two first
// samples and every other shard's arrive once, and its lost samples are skipped.
TEST(PipeShards, ACommandThatFailsAfterHalfItsShardIsRetriedThenFailsOrIsSkipped) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto local = p.shard_paths();
  const auto members = indexed_members(p.prefix.string() + ".index.json");
  size_t k = local.size();
  std::vector<size_t> in_k;
  for (size_t s = 0; s < local.size() && k == local.size(); ++s) {
    in_k.clear();
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].shard == fs::path(local[s]).filename().string()) in_k.push_back(i);
    }
    if (in_k.size() >= 3) k = s;
  }
  ASSERT_LT(k, local.size()) << "a shard of 3 samples or more";
  const uint64_t cut = members[in_k[2]].offset;  // the third sample's header is whole
  const fs::path runs = p.dir / "runs";
  const std::string failing = "echo run >> " + runs.string() + "; head -c " + std::to_string(cut) +
                              " " + local[k] + "; echo 'cut short on purpose' >&2; exit 3";
  ShardOptions o = quick_pipes();
  o.index = p.prefix.string() + ".index.json";  // the command's name is its last .tar word
  o.shuffle_buffer = 1;

  // The samples that must arrive: all but shard k's third and later ones, by their pixels.
  const auto all = samples_of(read_stream(shards_source(local, o), 0, 1));
  std::set<Sample> expected;
  {
    ShardOptions one = o;
    one.index.clear();
    one.epoch_samples = 2;
    const auto first_two = samples_of(read_stream(shards_source({local[k]}, one), 0, 1));
    ASSERT_EQ(first_two.size(), 2u);
    ShardOptions rest = one;
    rest.epoch_samples = 0;
    const auto whole_k = as_set(samples_of(read_stream(shards_source({local[k]}, rest), 0, 1)));
    for (const Sample& s : all) {
      if (whole_k.count(s) == 0) expected.insert(s);
    }
    expected.insert(first_two.begin(), first_two.end());
  }
  const size_t lost = in_k.size() - 2;

  auto source = shards_source(cat_each(local, {{k, failing}}), o);
  ASSERT_EQ(source->size(), 21u);
  LoaderOptions options = small_batches(2);
  options.on_error = ErrorPolicy::kSkip;
  finishes_within(60s, "a failing command, skipped", [&] {
    DataLoader loader(source, options);
    std::multiset<Sample> seen;
    for (Batch& batch : loader) {
      Epoch one;
      keep(one, batch);
      for (auto& s : samples_of(one)) seen.insert(s);
    }
    // A skipped position holds a substitute (another sample): the distinct samples and the
    // skips fill the epoch, so every readable sample arrived once.
    EXPECT_EQ(std::set<Sample>(seen.begin(), seen.end()), expected);
    EXPECT_EQ(loader.stats().skipped, lost);
    EXPECT_EQ(seen.size(), 21u);
    ASSERT_FALSE(loader.stats().skipped_samples.empty());
    const std::string message = loader.stats().skipped_samples.front().message;
    EXPECT_NE(message.find("pipe:echo run"), std::string::npos) << message;
    EXPECT_NE(message.find("1 of " + std::to_string(local.size()) + " shards failed"),
              std::string::npos)
        << message;
  });
  EXPECT_EQ(lines_in(runs), 3u) << "1 run and 2 retries";

  options.on_error = ErrorPolicy::kRaise;
  finishes_within(60s, "a failing command, raised", [&] {
    DataLoader loader(source, options);
    try {
      for (Batch& batch : loader) (void)batch;
      ADD_FAILURE() << "no error from a failing command";
    } catch (const SampleError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("pipe:" + failing), std::string::npos) << "names the command: " << what;
      EXPECT_NE(what.find("exited with status 3"), std::string::npos) << what;
      EXPECT_NE(what.find("cut short on purpose"), std::string::npos) << "its stderr: " << what;
      EXPECT_NE(what.find("after 3 attempts"), std::string::npos) << what;
    }
  });
  EXPECT_EQ(lines_in(runs), 6u);
  source.reset();
  EXPECT_TRUE(child_processes().empty());
}

// A command that never writes meets request_timeout on each attempt, is killed with its process
// group (its `sleep` too), and its shard's samples are skipped, naming it.
TEST(PipeShards, ACommandThatNeverWritesMeetsTheDeadline) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto local = p.shard_paths();
  const auto members = indexed_members(p.prefix.string() + ".index.json");
  size_t in_first = 0;
  for (const auto& m : members) in_first += m.shard == fs::path(local[0]).filename().string();
  const fs::path runs = p.dir / "runs";
  const fs::path sleeps = p.dir / "sleeps";
  const std::string silent = "echo run >> " + runs.string() + "; sleep 30 & echo $! >> " +
                             sleeps.string() + "; wait; cat " + local[0];
  ShardOptions o = quick_pipes();
  o.index = p.prefix.string() + ".index.json";
  o.retries = 1;
  o.request_timeout = 300ms;
  auto source = shards_source(cat_each(local, {{0, silent}}), o);
  LoaderOptions options = small_batches(2);
  options.on_error = ErrorPolicy::kSkip;
  const auto t0 = std::chrono::steady_clock::now();
  finishes_within(30s, "a silent command", [&] {
    DataLoader loader(source, options);
    std::set<Sample> seen;
    for (Batch& batch : loader) {
      Epoch one;
      keep(one, batch);
      for (auto& s : samples_of(one)) seen.insert(s);
    }
    EXPECT_EQ(seen.size(), 21u - in_first) << "every other shard's samples";
    EXPECT_EQ(loader.stats().skipped, in_first);
    ASSERT_FALSE(loader.stats().skipped_samples.empty());
    const std::string message = loader.stats().skipped_samples.front().message;
    EXPECT_NE(message.find("pipe:" + silent), std::string::npos) << message;
    EXPECT_NE(message.find("wrote nothing for 0.3 s"), std::string::npos) << message;
    EXPECT_NE(message.find("after 2 attempts"), std::string::npos) << message;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s) << "not the sleep's 30 s";
  EXPECT_EQ(lines_in(runs), 2u);
  source.reset();
  EXPECT_TRUE(child_processes().empty()) << "the commands were killed and reaped";
  std::ifstream in(sleeps);
  size_t count = 0;
  for (int pid; in >> pid; ++count) EXPECT_TRUE(process_ends_within(pid, 2s)) << "sleep " << pid;
  EXPECT_EQ(count, 2u) << "a sleep per attempt, each killed with its group";
}

// One shard of 21 samples; its command writes the first 15 and sleeps, beside a background
// `sleep` of the same process group. While the loader holds a batch, the reader waits on the
// loader (its lookahead), not on the command, and both processes are alive. Destroying the
// loader and the source kills the group and reaps the shell: no child is left, and the recorded
// processes are gone.
TEST(PipeShards, ALoaderDestroyedMidShardLeavesNoProcess) {
  Prepared p("--shard-size 1M");
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto local = p.shard_paths();
  ASSERT_EQ(local.size(), 1u);
  const auto members = indexed_members(p.prefix.string() + ".index.json");
  ASSERT_EQ(members.size(), 21u);
  const fs::path pids = p.dir / "pids";
  const std::string command = "echo $$ >> " + pids.string() +
                              "; (sleep 60; :) >/dev/null 2>&1 & echo $! >> " + pids.string() +
                              "; head -c " + std::to_string(members[15].offset) + " " + local[0] +
                              "; sleep 60";
  ShardOptions o = quick_pipes();
  o.index = p.prefix.string() + ".index.json";
  o.shuffle_buffer = 1;
  o.stream_lookahead = 1;
  o.stream_window = 16;
  std::vector<int> recorded;
  finishes_within(20s, "a loader destroyed mid-shard", [&] {
    {
      auto source = shards_source({"pipe:" + command}, o);
      LoaderOptions options = small_batches(1);
      options.batch_size = 2;
      options.slots = 2;
      DataLoader loader(source, options);
      auto it = loader.begin();
      ASSERT_EQ(it->size(), 2u);
      std::this_thread::sleep_for(200ms);  // the reader is blocked on the lookahead now
      std::ifstream in(pids);
      for (int pid; in >> pid;) recorded.push_back(pid);
      ASSERT_EQ(recorded.size(), 2u) << "the shell and its background sleep";
      EXPECT_FALSE(child_processes().empty()) << "the command runs while the loader reads it";
      for (int pid : recorded) EXPECT_FALSE(process_ended(pid)) << pid << " alive mid-shard";
    }  // the loader, then the source
    EXPECT_TRUE(child_processes().empty()) << "no child left";
    for (int pid : recorded) EXPECT_TRUE(process_ends_within(pid, 2s)) << pid << " was killed";
  });
}

}  // namespace
}  // namespace conveyor
