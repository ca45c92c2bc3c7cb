// The loader's copy stage, driven on the CPU by copy engines that behave as a GPU's can: copies
// that complete at once (before their batch is handed out), hand-backs that never come, and a
// loader whose copy stage is gone after join(). Issue 19's defects 1, 5 and 6, where the
// behaviour does not need a GPU; tests/loader_gpu_test.cpp has the rest.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "test_support.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;
using testing::finishes_within;
using testing::IndexSource;
using testing::InstantCopyEngine;
using testing::LateCopyEngine;

std::vector<int64_t> values(const Batch& b) {
  at::Tensor v = b.field("value");
  return std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
}

// A copy that completes inside start() hands its slot back before the batch is handed out, so
// the engine dispatches up to slots + prefetch_factor batches past the one the consumer holds.
// In a Debug build (build-debug/ in scripts/test, and on the GPU machine) the engine's
// invariant checks run: the old check (dispatched - handed out < slots) stopped the process here.
TEST(CopyStage, CopiesThatCompleteAtOnceKeepEveryBatchInOrder) {
  for (size_t slots : {2u, 3u, 8u}) {
    for (size_t prefetch : {1u, 2u, 4u}) {
      LoaderOptions o;
      o.batch_size = 4;
      o.workers = 3;
      o.chunk_size = 2;
      o.slots = slots;
      o.prefetch_factor = prefetch;
      o.timeout = 20s;
      DataLoader loader(std::make_shared<IndexSource>(97), o, nullptr,
                        std::make_unique<InstantCopyEngine>());
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::vector<int64_t> seen;
        for (Batch& b : loader) {
          ASSERT_NE(b.copy_fence, nullptr);
          EXPECT_TRUE(b.copy_fence->done());
          auto v = values(b);
          seen.insert(seen.end(), v.begin(), v.end());
        }
        std::vector<int64_t> expected(97);
        std::iota(expected.begin(), expected.end(), 0);
        EXPECT_EQ(seen, expected) << "slots " << slots << ", prefetch " << prefetch;
      }
    }
  }
}

// A hand-back that never comes (on a GPU: one that threw on CUDA's callback thread) loses its
// slot. The engine reports it through check(), and the loader raises it at the next batch, not
// only once it has run out of slots, and never hangs.
TEST(CopyStage, ALostHandBackIsRaisedAtTheNextBatch) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.slots = 8;
  o.prefetch_factor = 2;
  DataLoader loader(std::make_shared<IndexSource>(200), o, nullptr,
                    std::make_unique<InstantCopyEngine>(/*lose_from=*/1, /*report=*/true));
  size_t delivered = 0;
  std::string error;
  finishes_within(20s, "a lost hand-back", [&] {
    try {
      while (loader.next()) ++delivered;
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("synthetic lost hand-back"), std::string::npos) << error;
  // The copy of batch 1 lost its slot while batch 0 was handed out (the stage runs
  // prefetch_factor ahead), so the error comes with the next call, not 7 slots later.
  EXPECT_LE(delivered, 1u + o.prefetch_factor);
}

// An engine that loses every hand-back and does not say so: the loader cannot know, but with a
// timeout it still ends with a TimeoutError instead of hanging once no slot is left.
TEST(CopyStage, ALostHandBackNobodyReportsEndsInTheTimeout) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  o.slots = 2;
  o.prefetch_factor = 1;
  o.timeout = 1500ms;
  DataLoader loader(std::make_shared<IndexSource>(400), o, nullptr,
                    std::make_unique<InstantCopyEngine>(/*lose_from=*/0, /*report=*/false));
  std::string error;
  finishes_within(30s, "an unreported lost hand-back", [&] {
    try {
      while (loader.next()) {
      }
    } catch (const TimeoutError& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("1500 ms"), std::string::npos) << error;
}

// The consumer waits for a batch's own copy before the batch is handed out (DeviceStager::deliver
// makes the consumer's stream wait on the batch's fence). Here each copy finishes only when the
// test releases it, and the fence's wait blocks until then: next() must be found waiting in it,
// and must not return before the release. A loader that handed batches out without that wait
// would return at once, and its batches could be read before their copies were done.
TEST(CopyStage, ABatchIsHandedOutOnlyOnceTheConsumerWaitedForItsCopy) {
  auto gate = std::make_shared<testing::GatedCopyEngine::Gate>();
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.prefetch_factor = 2;
  DataLoader loader(std::make_shared<IndexSource>(16), o, nullptr,
                    std::make_unique<testing::GatedCopyEngine>(gate));
  const auto waiting = [&] {
    std::lock_guard<std::mutex> lock(gate->mutex);
    return gate->waiting;
  };
  for (size_t n = 0; n < 4; ++n) {
    std::future<std::optional<Batch>> next =
        std::async(std::launch::async, [&] { return loader.next(); });
    // Bounded: at most 10 s for the consumer to reach the wait (it does at once when it waits).
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (waiting() == 0 && next.wait_for(1ms) != std::future_status::ready &&
           std::chrono::steady_clock::now() < deadline) {
    }
    const bool returned_early = next.wait_for(0s) == std::future_status::ready;
    const size_t waits = waiting();
    gate->release(n + 1);  // whatever happened, the consumer may go on now
    std::optional<Batch> b = next.get();
    EXPECT_FALSE(returned_early) << "batch " << n << " was handed out before its copy was done";
    EXPECT_EQ(waits, 1u) << "batch " << n << ": the consumer did not wait for its copy";
    ASSERT_TRUE(b);
    EXPECT_TRUE(b->copy_fence->done());
    std::vector<int64_t> expected(4);
    std::iota(expected.begin(), expected.end(), static_cast<int64_t>(4 * n));
    EXPECT_EQ(values(*b), expected);
  }
  EXPECT_FALSE(loader.next());
}

// host_rows(), the rule every copy engine follows: the rows of each field that no device rows
// replace, as maximal runs, in field then row order, whatever the order and adjacency of the
// device rows; none for a field whose rows all came from the device.
TEST(CopyStage, HostRowsAreTheRowsNoDeviceRowsReplace) {
  const std::vector<at::Tensor> host = {at::zeros({10, 2, 3}, at::kByte),
                                        at::zeros({10}, at::kLong)};
  const auto device = [](size_t field, int64_t first, int64_t rows) {
    return DeviceRows{field, first,
                      field == 0 ? at::ones({rows, 2, 3}, at::kByte) : at::ones({rows}, at::kLong)};
  };
  const auto runs = [&](const std::vector<DeviceRows>& on_device) {
    check_device_rows(host, on_device, c10::Device(c10::DeviceType::CPU));
    std::vector<std::vector<int64_t>> out;
    for (const HostRows& r : host_rows(host, on_device)) {
      out.push_back({static_cast<int64_t>(r.field), r.first_row, r.rows});
    }
    return out;
  };
  using Runs = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(runs({}), (Runs{{0, 0, 10}, {1, 0, 10}}));
  EXPECT_EQ(runs({device(0, 0, 10)}), (Runs{{1, 0, 10}}));
  EXPECT_EQ(runs({device(0, 6, 2), device(0, 1, 2), device(0, 3, 1)}),
            (Runs{{0, 0, 1}, {0, 4, 2}, {0, 8, 2}, {1, 0, 10}}));
  EXPECT_EQ(runs({device(0, 0, 3), device(0, 2, 4), device(1, 9, 1)}),
            (Runs{{0, 6, 4}, {1, 0, 9}}));
  EXPECT_EQ(runs({device(0, 0, 5), device(0, 5, 5), device(1, 0, 10)}), Runs{});
}

// mode() says which path the loader was built for; join() does not turn a GPU loader into a CPU
// one.
TEST(CopyStage, ModeNamesTheCopyStageAfterJoinToo) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  DataLoader loader(std::make_shared<IndexSource>(8), o, nullptr,
                    std::make_unique<LateCopyEngine>(1ms));
  const std::string before = loader.mode();
  EXPECT_NE(before.find("side-stream copies"), std::string::npos) << before;
  loader.join();
  EXPECT_EQ(loader.mode(), before);
}

// On the CPU path mode() gives CUDA's own reason for not using a GPU.
TEST(CopyStage, TheCpuPathSaysWhyNoGpuIsUsed) {
  LoaderOptions o;
  o.workers = 1;
  DataLoader loader(std::make_shared<IndexSource>(4), o);
  const CudaStatus cuda = cuda_status();
  if (cuda.usable()) {
    EXPECT_NE(loader.mode().find("CPU only (device is cpu)"), std::string::npos) << loader.mode();
  } else {
    EXPECT_FALSE(cuda.reason.empty());
    EXPECT_NE(loader.mode().find(cuda.reason), std::string::npos) << loader.mode();
  }
}

}  // namespace
}  // namespace conveyor
