// Test support for the shard tests (shards_test, http_shards_test): running conveyor-prepare on a
// small generated ImageFolder, reading whole epochs, comparing them, and reading the index.
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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

// The members listed in PREFIX.index.json, in its order.
inline std::vector<IndexedMember> indexed_members(const fs::path& index) {
  const std::string text = slurp(index);
  static const std::regex entry(
      R"re(\{"shard": "([^"]+)", "key": "([^"]+)", "offset": ([0-9]+), "size": ([0-9]+))re");
  std::vector<IndexedMember> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), entry);
       it != std::sregex_iterator(); ++it) {
    out.push_back({(*it)[1], (*it)[2], std::stoull((*it)[3]), std::stoull((*it)[4])});
  }
  return out;
}

}  // namespace conveyor::testing::shards
