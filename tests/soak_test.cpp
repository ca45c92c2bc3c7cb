// The soak (issue 22): many short epochs of an ImageFolder under the skip policy, broken off at
// random batches, loaders destroyed mid-epoch, epochs resumed from checkpoints saved at random
// batches by a new loader, and files truncated or deleted between loaders. Every epoch that
// completes is checked whole: every sample of its order that was not counted as skipped is
// delivered, each skipped one is replaced by exactly one substitute, and nothing else arrives.
// Resident memory, open file descriptors and threads stay flat.
// ctest runs a short version; CONVEYOR_SOAK_MINUTES=N runs N minutes (the note's long run) and
// prints what it measured.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/serialize/archive.h>

#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// What the process holds, from /proc/self.
struct Resources {
  size_t rss_kib = 0;
  size_t fds = 0;
  size_t threads = 0;
};

Resources resources_now() {
  Resources r;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) r.rss_kib = std::stoul(line.substr(6));
    if (line.rfind("Threads:", 0) == 0) r.threads = std::stoul(line.substr(8));
  }
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++r.fds;
  }
  return r;
}

// The resources once no thread is still exiting: a joined thread's /proc entry can outlive its
// pthread_join by a moment (the kernel wakes the joiner before it removes the task), so a count
// above `threads` is read again, for up to 1 s. A thread that outlives its loader still counts.
Resources settled_resources(size_t threads) {
  Resources now = resources_now();
  for (int i = 0; i < 100 && now.threads > threads; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = resources_now();
  }
  return now;
}

std::string describe(const Resources& r) {
  return std::to_string(r.rss_kib / 1024) + " MiB resident, " + std::to_string(r.fds) + " fds, " +
         std::to_string(r.threads) + " threads";
}

class Soak {
 public:
  explicit Soak(const fs::path& root) : root_(root) {
    testing::make_small_folder(root_, {"a", "b", "c", "d"}, kPerClass, 40, 30);
    for (const auto& entry : fs::recursive_directory_iterator(root_)) {
      if (entry.is_regular_file()) files_.push_back(entry.path());
    }
    std::sort(files_.begin(), files_.end());  // the ImageFolder's order: class, then name
    for (const auto& f : files_) pristine_.push_back(read(f));
  }

  // One loader's life: the files are whole when it lists them, then about one in ten is deleted
  // or truncated before it reads any. It continues the last checkpoint (or starts a new epoch),
  // runs a few epochs and ends with one broken off, saved, destroyed mid-way or run whole.
  void session() {
    for (size_t i = 0; i < files_.size(); ++i) testing::write_bytes(files_[i], pristine_[i]);
    LoaderOptions o;
    o.batch_size = kBatch;
    o.workers = 1 + rng_() % 3;
    o.on_error = ErrorPolicy::kSkip;
    o.timeout = std::chrono::seconds(60);  // a hang becomes a failure
    o.seed = 7;
    auto loader =
        std::make_unique<DataLoader>(ImageSource::image_folder(root_, ImageTransform::eval(16, 16)),
                                     o, RandomSampler::make(o.seed));
    deleted_.clear();
    std::uniform_int_distribution<int> die(0, 19);
    for (size_t i = 0; i < files_.size(); ++i) {
      const int roll = die(rng_);
      if (roll == 0) {
        fs::remove(files_[i]);
        deleted_.insert(i);
      }
      if (roll == 1) fs::resize_file(files_[i], pristine_[i].size() / 3);
    }
    // The epoch a loaded checkpoint continues (kNone: none).
    constexpr uint64_t kNone = ~uint64_t{0};
    uint64_t continuing = kNone;
    if (checkpoint_ && rng_() % 4 != 0) {
      std::istringstream in(checkpoint_->bytes);
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      loader->load(archive);
      continuing = checkpoint_->epoch;
      ++resumes_;
    } else {
      loader->set_epoch(next_epoch_++);
    }
    checkpoint_.reset();
    const int epochs = 1 + static_cast<int>(rng_() % 3);
    for (int e = 0; e < epochs; ++e) {
      auto it = loader->begin();
      const uint64_t epoch = loader->epoch();
      if (continuing != epoch) received_[epoch].clear();
      continuing = kNone;
      std::set<size_t>& received = received_[epoch];
      std::vector<size_t> order;
      RandomSampler::make(o.seed)->indices(files_.size(), epoch, order);
      const size_t batches = loader->batches_per_epoch();
      // The last epoch of a session is broken off (0), saved (1), destroyed mid-way (2) or run
      // whole (3); the others are broken off or run whole.
      const int fate =
          e + 1 == epochs ? static_cast<int>(rng_() % 4) : static_cast<int>(rng_() % 2) * 3;
      const size_t stop_at = rng_() % batches;
      size_t b = 0;
      for (; it != loader->end(); ++it, ++b) {
        if (fate == 1 && b == stop_at) check_batch(*loader, *it, order, received);  // it is held
        if (fate != 3 && b == stop_at) break;
        check_batch(*loader, *it, order, received);
      }
      if (fate == 3) {
        SCOPED_TRACE("epoch " + std::to_string(epoch));
        EXPECT_EQ(received.size(), batches) << "every batch of the epoch arrived once";
        ++checked_;
        ++next_epoch_;
        continue;
      }
      ++breaks_;
      if (fate == 1) {  // the batch the iterator holds counts as received
        std::ostringstream out;
        torch::serialize::OutputArchive archive;
        loader->save(archive);
        archive.save_to(out);
        checkpoint_ = Checkpoint{out.str(), epoch};
      }
      if (fate != 0) break;  // saved or destroyed mid-epoch: this loader's life ends here
    }
    loader.reset();
  }

  size_t checked() const { return checked_; }
  size_t breaks() const { return breaks_; }
  size_t resumes() const { return resumes_; }
  size_t substituted() const { return substituted_; }

 private:
  static constexpr size_t kPerClass = 12;
  static constexpr size_t kBatch = 8;
  struct Checkpoint {
    std::string bytes;
    uint64_t epoch;
  };

  // Each row holds its sample of the epoch's order, or, when the loader counted that sample as
  // skipped, a substitute from the next max_substitutes; never a deleted file; each batch once.
  void check_batch(const DataLoader& loader, const Batch& batch, const std::vector<size_t>& order,
                   std::set<size_t>& received) {
    SCOPED_TRACE("epoch " + std::to_string(batch.epoch) + " batch " +
                 std::to_string(batch.sequence));
    EXPECT_TRUE(received.insert(batch.sequence).second) << "a batch arrived twice";
    const size_t n = files_.size();
    for (size_t r = 0; r < batch.indices.size(); ++r) {
      const size_t want = order.at(batch.sequence * kBatch + r);
      const size_t got = batch.indices[r];
      EXPECT_EQ(deleted_.count(got), 0u) << "a deleted file was delivered";
      if (got == want) continue;
      ++substituted_;
      const LoaderStats stats = loader.stats();
      const bool skipped = std::any_of(
          stats.skipped_samples.begin(), stats.skipped_samples.end(),
          [&](const SkippedSample& s) { return s.index == want && s.epoch == batch.epoch; });
      EXPECT_TRUE(skipped) << "sample " << want << " was replaced by " << got
                           << " without being counted as skipped";
      EXPECT_LE((got + n - want) % n, loader.options().max_substitutes);
    }
    EXPECT_EQ(batch.indices.size(), std::min(kBatch, n - batch.sequence * kBatch));
  }

  static std::vector<uint8_t> read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  fs::path root_;
  std::vector<fs::path> files_;
  std::vector<std::vector<uint8_t>> pristine_;
  std::set<size_t> deleted_;  // this session's
  std::mt19937_64 rng_{22};
  std::map<uint64_t, std::set<size_t>> received_;  // epoch -> batches received
  std::optional<Checkpoint> checkpoint_;
  uint64_t next_epoch_ = 0;
  size_t checked_ = 0, breaks_ = 0, resumes_ = 0, substituted_ = 0;
};

TEST(Soak, EpochsStayWholeAndResourcesFlatThroughBreaksResumesAndFileFaults) {
  const char* minutes_env = std::getenv("CONVEYOR_SOAK_MINUTES");
  const double minutes = minutes_env ? std::atof(minutes_env) : 0.0;
  testing::TempDir dir;
  Soak soak(dir.path());
  for (int i = 0; i < 5; ++i) soak.session();  // warm-up: allocator pools, lazy libraries
  const Resources before = resources_now();
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double, std::ratio<60>>(minutes));
  size_t sessions = 0;
  Resources peak = before;
  while (sessions < 60 || Clock::now() < until) {
    soak.session();
    ++sessions;
    if (sessions % 50 == 0) {
      const Resources now = resources_now();
      peak.rss_kib = std::max(peak.rss_kib, now.rss_kib);
      peak.fds = std::max(peak.fds, now.fds);
      peak.threads = std::max(peak.threads, now.threads);
    }
    if (::testing::Test::HasFailure()) break;
  }
  const Resources after = settled_resources(before.threads);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "soak: %zu loaders in %.0f s, %zu whole epochs checked, %zu broken off, %zu continued by a "
      "new loader from a checkpoint, %zu rows substituted; before: %s; after: %s; peak: %s\n",
      sessions, seconds, soak.checked(), soak.breaks(), soak.resumes(), soak.substituted(),
      describe(before).c_str(), describe(after).c_str(), describe(peak).c_str());
  EXPECT_GT(soak.checked(), 10u);
  EXPECT_GT(soak.resumes(), 5u);
  EXPECT_GT(soak.substituted(), 0u);
  EXPECT_EQ(after.threads, before.threads) << "every loader's threads are joined";
  EXPECT_EQ(after.fds, before.fds) << "no file descriptor is leaked";
  EXPECT_LE(after.rss_kib, before.rss_kib + 64 * 1024) << "resident memory stays flat";
}

}  // namespace
}  // namespace conveyor
