// Storage faults (issue 22), injected through the Storage seam (fault_storage.h) into the three
// sources a user reads at random: an ImageFolder, tar shards on local disk, and the same shards
// from a real nginx on loopback. Each fault (an I/O error on one read, short reads, a file gone
// after the listing, a file that changed size, a read that stalls past the loader's timeout) runs
// under ErrorPolicy raise and skip. What a user must see: an error that names the file and the
// sample, or a counted skip; every other sample of the epoch once, with the reference's pixels;
// and no hang (every epoch runs under the watchdog).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "conveyor/loader.h"
#include "fault_storage.h"
#include "nginx_server.h"
#include "shards_test_support.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::FaultStorage;
using testing::finishes_within;
using testing::make_small_folder;
using testing::NginxServer;
using testing::TempDir;
using namespace testing::shards;

enum class Where { kFolder, kLocalShards, kHttpShards };
enum class Fault { kIoError, kShortReads, kGone, kResized, kStall };

const char* name_of(Where w) {
  switch (w) {
    case Where::kFolder:
      return "Folder";
    case Where::kLocalShards:
      return "LocalShards";
    case Where::kHttpShards:
      return "HttpShards";
  }
  return "?";
}

const char* name_of(Fault f) {
  switch (f) {
    case Fault::kIoError:
      return "IoError";
    case Fault::kShortReads:
      return "ShortReads";
    case Fault::kGone:
      return "Gone";
    case Fault::kResized:
      return "Resized";
    case Fault::kStall:
      return "Stall";
  }
  return "?";
}

// The folder, its shards (3 of about 8 samples) and nginx serving them: made once per process.
struct Data {
  Prepared prepared;
  std::unique_ptr<NginxServer> server;
  std::vector<std::string> shards;
  std::string http_pattern;
  Data() {
    if (prepared.result.status != 0) throw std::runtime_error(prepared.result.err);
    shards = prepared.shard_paths();
    server = std::make_unique<NginxServer>(prepared.prefix.parent_path(), prepared.dir / "nginx");
    char last[16];
    std::snprintf(last, sizeof last, "%06zu", shards.size() - 1);
    http_pattern = server->url("train-{000000.." + std::string(last) + "}.tar");
  }
};

Data& data() {
  static Data d;
  return d;
}

std::shared_ptr<ImageSource> make_source(Where where, std::shared_ptr<const Storage> storage) {
  if (where == Where::kFolder) {
    FolderOptions o;
    o.storage = std::move(storage);
    return ImageSource::image_folder(data().prepared.folder, fixed(), o);
  }
  ShardOptions o;
  o.storage = std::move(storage);
  o.retries = 1;
  o.backoff_initial = 10ms;
  o.request_timeout = 5s;
  if (where == Where::kLocalShards) return ImageSource::tar_shards(data().shards, fixed(), o);
  return ImageSource::tar_shards({data().http_pattern}, fixed(), o);
}

// The file a fault hits: one image of the folder, or the second shard.
std::string target_of(Where where, const ImageSource& source) {
  return where == Where::kFolder ? source.items()[7].path : std::string("train-000001.tar");
}

struct Outcome {
  std::map<size_t, std::vector<size_t>> indices;  // by batch sequence
  std::map<size_t, at::Tensor> images;
  std::map<size_t, at::Tensor> labels;
  std::vector<SampleError> errors;
  size_t timeouts = 0;
  uint64_t skipped = 0;
};

Outcome run_epoch(std::shared_ptr<ImageSource> source, ErrorPolicy policy) {
  Outcome out;
  LoaderOptions o = small_batches(2, 7);
  o.on_error = policy;
  o.timeout = 300ms;
  finishes_within(60s, "an epoch with a storage fault", [&] {
    DataLoader loader(source, o, RandomSampler::make(3));
    while (true) {
      try {
        std::optional<Batch> b = loader.next();
        if (!b) break;
        out.indices[b->sequence] = b->indices;
        out.images[b->sequence] = b->images().clone();
        out.labels[b->sequence] = b->labels().clone();
      } catch (const SampleError& e) {
        out.errors.push_back(e);
      } catch (const TimeoutError&) {
        ASSERT_LT(++out.timeouts, 100u) << "the epoch does not move on";
      }
    }
    out.skipped = loader.stats().skipped;
  });
  return out;
}

// The samples of `source` that read `target` (the whole file or shard), and, for a shard cut at
// `cut` bytes, only those whose member ends past it.
std::set<size_t> samples_of(const ImageSource& source, const std::string& target,
                            uint64_t cut = ~uint64_t{0}) {
  std::map<std::string, IndexedMember> members;
  for (const auto& m : indexed_members(data().prepared.prefix.string() + ".index.json")) {
    members[m.shard + " (member " + m.key + ".jpg)"] = m;
  }
  std::set<size_t> out;
  for (size_t i = 0; i < source.size(); ++i) {
    const std::string name = source.describe(i);
    if (name.find(target) == std::string::npos) continue;
    const size_t member = name.find(" (member");
    if (member == std::string::npos) {  // a file of its own: the whole of it is the sample's
      out.insert(i);
      continue;
    }
    const auto m =
        members.find(fs::path(name.substr(0, member)).filename().string() + name.substr(member));
    if (cut != ~uint64_t{0} && m != members.end() && m->second.offset + m->second.size <= cut) {
      continue;
    }
    out.insert(i);
  }
  return out;
}

class StorageFaultTest : public ::testing::TestWithParam<std::tuple<Where, Fault, ErrorPolicy>> {};

TEST_P(StorageFaultTest, NamesTheFileAndSampleOrCountsTheSkipAndLosesNothingElse) {
  const auto [where, fault, policy] = GetParam();
  // The reference: the same epoch through the real storage.
  const auto reference_source = make_source(where, system_storage());
  const Outcome reference = run_epoch(reference_source, ErrorPolicy::kRaise);
  ASSERT_TRUE(reference.errors.empty());

  auto storage = std::make_shared<FaultStorage>();
  const auto source = make_source(where, storage);
  const std::string target = target_of(where, *source);
  std::set<size_t> faulty;       // the samples that may fail
  size_t expected_failures = 0;  // how many of them do
  const char* cause = "";
  switch (fault) {
    case Fault::kIoError:
      storage->io_error(target, 1);  // the first read of the file or shard
      faulty = samples_of(*source, target);
      expected_failures = 1;
      cause = "Input/output error";
      break;
    case Fault::kShortReads:
      storage->short_reads("", 700);
      expected_failures = 0;
      break;
    case Fault::kGone:
      storage->gone(target);
      faulty = samples_of(*source, target);
      expected_failures = faulty.size();
      cause = "No such file or directory";
      break;
    case Fault::kResized: {
      // The image loses its second half; the shard ends inside its third member.
      uint64_t cut = 0;
      if (where == Where::kFolder) {
        cut = fs::file_size(target) / 2;
      } else {
        std::vector<IndexedMember> in_shard;
        for (const auto& m : indexed_members(data().prepared.prefix.string() + ".index.json")) {
          if (m.shard == target) in_shard.push_back(m);
        }
        ASSERT_GE(in_shard.size(), 4u);
        cut = in_shard[2].offset + in_shard[2].size / 2;
      }
      storage->resized(target, cut);
      faulty =
          where == Where::kFolder ? samples_of(*source, target) : samples_of(*source, target, cut);
      expected_failures = faulty.size();
      cause = where == Where::kFolder ? "shrank" : "ends at byte";
      break;
    }
    case Fault::kStall:
      storage->stall(target, 1, 1500ms);  // five times the loader's timeout
      expected_failures = 0;
      break;
  }
  ASSERT_EQ(faulty.size() >= expected_failures, true);

  const Outcome got = run_epoch(source, policy);
  EXPECT_GT(storage->injected(), 0u) << "no fault was injected";
  if (fault == Fault::kStall) {
    EXPECT_GE(got.timeouts, 1u) << "the stall did not outlast the timeout";
  }

  // Every error names the file and the sample, with the cause; it is one of the faulty samples.
  std::set<size_t> failed;
  for (const SampleError& e : got.errors) {
    const std::string what = e.what();
    EXPECT_NE(e.path().find(target), std::string::npos) << what;
    EXPECT_NE(what.find(target), std::string::npos) << what;
    EXPECT_NE(what.find("sample " + std::to_string(e.index())), std::string::npos) << what;
    EXPECT_NE(what.find(cause), std::string::npos) << what;
    EXPECT_EQ(faulty.count(e.index()), 1u) << what;
    failed.insert(e.index());
  }

  // Each batch delivered is the reference's batch, but for the faulty samples a skip replaced
  // (their rows then hold a counted substitute, with the substitute's own pixels and label).
  std::map<size_t, std::pair<at::Tensor, at::Tensor>> reference_sample;  // index -> image, label
  for (const auto& [sequence, indices] : reference.indices) {
    for (size_t r = 0; r < indices.size(); ++r) {
      reference_sample[indices[r]] = {reference.images.at(sequence)[static_cast<int64_t>(r)],
                                      reference.labels.at(sequence)[static_cast<int64_t>(r)]};
    }
  }
  size_t substituted = 0;
  for (const auto& [sequence, indices] : got.indices) {
    const std::vector<size_t>& expected = reference.indices.at(sequence);
    ASSERT_EQ(indices.size(), expected.size()) << "batch " << sequence;
    for (size_t r = 0; r < indices.size(); ++r) {
      if (indices[r] != expected[r]) {
        EXPECT_EQ(policy, ErrorPolicy::kSkip) << "batch " << sequence << " row " << r;
        EXPECT_EQ(faulty.count(expected[r]), 1u) << "sample " << expected[r] << " was replaced";
        ++substituted;
      }
      const auto& [image, label] = reference_sample.at(indices[r]);
      EXPECT_TRUE(got.images.at(sequence)[static_cast<int64_t>(r)].equal(image))
          << "batch " << sequence << " row " << r << " (sample " << indices[r] << ")";
      EXPECT_TRUE(got.labels.at(sequence)[static_cast<int64_t>(r)].equal(label));
    }
  }
  if (policy == ErrorPolicy::kSkip) {
    EXPECT_TRUE(got.errors.empty()) << got.errors.front().what();
    EXPECT_EQ(got.skipped, expected_failures);
    EXPECT_EQ(substituted, expected_failures);
    EXPECT_EQ(got.indices.size(), reference.indices.size());
  } else {
    EXPECT_EQ(got.skipped, 0u);
    EXPECT_EQ(substituted, 0u);
    // A failed batch raised once and was not delivered; every other batch was.
    EXPECT_EQ(got.indices.size() + got.errors.size(), reference.indices.size());
    if (expected_failures == 1) {
      EXPECT_EQ(failed.size(), 1u);
    }
    for (const auto& [sequence, indices] : reference.indices) {
      const bool hit = std::any_of(indices.begin(), indices.end(), [&](size_t i) {
        return faulty.count(i) != 0 && (expected_failures != 1 || failed.count(i) != 0);
      });
      EXPECT_EQ(got.indices.count(sequence), hit ? 0u : 1u) << "batch " << sequence;
    }
  }
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<Where, Fault, ErrorPolicy>>& info) {
  return std::string(name_of(std::get<0>(info.param))) + name_of(std::get<1>(info.param)) +
         (std::get<2>(info.param) == ErrorPolicy::kRaise ? "Raise" : "Skip");
}

INSTANTIATE_TEST_SUITE_P(
    EveryFaultEverySource, StorageFaultTest,
    ::testing::Combine(::testing::Values(Where::kFolder, Where::kLocalShards, Where::kHttpShards),
                       ::testing::Values(Fault::kIoError, Fault::kShortReads, Fault::kGone,
                                         Fault::kResized, Fault::kStall),
                       ::testing::Values(ErrorPolicy::kRaise, ErrorPolicy::kSkip)),
    test_name);

// The real world beside the injected one: a file removed for real after the listing fails its
// sample naming it, through the real storage.
TEST(StorageFaultReal, AFileRemovedAfterTheListingNamesItself) {
  TempDir dir;
  make_small_folder(dir / "f", kClasses, 3);
  auto source = std::shared_ptr<ImageSource>(ImageSource::image_folder(dir / "f", fixed()));
  const std::string removed = source->items()[4].path;
  fs::remove(removed);
  LoaderOptions o = small_batches(2, 7);
  o.on_error = ErrorPolicy::kSkip;
  finishes_within(30s, "a removed file", [&] {
    DataLoader loader(source, o);
    size_t rows = 0;
    for (Batch& b : loader) rows += b.size();
    EXPECT_EQ(rows, source->size());
    EXPECT_EQ(loader.stats().skipped, 1u);
  });
}

}  // namespace
}  // namespace conveyor
