// Allocation failures on the consumer thread, swept: the k-th allocation that next() makes
// throws std::bad_alloc, for every k until an epoch runs with none left to fail. Whatever k is,
// the exception reaches the caller, the batch it was making is handed out by the next call (no
// batch lost, doubled or out of order), no slot is stranded (the next epoch runs whole) and
// nothing hangs. On the CPU path and through a copy stage (an engine that completes at once,
// kept out of the sweep: the loader is under test, not the engine).
//
// This binary replaces the global operator new; the failure is armed for the consumer thread
// only (thread_local), and counts only allocations made from this binary's own code (Conveyor's
// static libraries and the templates they instantiate), so workers, torch and the test harness
// allocate as usual: LibTorch calls new in noexcept functions, where any bad_alloc terminates.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <numeric>
#include <vector>

#include "test_support.h"

namespace {

thread_local long allocations_until_failure = -1;  // -1: disarmed
thread_local bool failure_injected = false;

// True when `caller` is code of this executable (not of a shared library).
bool in_this_binary(void* caller) {
  Dl_info mine{}, theirs{};
  if (dladdr(reinterpret_cast<void*>(&in_this_binary), &mine) == 0) return false;
  return dladdr(caller, &theirs) != 0 && theirs.dli_fbase == mine.dli_fbase;
}

void* allocate(std::size_t size, void* caller) {
  if (allocations_until_failure >= 0 && in_this_binary(caller) &&
      allocations_until_failure-- == 0) {
    failure_injected = true;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t size) { return allocate(size, __builtin_return_address(0)); }
void* operator new[](std::size_t size) { return allocate(size, __builtin_return_address(0)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace conveyor {
namespace {

using namespace std::chrono_literals;
using testing::finishes_within;
using testing::IndexSource;

// Arms the countdown `remaining` for this thread during the scope (the loader's calls), and
// keeps what is left of it for the next scope: the test's own allocations never count.
class ArmedAllocations {
 public:
  explicit ArmedAllocations(long& remaining) : remaining_(remaining) {
    allocations_until_failure = remaining;
  }
  ~ArmedAllocations() {
    remaining_ = allocations_until_failure;
    allocations_until_failure = -1;
  }
  ArmedAllocations(const ArmedAllocations&) = delete;
  ArmedAllocations& operator=(const ArmedAllocations&) = delete;

 private:
  long& remaining_;
};

// No allocation fails in the scope (the test's own engine, which is not under test).
class NoFailure {
 public:
  NoFailure() : saved_(allocations_until_failure) { allocations_until_failure = -1; }
  ~NoFailure() { allocations_until_failure = saved_; }
  NoFailure(const NoFailure&) = delete;
  NoFailure& operator=(const NoFailure&) = delete;

 private:
  long saved_;
};

class ExemptCopyEngine : public testing::InstantCopyEngine {
 public:
  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent* event, std::function<void()> on_finished) override {
    NoFailure exempt;
    return testing::InstantCopyEngine::start(host, on_device, event, std::move(on_finished));
  }
};

std::vector<int64_t> values(const Batch& b) {
  at::Tensor v = b.field("value");
  return std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
}

void sweep(bool copy_stage) {
  constexpr size_t kSamples = 40;
  std::vector<int64_t> expected(kSamples);
  std::iota(expected.begin(), expected.end(), 0);
  long k = 0;
  for (;; ++k) {
    SCOPED_TRACE("the allocation that fails: " + std::to_string(k));
    LoaderOptions o;
    o.batch_size = 4;
    o.workers = 2;
    o.slots = 4;
    o.prefetch_factor = 2;
    DataLoader loader(std::make_shared<IndexSource>(kSamples), o, nullptr,
                      copy_stage ? std::make_unique<ExemptCopyEngine>() : nullptr);
    std::vector<int64_t> seen;
    bool injected = false;
    size_t failures = 0;
    finishes_within(30s, "an epoch under allocation failures", [&] {
      long remaining = k;  // counts the loader's allocations across calls; one fails
      failure_injected = false;
      for (;;) {
        std::optional<Batch> batch;
        try {
          ArmedAllocations armed(remaining);
          batch = loader.next();
        } catch (const std::bad_alloc&) {
          ++failures;
          ASSERT_LT(failures, 2u) << "one failed allocation made next() fail twice";
          continue;  // the same batch comes next
        }
        if (!batch) break;
        auto v = values(*batch);
        seen.insert(seen.end(), v.begin(), v.end());
      }
      injected = failure_injected;
    });
    EXPECT_EQ(seen, expected) << failures << " failures";
    // No slot was stranded: a whole epoch runs, and again.
    for (int epoch = 0; epoch < 2; ++epoch) {
      size_t rows = 0;
      finishes_within(30s, "the epochs after", [&] {
        for (Batch& b : loader) rows += b.size();
      });
      EXPECT_EQ(rows, kSamples);
    }
    if (::testing::Test::HasFailure()) return;
    EXPECT_EQ(failures, injected ? 1u : 0u);
    if (!injected) break;  // k is past every allocation the loader makes in an epoch
  }
  EXPECT_GT(k, 10) << "the sweep covered too few allocations to mean anything";
}

TEST(AllocationFailure, OnTheCpuPathNoBatchIsLostDoubledOrStranded) { sweep(false); }

TEST(AllocationFailure, ThroughTheCopyStageNoBatchIsLostDoubledOrStranded) { sweep(true); }

}  // namespace
}  // namespace conveyor
