// The loader's NVTX ranges, as a profiler sees them (issue 23): NVTX's injection interface loads
// a test-only tool (nvtx_recorder.cpp, through NVTX_INJECTION64_PATH, as `nsys profile` loads its
// own) that records every range pushed and popped and every thread named. One epoch over real
// JPEGs must give named worker threads, a "chunk" range per chunk with its batch's sequence as
// payload and one read, decode and resize range per sample nested in it, on every worker thread,
// and the consumer's copy issue per batch and waits in sequence order, all in the Conveyor domain.
// Its own binary: NVTX reads NVTX_INJECTION64_PATH once, at the process's first NVTX call.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "nvtx_recorder.h"
#include "test_support.h"

namespace conveyor {
namespace {

using testing::InstantCopyEngine;
using testing::TempDir;

struct Range {
  std::string name;
  bool has_payload = false;
  uint64_t payload = 0;
  std::vector<Range> children;
};

// Each thread's ranges as trees, from its pushes and pops; fails the test on a pop without a push
// or a range left open.
std::map<uint64_t, std::vector<Range>> ranges_by_thread(const ConveyorNvtxEvent* events,
                                                        size_t count) {
  std::map<uint64_t, std::vector<Range>> roots;
  std::map<uint64_t, std::vector<Range>> open;  // each thread's stack of open ranges
  for (size_t i = 0; i < count; ++i) {
    const ConveyorNvtxEvent& e = events[i];
    if (e.kind == kConveyorNvtxThreadName) continue;
    EXPECT_STREQ(e.domain, "Conveyor") << "every range is in the Conveyor domain";
    std::vector<Range>& stack = open[e.thread];
    if (e.kind == kConveyorNvtxPush) {
      stack.push_back({e.message, e.has_payload != 0, e.payload, {}});
      continue;
    }
    if (stack.empty()) {
      ADD_FAILURE() << "a pop without a push on thread " << e.thread;
      continue;
    }
    Range done = std::move(stack.back());
    stack.pop_back();
    (stack.empty() ? roots[e.thread] : stack.back().children).push_back(std::move(done));
  }
  for (const auto& [thread, stack] : open) {
    EXPECT_TRUE(stack.empty()) << stack.size() << " ranges left open on thread " << thread;
  }
  return roots;
}

TEST(NvtxTest, OneEpochShowsNamedWorkersChunksStagesAndConsumerRanges) {
  const std::string recorder = CONVEYOR_NVTX_RECORDER;
  ASSERT_EQ(::setenv("NVTX_INJECTION64_PATH", recorder.c_str(), 1), 0);

  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b"}, 20);  // 40 photo-like JPEGs
  constexpr size_t kWorkers = 2, kBatch = 8, kChunk = 4, kSamples = 40;
  constexpr size_t kBatches = kSamples / kBatch, kChunks = kSamples / kChunk;
  uint64_t consumer = 0;  // the thread that iterates
  {
    LoaderOptions o;
    o.batch_size = kBatch;
    o.workers = kWorkers;
    o.chunk_size = kChunk;
    DataLoader loader(ImageSource::image_folder(dir.path(), ImageTransform::train(32)), o, nullptr,
                      std::make_unique<InstantCopyEngine>());
    size_t batches = 0;
    testing::finishes_within(std::chrono::seconds(120), "one epoch", [&] {
      consumer = static_cast<uint64_t>(::syscall(SYS_gettid));
      for (Batch& b : loader) {
        EXPECT_EQ(b.size(), kBatch);
        ++batches;
      }
    });
    EXPECT_EQ(batches, kBatches);
  }  // the workers are joined: no more NVTX calls

  void* tool = ::dlopen(recorder.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(tool, nullptr) << "NVTX did not load " << recorder << " from NVTX_INJECTION64_PATH";
  auto events_of =
      reinterpret_cast<ConveyorNvtxEventsFn>(::dlsym(tool, CONVEYOR_NVTX_EVENTS_SYMBOL));
  ASSERT_NE(events_of, nullptr);
  size_t count = 0;
  const ConveyorNvtxEvent* events = events_of(&count);
  ::dlclose(tool);

  // Worker threads named "Conveyor worker 0" .. "Conveyor worker 1", one thread each.
  std::map<uint64_t, std::string> worker_threads;
  for (size_t i = 0; i < count; ++i) {
    if (events[i].kind == kConveyorNvtxThreadName) {
      worker_threads[events[i].thread] = events[i].message;
    }
  }
  std::set<std::string> names;
  for (const auto& [thread, name] : worker_threads) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"Conveyor worker 0", "Conveyor worker 1"}));
  ASSERT_EQ(worker_threads.size(), kWorkers) << "one named thread per worker";

  const std::map<uint64_t, std::vector<Range>> roots = ranges_by_thread(events, count);
  std::map<uint64_t, size_t> chunks_of_batch;
  size_t samples = 0;
  for (const auto& [thread, ranges] : roots) {
    if (thread == consumer) continue;
    ASSERT_TRUE(worker_threads.count(thread)) << "ranges on a thread that is no named worker";
    for (const Range& chunk : ranges) {
      // Every top-level range of a worker is a chunk of a batch of this epoch, holding one read,
      // decode and resize per sample, in that order, and nothing else.
      ASSERT_EQ(chunk.name, "chunk") << "on " << worker_threads.at(thread);
      ASSERT_TRUE(chunk.has_payload);
      ASSERT_LT(chunk.payload, kBatches);
      ++chunks_of_batch[chunk.payload];
      ASSERT_EQ(chunk.children.size(), 3 * kChunk) << "on " << worker_threads.at(thread);
      for (size_t i = 0; i < chunk.children.size(); ++i) {
        const Range& stage = chunk.children[i];
        EXPECT_EQ(stage.name, (std::vector<std::string>{"read", "decode", "resize"}[i % 3]));
        EXPECT_TRUE(stage.children.empty()) << stage.name << " holds no other range";
        EXPECT_FALSE(stage.has_payload);
      }
      samples += kChunk;
    }
  }
  EXPECT_EQ(samples, kSamples) << "one read, decode and resize per sample of the epoch";
  ASSERT_EQ(chunks_of_batch.size(), kBatches);
  for (const auto& [sequence, chunks] : chunks_of_batch) {
    EXPECT_EQ(chunks, kBatch / kChunk) << "batch " << sequence;
  }
  size_t total_chunks = 0;
  for (const auto& [sequence, chunks] : chunks_of_batch) total_chunks += chunks;
  EXPECT_EQ(total_chunks, kChunks);

  // The consumer (this thread): one "issue copy" per batch, in sequence order; its waits for a
  // batch name a batch of the epoch, in order; nothing nests inside them.
  ASSERT_TRUE(roots.count(consumer)) << "the consumer pushed no range";
  std::vector<uint64_t> copies, waits;
  for (const Range& r : roots.at(consumer)) {
    ASSERT_TRUE(r.has_payload) << r.name;
    EXPECT_TRUE(r.children.empty()) << r.name;
    ASSERT_LT(r.payload, kBatches) << r.name;
    if (r.name == "issue copy") {
      copies.push_back(r.payload);
    } else if (r.name == "wait for batch") {
      waits.push_back(r.payload);
    } else {
      EXPECT_EQ(r.name, "wait for slot");
    }
  }
  EXPECT_EQ(copies, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(std::is_sorted(waits.begin(), waits.end()));
}

}  // namespace
}  // namespace conveyor
