// Tar shards over HTTP (issue 13): conveyor-prepare's shards served by a real nginx on loopback,
// read at random through HTTP Range requests. The same samples with the same labels and pixels
// arrive as from the ImageFolder, under random, distributed and resumed loading; a server that
// goes away and comes back costs retries, not the run; a dead one, a truncated shard and a
// corrupt member go through the per-sample error policy naming the URL; a server that never
// answers meets the request deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
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
using testing::NginxServer;
using testing::TempDir;
using namespace testing::shards;

// Shards prepared from the small folder, served over HTTP.
struct Served {
  Prepared prepared;
  std::unique_ptr<NginxServer> server;
  std::vector<std::string> local;  // the shard paths
  std::string pattern;             // the shards' URLs in brace notation

  Served() {
    if (prepared.result.status != 0) throw std::runtime_error(prepared.result.err);
    local = prepared.shard_paths();
    server = std::make_unique<NginxServer>(prepared.prefix.parent_path(), prepared.dir / "nginx");
    char last[16];
    std::snprintf(last, sizeof last, "%06zu", local.size() - 1);
    pattern = server->url("train-{000000.." + std::string(last) + "}.tar");
  }
  std::string url_of(const std::string& local_path) const {
    return server->url(fs::path(local_path).filename().string());
  }
};

// Short retries and deadlines, so that the fault tests stay fast.
ShardOptions quick_retries() {
  ShardOptions o;
  o.retries = 3;
  o.backoff_initial = 20ms;
  o.backoff_max = 100ms;
  o.request_timeout = 2000ms;
  o.connect_timeout = 500ms;
  return o;
}

TEST(HttpShards, RandomAccessGivesWhatTheFolderGives) {
  Served s;
  auto folder =
      std::shared_ptr<ImageSource>(ImageSource::image_folder(s.prepared.folder, small_train()));
  auto http = std::shared_ptr<ImageSource>(ImageSource::tar_shards({s.pattern}, small_train()));
  ASSERT_EQ(http->size(), folder->size());
  EXPECT_EQ(http->classes(), folder->classes());
  EXPECT_NE(http->describe(0).find(s.server->url("train-000000.tar (member ")), std::string::npos)
      << http->describe(0);
  for (uint64_t epoch : {0, 1}) {
    const Epoch over_http = read_epoch(http, RandomSampler::make(3), epoch);
    expect_same(read_epoch(folder, RandomSampler::make(3), epoch), over_http);
    std::vector<size_t> seen;
    for (const auto& batch : over_http.indices) seen.insert(seen.end(), batch.begin(), batch.end());
    std::sort(seen.begin(), seen.end());
    std::vector<size_t> all(folder->size());
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "each sample exactly once in epoch " << epoch;
  }
}

TEST(HttpShards, TwoRanksThroughTheDistributedSampler) {
  Served s;
  auto folder =
      std::shared_ptr<ImageSource>(ImageSource::image_folder(s.prepared.folder, small_train()));
  auto http = std::shared_ptr<ImageSource>(ImageSource::tar_shards({s.pattern}, small_train()));
  std::multiset<size_t> both;
  std::vector<size_t> batches;
  for (size_t rank : {0, 1}) {
    const Epoch e = read_epoch(http, DistributedSampler::make(rank, 2, true, 5));
    expect_same(read_epoch(folder, DistributedSampler::make(rank, 2, true, 5)), e);
    batches.push_back(e.indices.size());
    for (const auto& b : e.indices) both.insert(b.begin(), b.end());
  }
  EXPECT_EQ(batches[0], batches[1]) << "every rank yields the same number of batches";
  EXPECT_EQ(both.size(), 22u) << "21 samples padded to 2 x 11, as PyTorch pads";
  EXPECT_EQ(std::set<size_t>(both.begin(), both.end()).size(), 21u) << "every sample is seen";
}

TEST(HttpShards, ResumeMidEpoch) {
  Served s;
  auto folder =
      std::shared_ptr<ImageSource>(ImageSource::image_folder(s.prepared.folder, small_train()));
  auto http = [&] {
    return std::shared_ptr<ImageSource>(ImageSource::tar_shards({s.pattern}, small_train()));
  };
  expect_resumes_exactly(
      [&] { return std::make_unique<DataLoader>(http(), small_batches(), RandomSampler::make(3)); },
      read_epoch(folder, RandomSampler::make(3), 1), 1);
}

// The server is killed after the first batch and comes back 400 ms later: the reads in between
// are refused, retried with backoff, and the epoch completes with exactly the folder's batches.
// The epoch ends after the restart, so reads did meet the dead server.
TEST(HttpShards, AServerStoppedMidEpochAndRestartedCostsRetriesNotTheRun) {
  Served s;
  auto folder =
      std::shared_ptr<ImageSource>(ImageSource::image_folder(s.prepared.folder, small_train()));
  const Epoch expected = read_epoch(folder, RandomSampler::make(3), 0, 1);
  ShardOptions retry = quick_retries();
  retry.retries = 8;  // 20, 40, 80, 100 ms ... : about 0.6 s of backoff in all
  auto http =
      std::shared_ptr<ImageSource>(ImageSource::tar_shards({s.pattern}, small_train(), retry));
  finishes_within(60s, "server restart", [&] {
    LoaderOptions options;
    options.batch_size = 5;
    options.workers = 1;
    options.seed = 7;
    options.slots = 2;  // little read-ahead: most of the epoch is read after the stop
    options.prefetch_factor = 1;
    DataLoader loader(http, options, RandomSampler::make(3));
    Epoch got;
    std::future<void> restart;
    std::chrono::steady_clock::time_point restarted;
    for (Batch& batch : loader) {
      keep(got, batch);
      if (got.indices.size() == 1) {
        s.server->stop();
        restart = std::async(std::launch::async, [&] {
          std::this_thread::sleep_for(400ms);
          s.server->start();
          restarted = std::chrono::steady_clock::now();
        });
      }
    }
    const auto ended = std::chrono::steady_clock::now();
    restart.get();
    expect_same(expected, got);
    EXPECT_GT(ended, restarted) << "the epoch was read ahead before the server stopped";
    EXPECT_EQ(loader.stats().errors, 0u);
  });
}

TEST(HttpShards, ADeadServerFailsTheSampleNamingItsUrl) {
  Served s;
  auto http = std::shared_ptr<ImageSource>(
      ImageSource::tar_shards({s.pattern}, small_train(), quick_retries()));
  s.server->stop();
  finishes_within(30s, "dead server", [&] {
    LoaderOptions options;
    options.batch_size = 5;
    options.workers = 2;
    DataLoader loader(http, options);
    try {
      for (Batch& batch : loader) (void)batch;
      ADD_FAILURE() << "no error with the server gone";
    } catch (const SampleError& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.index(), 0u) << what;
      EXPECT_NE(what.find(s.url_of(s.local[0])), std::string::npos) << what;
      EXPECT_NE(what.find("sample 0"), std::string::npos) << what;
      EXPECT_NE(what.find("after 4 attempts"), std::string::npos) << what;
      EXPECT_NE(what.find("onnect"), std::string::npos) << "the cause: " << what;
    }
  });
  // Opening the shards needs the index: refused naming its URL.
  try {
    ImageSource::tar_shards({s.pattern}, small_train(), quick_retries());
    ADD_FAILURE() << "no error opening shards on a dead server";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(s.server->url("train.index.json")), std::string::npos)
        << e.what();
  }
}

// A 404 is not retried, and names the URL and the status.
TEST(HttpShards, AMissingShardIsANotFoundNamingTheUrl) {
  Served s;
  fs::remove(s.local[1]);
  auto http = std::shared_ptr<ImageSource>(
      ImageSource::tar_shards({s.pattern}, small_train(), quick_retries()));
  LoaderOptions options;
  options.batch_size = 5;
  options.workers = 1;
  options.on_error = ErrorPolicy::kSkip;
  DataLoader loader(http, options);
  for (Batch& batch : loader) (void)batch;
  const auto& stats = loader.stats();
  ASSERT_FALSE(stats.skipped_samples.empty());
  const std::string message = stats.skipped_samples.front().message;
  EXPECT_NE(message.find(s.url_of(s.local[1])), std::string::npos) << message;
  EXPECT_NE(message.find("HTTP 404"), std::string::npos) << message;
  EXPECT_EQ(message.find("attempts"), std::string::npos) << "a 404 is not retried: " << message;
}

// One shard cut in the middle of its second member, a member of another overwritten with junk:
// under kSkip exactly those samples are skipped and every other one arrives; under kRaise the
// first failure names its URL, its member and its sample.
TEST(HttpShards, ATruncatedShardAndACorruptMemberGoThroughTheErrorPolicy) {
  Served s;
  const auto members = indexed_members(s.prepared.prefix.string() + ".index.json");
  ASSERT_EQ(members.size(), 21u);
  const std::string cut_name = fs::path(s.local[1]).filename().string();
  std::vector<size_t> failing;
  std::vector<size_t> in_cut;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].shard == cut_name) in_cut.push_back(i);
  }
  ASSERT_GE(in_cut.size(), 2u);
  fs::resize_file(s.local[1], members[in_cut[1]].offset + members[in_cut[1]].size / 2);
  failing.assign(in_cut.begin() + 1, in_cut.end());
  // The first member of shard 2 gets junk over its first 64 bytes (its SOI and headers).
  const std::string corrupt_name = fs::path(s.local[2]).filename().string();
  size_t corrupt = members.size();
  for (size_t i = 0; i < members.size() && corrupt == members.size(); ++i) {
    if (members[i].shard == corrupt_name) corrupt = i;
  }
  ASSERT_LT(corrupt, members.size());
  {
    std::fstream f(s.local[2], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(members[corrupt].offset));
    const std::string junk(64, 'x');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  failing.push_back(corrupt);
  std::sort(failing.begin(), failing.end());

  auto http = std::shared_ptr<ImageSource>(
      ImageSource::tar_shards({s.pattern}, small_train(), quick_retries()));
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  options.on_error = ErrorPolicy::kSkip;
  {
    DataLoader loader(http, options);
    std::set<size_t> seen;
    for (Batch& batch : loader) seen.insert(batch.indices.begin(), batch.indices.end());
    std::set<size_t> spared;
    for (size_t i = 0; i < members.size(); ++i) {
      if (!std::binary_search(failing.begin(), failing.end(), i)) spared.insert(i);
    }
    EXPECT_EQ(seen, spared);
    std::vector<size_t> skipped;
    for (const auto& k : loader.stats().skipped_samples) skipped.push_back(k.index);
    std::sort(skipped.begin(), skipped.end());
    EXPECT_EQ(skipped, failing);
  }
  options.on_error = ErrorPolicy::kRaise;
  DataLoader loader(http, options);
  try {
    for (Batch& batch : loader) (void)batch;
    ADD_FAILURE() << "no error";
  } catch (const SampleError& e) {
    const std::string what = e.what();
    const size_t first = failing.front();
    EXPECT_EQ(e.index(), first) << what;
    EXPECT_NE(what.find(s.url_of(s.local[members[first].shard == cut_name ? 1 : 2]) + " (member " +
                        members[first].key + ".jpg)"),
              std::string::npos)
        << what;
  }
}

// A server that accepts connections and never answers: every request meets its deadline, so
// opening the shards fails within (retries + 1) deadlines plus the backoff, naming the URL.
TEST(HttpShards, AServerThatNeverAnswersMeetsTheDeadline) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ASSERT_EQ(::listen(fd, 16), 0);  // the kernel completes connections; nobody reads them
  const std::string url =
      "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port)) + "/train-000000.tar";
  ShardOptions o = quick_retries();
  o.retries = 1;
  o.request_timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  finishes_within(20s, "silent server", [&] {
    try {
      ImageSource::tar_shards({url}, small_train(), o);
      ADD_FAILURE() << "no error from a silent server";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("train.index.json"), std::string::npos) << what;
      EXPECT_NE(what.find("after 2 attempts"), std::string::npos) << what;
      EXPECT_NE(what.find("imeout"), std::string::npos) << what;
    }
  });
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, 600ms) << "two deadlines of 300 ms";
  EXPECT_LT(elapsed, 10s);
  ::close(fd);
}

}  // namespace
}  // namespace conveyor
