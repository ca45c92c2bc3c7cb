// The CUDA path's promises, on a GPU (issue 19): every test compiles everywhere and skips, with
// the reason, where no CUDA device is usable. Each loader test runs under both completion modes.
//   * a batch is whole on the consumer's stream the moment it is handed out (a 128 MB checksum);
//   * the next batch is copied while the consumer's stream is busy (overlap), and the consumer
//     waits only for its own batch, even with no more slots than prefetch_factor;
//   * a batch read on another stream is safe through Batch::record_stream, also after it is
//     dropped while later batches arrive;
//   * every slot is handed back once, after its copy; a hand-back that throws, or a sticky CUDA
//     error, becomes an exception instead of a hang;
//   * the copy stream is the engine's own; errors are not left pending; normalize_images agrees
//     with the CPU path; a loader on cuda:1 leaves the current device and GPU 0 alone.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "test_support.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;
using testing::finishes_within;
using testing::IndexSource;

// About a second of GPU time for at::cuda::sleep (H100/H200 clocks are about 2 GHz). The tests
// below only compare the order in which events complete, never wall-clock times.
constexpr int64_t kAboutASecond = 2'000'000'000;

const c10::Device kCuda0("cuda:0");

// The sum of a PatternSource image row of `bytes` bytes for dataset index `index`.
int64_t pattern_row_sum(size_t index, size_t bytes) {
  int64_t sum = 0;
  const size_t cycles = bytes / 251;
  sum += static_cast<int64_t>(cycles) * (251 * 250 / 2);
  for (size_t o = cycles * 251; o < bytes; ++o) sum += PatternSource::pattern_byte(index, o);
  return sum;
}

// Checks a batch of PatternSource rows in place, on the current stream, and returns how many
// rows disagree (a host sync at the end, once the check is queued).
int64_t wrong_rows(const Batch& b, size_t bytes) {
  const at::Tensor sums = at::sum(b.images(), {1}, /*keepdim=*/false, at::kLong).cpu();
  const at::Tensor labels = b.labels().cpu();
  int64_t wrong = 0;
  for (int64_t r = 0; r < sums.size(0); ++r) {
    const auto index = static_cast<size_t>(labels[r].item<int64_t>());
    if (index != b.indices[static_cast<size_t>(r)] ||
        sums[r].item<int64_t>() != pattern_row_sum(index, bytes)) {
      ++wrong;
    }
  }
  return wrong;
}

bool event_done(cudaEvent_t e) {
  const cudaError_t err = cudaEventQuery(e);
  if (err == cudaErrorNotReady) return false;
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorName(err);
  return true;
}

// An event recorded on the current stream of cuda:0 now.
CudaEvent mark_current_stream() {
  CudaEvent e(0);
  EXPECT_EQ(cudaEventRecord(e.native_handle(), c10::cuda::getCurrentCUDAStream(0).stream()),
            cudaSuccess);
  return e;
}

}  // namespace

// How gtest prints the parameter (test names, ctest's list).
void PrintTo(CopyCompletion completion, std::ostream* os) {
  *os << (completion == CopyCompletion::kEventThread ? "kEventThread" : "kHostCallback");
}

namespace {

std::string completion_name(const ::testing::TestParamInfo<CopyCompletion>& info) {
  return info.param == CopyCompletion::kEventThread ? "EventThread" : "HostCallback";
}

class LoaderGpu : public ::testing::TestWithParam<CopyCompletion> {
 protected:
  void SetUp() override {
    const CudaStatus cuda = cuda_status();
    if (!cuda.usable()) GTEST_SKIP() << "no usable CUDA device: " << cuda.reason;
  }
  std::unique_ptr<CopyEngine> engine(c10::Device device = kCuda0) const {
    return make_cuda_copy_engine(device, GetParam());
  }
  static LoaderOptions options(size_t batch, size_t workers) {
    LoaderOptions o;
    o.batch_size = batch;
    o.workers = workers;
    o.device = kCuda0;
    o.timeout = 60s;  // a lost hand-back fails instead of hanging
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Completion, LoaderGpu,
                         ::testing::Values(CopyCompletion::kHostCallback,
                                           CopyCompletion::kEventThread),
                         completion_name);

// Wraps an engine: counts every hand-back, checks (where it may call CUDA: the event thread) that
// it comes after the slot's event, and keeps each copy's fence in start order.
class CheckedHandBacks final : public CopyEngine {
 public:
  struct Counts {
    std::atomic<int> started{0}, finished{0}, early{0};
    std::mutex mutex;
    std::vector<std::shared_ptr<const CopyFence>> fences;
  };
  // `may_query`: on_finished runs on the engine's event thread (not CUDA's callback thread, where
  // CUDA calls are forbidden). `throw_at`: that start's hand-back throws instead of handing back.
  CheckedHandBacks(std::unique_ptr<CopyEngine> inner, std::shared_ptr<Counts> counts,
                   bool may_query, int throw_at = -1, int64_t sleep_before_copy = 0)
      : inner_(std::move(inner)),
        counts_(std::move(counts)),
        may_query_(may_query),
        throw_at_(throw_at),
        sleep_(sleep_before_copy) {}
  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent* event, std::function<void()> on_finished) override {
    const int number = counts_->started++;
    if (sleep_ > 0) {  // holds this copy back on the engine's stream
      c10::cuda::CUDAStreamGuard guard(c10::cuda::CUDAStream(*inner_->stream()));
      at::cuda::sleep(sleep_);
    }
    cudaEvent_t slot_event = event != nullptr ? event->native_handle() : nullptr;
    DeviceCopy copy = inner_->start(
        host, on_device, event,
        [counts = counts_, slot_event, query = may_query_, fail = number == throw_at_,
         f = std::move(on_finished)] {
          if (query && (slot_event == nullptr || cudaEventQuery(slot_event) != cudaSuccess)) {
            counts->early++;
          }
          counts->finished++;
          if (fail) throw std::runtime_error("synthetic hand-back failure");
          f();
        });
    std::lock_guard<std::mutex> lock(counts_->mutex);
    counts_->fences.push_back(copy.fence);
    return copy;
  }
  c10::Device device() const override { return inner_->device(); }
  void check() override { inner_->check(); }
  std::optional<c10::Stream> stream() const override { return inner_->stream(); }

 private:
  std::unique_ptr<CopyEngine> inner_;
  std::shared_ptr<Counts> counts_;
  bool may_query_;
  int throw_at_;
  int64_t sleep_;
};

TEST_P(LoaderGpu, BatchesOnCudaEqualTheCpuResult) {
  LoaderOptions o = options(16, 4);
  DataLoader gpu(std::make_shared<IndexSource>(200), o, RandomSampler::make(9), engine());
  o.device = c10::Device(c10::DeviceType::CPU);
  DataLoader cpu(std::make_shared<IndexSource>(200), o, RandomSampler::make(9));
  EXPECT_TRUE(gpu.is_pinned());
  auto a = cpu.begin();
  auto b = gpu.begin();
  for (; a != cpu.end(); ++a, ++b) {
    ASSERT_NE(b, gpu.end());
    EXPECT_TRUE(b->fields[0].is_cuda());
    EXPECT_TRUE(at::equal(a->fields[0], b->fields[0].cpu()));
  }
  EXPECT_EQ(b, gpu.end());
}

// 128 MB batches, checked whole by a kernel queued on the consumer's stream the moment each batch
// is handed out: a copy the stream did not wait for would show as wrong sums (a check of the
// first bytes would not: a copy writes those first).
TEST_P(LoaderGpu, AWholeBatchOf128MBIsCompleteOnTheConsumerStreamAtOnce) {
  constexpr size_t kBytes = 1 << 20;
  DataLoader loader(std::make_shared<PatternSource>(128 * 6, kBytes), options(128, 4),
                    RandomSampler::make(3), engine());
  size_t batches = 0;
  for (Batch& b : loader) {
    ASSERT_EQ(b.images().nbytes(), 128 * kBytes);
    EXPECT_EQ(wrong_rows(b, kBytes), 0) << "batch " << batches;
    ++batches;
  }
  EXPECT_EQ(batches, 6u);
}

// The consumer's stream sleeps after each batch (a training step): the copies next() starts run
// on the side stream meanwhile, so next() returns before the sleep ends and a copy queued after
// the sleep began is done before the sleep ends. A copy on the consumer's stream, or one that
// waits for it (a synchronous copy, a blocking stream behind the legacy default stream), would
// finish only after the sleep. (The batch next() hands out was copied before the sleep was
// queued, so its own fence would be done first even then: the check is on the copies started
// during next(), which CheckedHandBacks records in start order.)
TEST_P(LoaderGpu, TheNextBatchIsCopiedWhileTheConsumerStreamIsBusy) {
  constexpr size_t kBytes = 1 << 20;
  LoaderOptions o = options(64, 4);
  o.prefetch_factor = 2;
  auto counts = std::make_shared<CheckedHandBacks::Counts>();
  DataLoader loader(std::make_shared<PatternSource>(64 * 8, kBytes), o, nullptr,
                    std::make_unique<CheckedHandBacks>(engine(), counts, false));
  const auto copies_started = [&] {
    std::lock_guard<std::mutex> lock(counts->mutex);
    return counts->fences.size();
  };
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  int checked = 0;
  for (int n = 1; n < 8; ++n) {
    // The workers have had the last step to fill the slots: next() below starts a copy.
    at::cuda::sleep(kAboutASecond / 2);  // the "training step" on the consumer's stream
    CudaEvent step_done = mark_current_stream();
    const size_t before = copies_started();
    batch.reset();
    batch = loader.next();
    ASSERT_TRUE(batch);
    EXPECT_FALSE(event_done(step_done.native_handle()))
        << "next() waited for the consumer's stream (batch " << n << ")";
    std::shared_ptr<const CopyFence> started_after_the_step;
    {
      std::lock_guard<std::mutex> lock(counts->mutex);
      if (counts->fences.size() > before) started_after_the_step = counts->fences.back();
    }
    if (started_after_the_step) {
      bool copy_first = false;
      while (!event_done(step_done.native_handle())) {
        if (started_after_the_step->done()) {
          copy_first = true;
          break;
        }
      }
      EXPECT_TRUE(copy_first) << "a copy queued during step " << n << " waited for the step";
      ++checked;
    }
    ASSERT_EQ(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(0).stream()), cudaSuccess);
    EXPECT_EQ(wrong_rows(*batch, kBytes), 0) << "batch " << n;
  }
  EXPECT_GE(checked, 4) << "too few steps started a copy to tell";
}

// A training loop that computes on its own stream calls record_stream(): that stream waits for
// the copy, and a batch dropped while a kernel there still reads it keeps its memory until the
// kernel is done, while later batches (same size: the allocator's first choice) keep arriving.
TEST_P(LoaderGpu, ABatchReadOnAnotherStreamIsSafeBeforeAndAfterItIsDropped) {
  constexpr size_t kBytes = 1 << 20;
  DataLoader loader(std::make_shared<PatternSource>(64 * 8, kBytes), options(64, 4),
                    RandomSampler::make(5), engine());
  const c10::cuda::CUDAStream compute = c10::cuda::getStreamFromPool(false, 0);
  std::vector<at::Tensor> sums;
  std::vector<std::vector<size_t>> indices;
  size_t n = 0;
  for (Batch& b : loader) {
    b.record_stream(compute.unwrap());
    c10::cuda::CUDAStreamGuard on_compute(compute);
    if (n % 2 == 1) at::cuda::sleep(kAboutASecond / 4);  // still reading when the batch is gone
    sums.push_back(at::sum(b.images(), {1}, /*keepdim=*/false, at::kLong));
    indices.push_back(b.indices);
    ++n;
  }  // each batch is dropped here, its checksum still queued on `compute`
  ASSERT_EQ(cudaStreamSynchronize(compute.stream()), cudaSuccess);
  ASSERT_EQ(n, 8u);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor s = sums[i].cpu();
    for (int64_t r = 0; r < s.size(0); ++r) {
      EXPECT_EQ(s[r].item<int64_t>(), pattern_row_sum(indices[i][static_cast<size_t>(r)], kBytes))
          << "batch " << i << " row " << r;
    }
  }
}

// The consumer's stream waits for the batch's copy: every copy here is held back about a second
// on the side stream (a sleep queued before it), so when next() returns the copy is still running.
// Work queued on the consumer's stream right after next() must finish after the copy: an event
// recorded there completes only once the batch's fence has, and a checksum queued there sees the
// whole batch. Without that wait, the event would complete at once, the fence a second later, and
// the checksum would read a batch not yet copied.
TEST_P(LoaderGpu, TheConsumerStreamWaitsForTheBatchsCopy) {
  constexpr size_t kBytes = 1 << 18;
  LoaderOptions o = options(16, 2);
  o.slots = 3;
  o.prefetch_factor = 1;
  auto counts = std::make_shared<CheckedHandBacks::Counts>();
  DataLoader loader(std::make_shared<PatternSource>(16 * 3, kBytes), o, nullptr,
                    std::make_unique<CheckedHandBacks>(engine(), counts, false, -1,
                                                       /*sleep_before_copy=*/kAboutASecond));
  size_t n = 0;
  for (Batch& b : loader) {
    const bool done_when_handed_out = b.copy_fence->done();
    CudaEvent consumer_done = mark_current_stream();
    // Bounded: the copy takes about a second; 60 s means the consumer's stream is stuck.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!event_done(consumer_done.native_handle()) &&
           std::chrono::steady_clock::now() < deadline) {
    }
    ASSERT_TRUE(event_done(consumer_done.native_handle())) << "batch " << n;
    EXPECT_TRUE(b.copy_fence->done())
        << "batch " << n << ": the consumer's stream ran ahead of the batch's copy";
    if (done_when_handed_out) std::printf("batch %zu: its copy was done when handed out\n", n);
    EXPECT_EQ(wrong_rows(b, kBytes), 0) << "batch " << n;
    ++n;
  }
  EXPECT_EQ(n, 3u);
}

// Few slots, slow copies, and a consumer that keeps the batches and checks them only at the end,
// so that it runs ahead and every slot is refilled as soon as it is handed back: a slot handed
// back before its copy finished would show as wrong bytes (and, on the event thread, as an early
// hand-back).
TEST_P(LoaderGpu, EachSlotIsHandedBackOnceAndOnlyAfterItsCopy) {
  constexpr size_t kBytes = 1 << 20;
  LoaderOptions o = options(32, 2);
  o.slots = 4;
  o.prefetch_factor = 2;
  auto counts = std::make_shared<CheckedHandBacks::Counts>();
  const bool on_event_thread = GetParam() == CopyCompletion::kEventThread;
  std::vector<Batch> batches;
  {
    DataLoader loader(std::make_shared<PatternSource>(32 * 24, kBytes), o, RandomSampler::make(4),
                      std::make_unique<CheckedHandBacks>(engine(), counts, on_event_thread));
    for (Batch& b : loader) batches.push_back(b);
  }
  EXPECT_EQ(counts->early.load(), 0);
  EXPECT_EQ(counts->finished.load(), counts->started.load());
  EXPECT_GE(counts->started.load(), 24);
  ASSERT_EQ(batches.size(), 24u);
  for (size_t n = 0; n < batches.size(); ++n) {
    EXPECT_EQ(wrong_rows(batches[n], kBytes), 0) << "batch " << n;
  }
}

// Breaking out of an epoch, starting another and destroying the loader with copies queued: every
// started copy is handed back exactly once, none early, and nothing hangs.
TEST_P(LoaderGpu, BreakingOutAndDestroyingMidEpochHandsEverySlotBackOnce) {
  LoaderOptions o = options(16, 3);
  const bool on_event_thread = GetParam() == CopyCompletion::kEventThread;
  auto source = std::make_shared<PatternSource>(16 * 40, 1 << 18);
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto counts = std::make_shared<CheckedHandBacks::Counts>();
    finishes_within(60s, "breaking out with copies queued", [&] {
      DataLoader loader(source, o, RandomSampler::make(static_cast<uint64_t>(attempt)),
                        std::make_unique<CheckedHandBacks>(engine(), counts, on_event_thread));
      size_t seen = 0;
      for (Batch& b : loader) {
        EXPECT_TRUE(b.images().is_cuda());
        if (++seen == static_cast<size_t>(2 + attempt)) break;  // copies still in flight
      }
      auto it = loader.begin();  // a second epoch, abandoned after one batch
      ASSERT_NE(it, loader.end());
    });
    EXPECT_EQ(counts->early.load(), 0) << "attempt " << attempt;
    EXPECT_EQ(counts->finished.load(), counts->started.load()) << "attempt " << attempt;
    EXPECT_GT(counts->started.load(), 0) << "attempt " << attempt;
  }
}

// A hand-back that throws loses its slot. It used to be printed and swallowed on CUDA's callback
// thread, and the loader then waited for the slot forever (no timeout here). Now the engine
// remembers it and the consumer gets the error.
TEST_P(LoaderGpu, AHandBackThatThrowsBecomesAnErrorNotAHang) {
  LoaderOptions o = options(8, 2);
  o.timeout.reset();
  o.slots = 3;
  o.prefetch_factor = 1;
  auto counts = std::make_shared<CheckedHandBacks::Counts>();
  DataLoader loader(std::make_shared<IndexSource>(400), o, nullptr,
                    std::make_unique<CheckedHandBacks>(engine(), counts, false, /*throw_at=*/3));
  std::string error;
  finishes_within(60s, "a hand-back that throws", [&] {
    try {
      for (int epoch = 0; epoch < 3; ++epoch) {
        for (Batch& b : loader) (void)b;
      }
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("could not hand a batch slot back"), std::string::npos) << error;
  EXPECT_NE(error.find("synthetic hand-back failure"), std::string::npos) << error;
}

// With no more slots than prefetch_factor, a slot is refilled and copied again while an earlier
// batch from it waits to be handed out. Each batch has its own fence, so the consumer waits for
// its own copy only: here every copy is held back about a second on the side stream, and the
// consumer's stream is done with batch n long before the last copy started has finished.
TEST_P(LoaderGpu, WithFewSlotsTheConsumerWaitsOnlyForItsOwnBatch) {
  LoaderOptions o = options(8, 2);
  o.slots = 2;
  o.prefetch_factor = 2;
  auto counts = std::make_shared<CheckedHandBacks::Counts>();
  DataLoader loader(std::make_shared<IndexSource>(8 * 5), o, nullptr,
                    std::make_unique<CheckedHandBacks>(engine(), counts, false, -1,
                                                       /*sleep_before_copy=*/kAboutASecond));
  size_t n = 0;
  for (Batch& b : loader) {
    CudaEvent consumer_done = mark_current_stream();
    std::shared_ptr<const CopyFence> latest;
    {
      std::lock_guard<std::mutex> lock(counts->mutex);
      latest = counts->fences.back();
    }
    if (latest != b.copy_fence) {  // a later copy is in flight
      bool consumer_first = false;
      while (!latest->done()) {
        if (event_done(consumer_done.native_handle())) {
          consumer_first = true;
          break;
        }
      }
      EXPECT_TRUE(consumer_first) << "batch " << n << " waited for a later copy";
    }
    ++n;
  }
  EXPECT_EQ(n, 5u);
}

TEST_P(LoaderGpu, TheCopyStreamIsTheEnginesOwn) {
  const std::unique_ptr<CopyEngine> a = engine();
  const std::unique_ptr<CopyEngine> b = engine();
  ASSERT_TRUE(a->stream() && b->stream());
  EXPECT_NE(*a->stream(), *b->stream());
  EXPECT_NE(*a->stream(), c10::cuda::getDefaultCUDAStream(0).unwrap());
  for (int i = 0; i < 2 * 64; ++i) {  // every pool stream, of both priorities, twice over
    const c10::Stream pool = c10::cuda::getStreamFromPool(i % 2 == 0, 0).unwrap();
    EXPECT_NE(pool, *a->stream());
    EXPECT_NE(pool, *b->stream());
  }
}

// --- The CUDA unit: errors that are not left pending, and their causes.

class CudaUnitGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaStatus cuda = cuda_status();
    if (!cuda.usable()) GTEST_SKIP() << "no usable CUDA device: " << cuda.reason;
  }
};

TEST_F(CudaUnitGpu, AFailedPinnedAllocationLeavesNoErrorPending) {
  try {
    HostBuffer huge(size_t{1} << 52, HostBuffer::Kind::kAuto, false, 0);  // 4 PiB
    ADD_FAILURE() << "pinned 4 PiB";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.name(), "cudaErrorMemoryAllocation") << e.what();
    EXPECT_NE(std::string(e.what()).find("cudaHostAlloc"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_NO_THROW((at::ones({16}, at::TensorOptions().device(kCuda0)) * 2).sum().item<float>());
}

// An error left pending by earlier, unrelated work is not the kernel's own: normalize_images
// succeeds and leaves it where it was. Everything torch launches (whose own launch check would
// read the pending error first) happens before the error is left: the input is made, and a first
// normalize_images call leaves its output's block in the caching allocator, so the call under
// test launches nothing but its own kernel.
TEST_F(CudaUnitGpu, NormalizeReportsItsOwnLaunchErrorNeverAnEarlierOne) {
  const at::Tensor images =
      at::zeros({2, 3, 8, 8}, at::TensorOptions().device(kCuda0).dtype(at::kByte));
  (void)normalize_images(images);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  void* p = nullptr;
  ASSERT_NE(cudaMalloc(&p, size_t{1} << 60), cudaSuccess);  // leaves cudaErrorMemoryAllocation
  EXPECT_NO_THROW(normalize_images(images));
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);  // still the earlier work's
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaUnitGpu, NormalizeOnTheGpuAgreesWithTheCpuForEveryDtypeAndLayout) {
  at::manual_seed(11);
  const at::Tensor chw = at::randint(0, 256, {4, 3, 37, 29}, at::kByte);
  for (c10::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const double tolerance = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 4e-3 : 3e-2;
    for (bool hwc : {false, true}) {
      for (bool channels_last : {false, true}) {
        NormalizeOptions o;
        o.dtype = dtype;
        o.hwc = hwc;
        o.channels_last = channels_last;
        const at::Tensor input = hwc ? chw.permute({0, 2, 3, 1}).contiguous() : chw;
        const at::Tensor cpu = normalize_images(input, o);
        const at::Tensor gpu = normalize_images(input.to(kCuda0), o);
        SCOPED_TRACE(std::string(c10::toString(dtype)) + (hwc ? " hwc" : " chw") +
                     (channels_last ? " channels_last" : ""));
        EXPECT_TRUE(gpu.is_cuda());
        EXPECT_EQ(gpu.scalar_type(), dtype);
        EXPECT_EQ(gpu.is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast
                                                  : at::MemoryFormat::Contiguous),
                  true);
        const double diff =
            (gpu.cpu().to(at::kDouble) - cpu.to(at::kDouble)).abs().max().item<double>();
        EXPECT_LE(diff, tolerance);
      }
    }
  }
}

// In a fresh process (a death-test child, re-executed): a loader on cuda:1 never opens a context
// on GPU 0 and leaves the current device as it was.
TEST_F(CudaUnitGpu, ALoaderOnCuda1LeavesTheCurrentDeviceAndGpu0Untouched) {
  if (cuda_status().devices < 2) GTEST_SKIP() << "needs two GPUs; this machine has one";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const bool gpu0_before = c10::cuda::hasPrimaryContext(0);
        const c10::DeviceIndex current_before = c10::cuda::current_device();
        LoaderOptions o;
        o.batch_size = 8;
        o.workers = 2;
        o.device = c10::Device("cuda:1");
        {
          DataLoader loader(std::make_shared<IndexSource>(64), o);
          for (Batch& b : loader) {
            if (b.fields[0].device() != o.device) std::_Exit(3);
          }
        }
        if (c10::cuda::current_device() != current_before) std::_Exit(4);
        if (!gpu0_before && c10::cuda::hasPrimaryContext(0)) std::_Exit(5);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// How a process ends after a sticky CUDA error: exit 0 once the loader raised (the child's own
// end), or torch's abort (std::terminate of the c10::AcceleratorError that torch's caching
// allocator throws from a tensor's destructor when a CUDA tensor is freed in a lost context, as in
// any PyTorch program). A wait that never ends is neither: the watchdog below exits with 7.
bool ended_after_a_sticky_error(int status) {
  return (WIFEXITED(status) && WEXITSTATUS(status) == 0) ||
         (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

// In a fresh process: a device-side assert (a sticky error: the context is lost) while batches
// are in flight makes the loader raise instead of waiting for slots that will never come back,
// or torch's allocator ends the process when the loader frees the previous batch's CUDA tensors
// (seen on an H200 with torch 2.11: operator++ destroying the batch it replaces); never a hang.
TEST_P(LoaderGpu, AStickyCudaErrorRaisesInsteadOfHanging) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CopyCompletion completion = GetParam();
  EXPECT_EXIT(
      {
        LoaderOptions o = options(16, 2);
        o.timeout.reset();  // the sticky error alone must end the wait
        auto ended = std::async(std::launch::async, [&] {
          DataLoader loader(std::make_shared<PatternSource>(16 * 50, 1 << 16), o, nullptr,
                            make_cuda_copy_engine(kCuda0, completion));
          auto it = loader.begin();
          const at::Tensor bad =
              at::full({1}, 1 << 30, at::TensorOptions().device(kCuda0).dtype(at::kLong));
          try {
            (void)it->images().index_select(0, bad).sum().item<int64_t>();  // device-side assert
          } catch (const std::exception&) {
          }
          try {
            while (it != loader.end()) ++it;
          } catch (const std::exception& e) {
            std::fprintf(stderr, "raised: %s\n", e.what());
            return;  // the loader is destroyed here, after the error: that must not hang either
          }
          std::fprintf(stderr, "the epoch ended without an error after the sticky one\n");
          std::_Exit(2);
        });
        if (ended.wait_for(60s) != std::future_status::ready) {
          std::fprintf(stderr, "watchdog: the loader still waits 60 s after a sticky CUDA error\n");
          std::_Exit(7);
        }
        std::_Exit(0);
      },
      ended_after_a_sticky_error, "raised: |device-side assert triggered");
}

}  // namespace
}  // namespace conveyor
