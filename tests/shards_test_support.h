// Test support for the shard tests (shards_test, http_shards_test, shard_stream_test and the
// tests of servers that ignore Range, pipe: shards and WebDataset's shards): running
// conveyor-prepare on a small generated ImageFolder, reading whole epochs, comparing them (by
// batch, or as samples recognised by their pixels), reading the index, and this process's
// children.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <torch/serialize.h>

#include "conveyor/loader.h"
#include "test_support.h"

namespace conveyor::testing::shards {

namespace fs = std::filesystem;

struct CommandResult {
  int status = -1;  // exit status
  std::string out;
  std::string err;
};

inline std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `command` through the shell, capturing its stdout and stderr.
inline CommandResult run(const std::string& command, const TempDir& dir) {
  const fs::path out = dir / "run.out";
  const fs::path err = dir / "run.err";
  const int raw = std::system((command + " >" + out.string() + " 2>" + err.string()).c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline CommandResult prepare(const std::string& args, const TempDir& dir) {
  return run(std::string(CONVEYOR_PREPARE) + " " + args, dir);
}

inline const std::vector<std::string> kClasses = {"ant", "bee", "cow"};

inline ImageTransform small_train() {
  ImageTransform t = ImageTransform::train(24);
  return t;
}

// Every batch of one epoch: indices, labels and images.
struct Epoch {
  std::vector<std::vector<size_t>> indices;
  std::vector<at::Tensor> labels;
  std::vector<at::Tensor> images;
};

// Appends one batch to an epoch.
inline void keep(Epoch& e, Batch& batch) {
  e.indices.push_back(batch.indices);
  e.labels.push_back(batch.labels().clone());
  e.images.push_back(batch.images().clone());
}

// The options every shard test reads with: batches of 5, seed 7.
inline LoaderOptions small_batches(size_t workers = 2, uint64_t seed = 7) {
  LoaderOptions options;
  options.batch_size = 5;
  options.workers = workers;
  options.seed = seed;
  return options;
}

inline Epoch read_epoch(std::shared_ptr<SampleSource> source, std::unique_ptr<Sampler> sampler,
                        uint64_t epoch = 0, size_t workers = 2, uint64_t seed = 7) {
  DataLoader loader(std::move(source), small_batches(workers, seed), std::move(sampler));
  loader.set_epoch(epoch);
  Epoch e;
  for (Batch& batch : loader) keep(e, batch);
  return e;
}

// Resumes in the middle of `epoch`: a loader from `make_loader` is saved after receiving two
// batches and destroyed (a source serves one loader at a time), then the checkpoint is loaded into
// a second one, which must give batches 2.. of `whole` exactly.
inline void expect_resumes_exactly(const std::function<std::unique_ptr<DataLoader>()>& make_loader,
                                   const Epoch& whole, uint64_t epoch) {
  std::string checkpoint;
  {
    auto first = make_loader();
    first->set_epoch(epoch);
    auto it = first->begin();
    ++it;  // 2 batches received
    torch::serialize::OutputArchive archive;
    first->save(archive);
    std::ostringstream out;
    archive.save_to(out);
    checkpoint = out.str();
  }
  auto resumed = make_loader();
  torch::serialize::InputArchive archive;
  std::istringstream in(checkpoint);
  archive.load_from(in);
  resumed->load(archive);
  size_t b = 2;
  for (Batch& batch : *resumed) {
    ASSERT_LT(b, whole.indices.size());
    EXPECT_EQ(batch.indices, whole.indices[b]) << b;
    EXPECT_TRUE(at::equal(batch.images(), whole.images[b])) << b;
    EXPECT_TRUE(at::equal(batch.labels(), whole.labels[b])) << b;
    ++b;
  }
  EXPECT_EQ(b, whole.indices.size());
}

inline void expect_same(const Epoch& a, const Epoch& b) {
  ASSERT_EQ(a.indices.size(), b.indices.size());
  ASSERT_FALSE(a.indices.empty());
  for (size_t i = 0; i < a.indices.size(); ++i) {
    EXPECT_EQ(a.indices[i], b.indices[i]) << "batch " << i;
    EXPECT_TRUE(at::equal(a.labels[i], b.labels[i])) << "batch " << i;
    EXPECT_TRUE(at::equal(a.images[i], b.images[i])) << "batch " << i;
  }
}

// A folder of 3 classes x 7 images of 64x48 (about 6-7 kB each) prepared into shards of 32 kB, so
// that the 21 samples spread over several shards.
struct Prepared {
  TempDir dir;
  fs::path folder = dir / "folder";
  fs::path prefix = dir / "shards" / "train";
  CommandResult result;
  Prepared(const std::string& extra = "") {
    make_small_folder(folder, kClasses, 7);
    result = prepare(folder.string() + " " + prefix.string() +
                         " --format wds --shard-size 32K --workers 2 " + extra,
                     dir);
  }
  std::vector<std::string> shard_paths() const {
    std::vector<std::string> paths;
    for (size_t i = 0;; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "-%06zu.tar", i);
      const std::string p = prefix.string() + name;
      if (!fs::exists(p)) return paths;
      paths.push_back(p);
    }
  }
};

// One .jpg member as the index gives it.
struct IndexedMember {
  std::string shard;  // file name
  std::string key;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// The members listed in PREFIX.index.json, in its order (read with nlohmann/json, not with the
// library's own reader, shards/index.h).
inline std::vector<IndexedMember> indexed_members(const fs::path& index) {
  const nlohmann::json doc = nlohmann::json::parse(slurp(index));
  std::vector<IndexedMember> out;
  for (const auto& s : doc.at("samples")) {
    out.push_back({s.at("shard").get<std::string>(), s.at("key").get<std::string>(),
                   s.at("offset").get<uint64_t>(), s.at("size").get<uint64_t>()});
  }
  return out;
}

// Deterministic per image (no random crop or flip), so a sample can be recognised by its pixels
// whatever its position in the stream.
inline ImageTransform fixed() { return ImageTransform::eval(24, 28); }

// A sample as the user sees it: its label and its pixels.
using Sample = std::pair<int64_t, std::string>;

inline std::vector<Sample> samples_of(const Epoch& e) {
  std::vector<Sample> out;
  for (size_t b = 0; b < e.indices.size(); ++b) {
    const at::Tensor images = e.images[b].contiguous();
    const int64_t rows = images.size(0);
    const size_t row_bytes = static_cast<size_t>(images.numel() / rows);
    for (int64_t r = 0; r < rows; ++r) {
      const auto* p = static_cast<const char*>(images.data_ptr()) + r * row_bytes;
      out.emplace_back(e.labels[b][r].item<int64_t>(), std::string(p, row_bytes));
    }
  }
  return out;
}

inline std::multiset<Sample> as_set(const std::vector<Sample>& v) { return {v.begin(), v.end()}; }

// An epoch in the stream's own order (the loader's default sequential sampler).
inline Epoch read_stream(std::shared_ptr<SampleSource> source, uint64_t epoch = 0,
                         size_t workers = 2, uint64_t seed = 7) {
  return read_epoch(std::move(source), SequentialSampler::make(), epoch, workers, seed);
}

inline ShardOptions streamed(size_t buffer = 8) {
  ShardOptions o;
  o.streaming = true;
  o.shuffle_buffer = buffer;
  return o;
}

inline std::shared_ptr<ImageSource> shards_source(const std::vector<std::string>& shards,
                                                  const ShardOptions& o) {
  return std::shared_ptr<ImageSource>(ImageSource::tar_shards(shards, fixed(), o));
}

// Every sample of the ImageFolder at `folder`, as fixed() shows it.
inline std::multiset<Sample> folder_samples(const fs::path& folder) {
  auto source = std::shared_ptr<ImageSource>(ImageSource::image_folder(folder, fixed()));
  return as_set(samples_of(read_stream(source)));
}

// "train-{000000..00000N}.tar" for shards 0..count-1, with `prefix` before it.
inline std::string shard_pattern(const std::string& prefix, size_t count) {
  char last[16];
  std::snprintf(last, sizeof last, "%06zu", count - 1);
  return prefix + "train-{000000.." + last + "}.tar";
}

// The processes whose parent is this one (from /proc), zombies included.
inline std::vector<int> child_processes() {
  std::vector<int> out;
  const std::string self = std::to_string(::getpid());
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state, ppid;
    rest >> state >> ppid;
    if (ppid == self) out.push_back(std::stoi(name));
  }
  return out;
}

// True when process `pid` is gone or only a zombie left for another parent to reap.
inline bool process_ended(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return true;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

// process_ended(pid), read again for up to `wait`: a SIGKILL to a process group is delivered
// asynchronously, so a killed member that is not the caller's child (a command's background job,
// reaped by init) can still be running for a moment after killpg returns.
inline bool process_ends_within(int pid, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!process_ended(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace conveyor::testing::shards
