// SlotRing, HostBuffer and the CUDA unit's owned types (CudaEvent, CudaStream, DeviceBuffer): the
// slot state machine, blocking and closing, bounded memory, moves and empty states, errors without
// a GPU. On a GPU (suites named *Gpu*): the device guard never trusts torch's stale record of the
// current device, and an engine thread's capture mode leaves a graph captured elsewhere intact.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAFunctions.h>

#include "conveyor/internal/cuda_check.h"
#include "conveyor/pinned.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;

SlotRing::Options two_fields(size_t slots) {
  SlotRing::Options o;
  o.slots = slots;
  o.layout.field_bytes = {1000, 24};
  return o;
}

TEST(HostBuffer, AllocatesZeroedAlignedMemoryAndSaysWhetherItIsPinned) {
  HostBuffer b(10000);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_GE(b.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
  EXPECT_EQ(b.is_pinned(), cuda_available());
  for (size_t i = 0; i < b.size(); i += 997) EXPECT_EQ(b.data()[i], std::byte{0});
  HostBuffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
  HostBuffer pageable(100, HostBuffer::Kind::kPageable);
  EXPECT_FALSE(pageable.is_pinned());
}

TEST(SlotRing, FieldsAreDisjointAlignedAndTheSizeIsFixed) {
  SlotRing ring(two_fields(3));
  EXPECT_EQ(ring.slots(), 3u);
  EXPECT_GE(ring.bytes(), ring.slots() * ring.slot_bytes());
  EXPECT_LT(ring.bytes(), ring.slots() * ring.slot_bytes() + 4096);  // page rounding only
  EXPECT_GE(ring.bytes(), 3u * (1000 + 24));
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ring.field(s, 0)) % 256, 0u);
    EXPECT_GE(ring.field(s, 1) - ring.field(s, 0), 1000);
    if (s > 0) {
      EXPECT_GE(ring.field(s, 0) - ring.field(s - 1, 1), 24);
    }
  }
}

TEST(SlotRing, StatesFollowTheLifecycleAndIllegalMovesThrow) {
  SlotRing ring(two_fields(2));
  auto a = ring.try_acquire();
  ASSERT_TRUE(a);
  EXPECT_EQ(ring.state(*a), SlotState::kFilling);
  EXPECT_THROW(ring.begin_copy(*a), std::logic_error);  // not ready yet
  ring.mark_ready(*a);
  EXPECT_EQ(ring.state(*a), SlotState::kReady);
  ring.begin_copy(*a);
  EXPECT_EQ(ring.state(*a), SlotState::kCopying);
  EXPECT_THROW(ring.release(*a), std::logic_error);  // a copy may still read it
  auto b = ring.try_acquire();
  ASSERT_TRUE(b);
  EXPECT_FALSE(ring.try_acquire()) << "both slots are taken";
  ring.copy_finished(*a);
  EXPECT_EQ(ring.state(*a), SlotState::kFree);
  auto c = ring.try_acquire();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, *a);
  auto counts = ring.count_states();
  EXPECT_EQ(counts[static_cast<size_t>(SlotState::kFilling)], 2u);
}

TEST(SlotRing, AcquireBlocksUntilASlotIsFreedAndCloseWakesWaiters) {
  SlotRing ring(two_fields(1));
  auto only = ring.acquire();
  ASSERT_TRUE(only);
  EXPECT_FALSE(ring.try_acquire_for(20ms));
  std::optional<uint32_t> got;
  std::thread waiter([&] { got = ring.acquire(); });
  std::this_thread::sleep_for(20ms);
  ring.release(*only);
  waiter.join();
  ASSERT_TRUE(got);
  std::thread closed_waiter([&] { got = ring.acquire(); });
  std::this_thread::sleep_for(20ms);
  ring.close();
  closed_waiter.join();
  EXPECT_FALSE(got);
  EXPECT_FALSE(ring.acquire());
}

TEST(SlotRing, ManyThreadsNeverShareASlot) {
  SlotRing ring(two_fields(4));
  std::atomic<int> owners[4] = {};
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto s = ring.acquire();
        if (owners[*s].fetch_add(1) != 0) violations++;
        owners[*s].fetch_sub(1);
        ring.release(*s);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(ring.count_states()[static_cast<size_t>(SlotState::kFree)], 4u);
}

TEST(SlotRing, APageableRingHasNoEventsSoBeginCopyReturnsNull) {
  SlotRing::Options o = two_fields(2);
  o.memory = HostBuffer::Kind::kPageable;
  SlotRing ring(o);
  EXPECT_FALSE(ring.is_pinned());
  for (int round = 0; round < 3; ++round) {  // every slot, and again after reuse
    auto s = ring.try_acquire();
    ASSERT_TRUE(s);
    ring.mark_ready(*s);
    EXPECT_EQ(ring.begin_copy(*s), nullptr);
    EXPECT_EQ(ring.state(*s), SlotState::kCopying);
    ring.copy_finished(*s);
  }
}

TEST(SlotRing, APinnedRingHandsOutOneDistinctLiveEventPerSlot) {
  if (!cuda_available()) GTEST_SKIP() << "no usable CUDA device: the ring is pageable";
  SlotRing ring(two_fields(3));
  ASSERT_TRUE(ring.is_pinned());
  std::vector<CudaEvent*> events;
  for (int i = 0; i < 3; ++i) {
    auto s = ring.try_acquire();
    ASSERT_TRUE(s);
    ring.mark_ready(*s);
    CudaEvent* event = ring.begin_copy(*s);
    ASSERT_NE(event, nullptr);
    ASSERT_NE(event->native_handle(), nullptr);
    EXPECT_EQ(cudaEventRecord(event->native_handle(), nullptr), cudaSuccess);
    events.push_back(event);
  }
  EXPECT_NE(events[0]->native_handle(), events[1]->native_handle());
  EXPECT_NE(events[1]->native_handle(), events[2]->native_handle());
  EXPECT_NE(events[0]->native_handle(), events[2]->native_handle());
}

TEST(CudaEvent, IsMoveOnly) {
  static_assert(!std::is_copy_constructible_v<CudaEvent>, "an event has one owner");
  static_assert(!std::is_copy_assignable_v<CudaEvent>, "an event has one owner");
  static_assert(std::is_nothrow_move_constructible_v<CudaEvent>, "moves never throw");
  static_assert(std::is_nothrow_move_assignable_v<CudaEvent>, "moves never throw");
  static_assert(std::is_nothrow_default_constructible_v<CudaEvent>, "an empty event is free");
  static_assert(
      std::is_same_v<decltype(std::declval<const CudaEvent&>().native_handle()), cudaEvent_t>,
      "native_handle() is the runtime's cudaEvent_t");
  SUCCEED();
}

TEST(CudaEvent, DefaultConstructedHoldsNoEvent) {
  CudaEvent empty;
  EXPECT_EQ(empty.native_handle(), nullptr);
  EXPECT_FALSE(empty);
  CudaEvent moved = std::move(empty);  // moving nothing is fine, and so is destroying it
  EXPECT_EQ(moved.native_handle(), nullptr);
  moved = CudaEvent();
  EXPECT_FALSE(moved);
}

TEST(CudaEvent, WithoutAGpuCreatingOneThrowsNamingTheDevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is usable here";
  try {
    CudaEvent event(0);
    FAIL() << "created an event without a usable CUDA device";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

// Resident host memory of this process, in bytes (Linux).
size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

TEST(CudaEvent, CreatesUsableEventsAndDestroysThemWithoutLeaking) {
  if (!cuda_available()) GTEST_SKIP() << "no usable CUDA device to create events on";
  {
    CudaEvent event(0);
    ASSERT_TRUE(event);
    ASSERT_EQ(cudaEventRecord(event.native_handle(), nullptr), cudaSuccess);
    ASSERT_EQ(cudaEventSynchronize(event.native_handle()), cudaSuccess);
    cudaEvent_t handle = event.native_handle();
    CudaEvent owner = std::move(event);  // ownership moves, the event stays the same
    EXPECT_EQ(owner.native_handle(), handle);
    EXPECT_EQ(event.native_handle(), nullptr);
    CudaEvent other(0);
    owner = std::move(other);  // destroys the first event, takes the second
    EXPECT_NE(owner.native_handle(), nullptr);
    EXPECT_EQ(other.native_handle(), nullptr);
  }
  // Warm up the runtime's own pools, then churn: a destructor that leaked would grow the process
  // (each event costs host memory in the driver) and the device's allocations.
  for (int i = 0; i < 1000; ++i) CudaEvent warm(0);
  const size_t rss_before = resident_bytes();
  size_t device_free_before = 0, device_free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&device_free_before, &total), cudaSuccess);
  for (int i = 0; i < 200000; ++i) {
    CudaEvent event(0);
    ASSERT_TRUE(event);
  }
  ASSERT_EQ(cudaMemGetInfo(&device_free_after, &total), cudaSuccess);
  const size_t rss_after = resident_bytes();
  EXPECT_LT(rss_after, rss_before + (8u << 20))
      << "host memory grew by " << (rss_after - rss_before) << " bytes";
  EXPECT_GE(device_free_after + (8u << 20), device_free_before);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// --- CudaStream and DeviceBuffer: owned like CudaEvent.

TEST(CudaStream, IsMoveOnlyAndAnEmptyOneIsFree) {
  static_assert(!std::is_copy_constructible_v<CudaStream> && !std::is_copy_assignable_v<CudaStream>,
                "a stream has one owner");
  static_assert(std::is_nothrow_move_constructible_v<CudaStream> &&
                    std::is_nothrow_move_assignable_v<CudaStream>,
                "moves never throw");
  static_assert(
      std::is_same_v<decltype(std::declval<const CudaStream&>().native_handle()), cudaStream_t>,
      "native_handle() is the runtime's cudaStream_t");
  CudaStream empty;
  EXPECT_FALSE(empty);
  EXPECT_EQ(empty.native_handle(), nullptr);
  EXPECT_EQ(empty.device(), -1);
  EXPECT_NO_THROW(empty.synchronize());  // nothing to wait for
  CudaStream moved = std::move(empty);
  EXPECT_FALSE(moved);
  moved = CudaStream();
  EXPECT_FALSE(moved);
}

TEST(DeviceBuffer, IsMoveOnlyAndAnEmptyOneIsFree) {
  static_assert(
      !std::is_copy_constructible_v<DeviceBuffer> && !std::is_copy_assignable_v<DeviceBuffer>,
      "device memory has one owner");
  static_assert(std::is_nothrow_move_constructible_v<DeviceBuffer> &&
                    std::is_nothrow_move_assignable_v<DeviceBuffer>,
                "moves never throw");
  DeviceBuffer empty;
  EXPECT_FALSE(empty);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.device(), -1);
  DeviceBuffer moved = std::move(empty);
  EXPECT_FALSE(moved);
  moved = DeviceBuffer();
  EXPECT_EQ(moved.size(), 0u);
}

TEST(CudaStream, WithoutAGpuCreatingOneOrDeviceMemoryThrowsNamingTheDevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is usable here";
  try {
    CudaStream stream(0);
    FAIL() << "created a stream without a usable CUDA device";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  try {
    DeviceBuffer buffer(4096, 0);
    FAIL() << "allocated device memory without a usable CUDA device";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

// Without a driver the runtime's own error (e.g. cudaErrorInsufficientDriver) is permanent: the
// guard neither throws nor adds to it, and the thread goes on to fail its CUDA calls on its own.
TEST(ThreadLocalCaptureMode, WithoutAGpuItNeitherThrowsNorChangesThePendingError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is usable here";
  const cudaError_t before = cudaPeekAtLastError();
  EXPECT_NO_THROW({ const detail::ThreadLocalCaptureMode mode; });
  EXPECT_EQ(cudaPeekAtLastError(), before);
}

class CudaUnitTypesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaStatus cuda = cuda_status();
    if (!cuda.usable()) GTEST_SKIP() << "no usable CUDA device: " << cuda.reason;
  }
};

TEST_F(CudaUnitTypesGpu, StreamsAndDeviceBuffersBelongToTheirDeviceAndMoveTheirOwnership) {
  CudaStream stream(0);
  ASSERT_TRUE(stream);
  EXPECT_EQ(stream.device(), 0);
  DeviceBuffer buffer(1 << 20, 0);
  ASSERT_TRUE(buffer);
  EXPECT_EQ(buffer.size(), size_t{1} << 20);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer.data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);
  // A round trip through the buffer on the stream.
  std::vector<uint8_t> in(buffer.size()), out(buffer.size(), 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 13);
  ASSERT_EQ(cudaMemcpyAsync(buffer.data(), in.data(), in.size(), cudaMemcpyHostToDevice,
                            stream.native_handle()),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), buffer.data(), out.size(), cudaMemcpyDeviceToHost,
                            stream.native_handle()),
            cudaSuccess);
  stream.synchronize();
  EXPECT_EQ(in, out);
  void* data = buffer.data();
  cudaStream_t handle = stream.native_handle();
  DeviceBuffer owner = std::move(buffer);
  CudaStream stream_owner = std::move(stream);
  EXPECT_EQ(owner.data(), data);
  EXPECT_EQ(stream_owner.native_handle(), handle);
  EXPECT_FALSE(buffer);
  EXPECT_FALSE(stream);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaUnitTypesGpu, AFailedDeviceAllocationNamesItsSizeAndLeavesNoErrorPending) {
  try {
    DeviceBuffer huge(size_t{1} << 52, 0);  // 4 PiB
    ADD_FAILURE() << "allocated 4 PiB";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.name(), "cudaErrorMemoryAllocation") << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(size_t{1} << 52)), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
}

// In a fresh process (no context on GPU 0): work on cuda:1 leaves torch's record of the current
// device at cuda:0 while cuda:1 stays current (c10's MaybeSetDevice, so that GPU 0 gets no
// context). A guard for cuda:0 must still switch: everything made under it belongs to GPU 0.
TEST_F(CudaUnitTypesGpu, AGuardSwitchesDevicesEvenWhenTorchsRecordSaysItIsCurrent) {
  if (cuda_status().devices < 2) GTEST_SKIP() << "needs two GPUs; this machine has one";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        { const CudaEvent on_gpu1(1); }
        int actual = -1;
        (void)cudaGetDevice(&actual);
        std::fprintf(stderr, "after cuda:1, the current device is %d, torch records %d\n", actual,
                     static_cast<int>(c10::cuda::current_device()));
        int inside = -1;
        {
          const detail::DeviceGuard guard(0);
          (void)cudaGetDevice(&inside);
        }
        const DeviceBuffer buffer(4096, 0);
        cudaPointerAttributes attributes{};
        (void)cudaPointerGetAttributes(&attributes, buffer.data());
        std::fprintf(stderr, "the guard for cuda:0 made %d current; the buffer is on %d\n", inside,
                     attributes.device);
        std::exit(inside == 0 && attributes.device == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "the guard for cuda:0 made 0 current");
}

// The same path on one GPU, in a fresh process: torch records cuda:0 lazily (no context yet), and
// a guard for cuda:0 makes it current for real and leaves torch's view as it was.
TEST_F(CudaUnitTypesGpu, AGuardMakesItsDeviceCurrentForRealAndRestoresTorchsView) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        (void)c10::cuda::MaybeSetDevice(0);  // recorded only where GPU 0 has no context yet
        int inside = -1;
        {
          const detail::DeviceGuard guard(0);
          (void)cudaGetDevice(&inside);
          const CudaStream stream(0);  // made under the guard: cuda:0's context exists now
        }
        const bool context = c10::cuda::hasPrimaryContext(0);
        const int recorded = c10::cuda::current_device();
        std::fprintf(stderr, "current %d under the guard, context on 0: %d, torch records %d\n",
                     inside, context ? 1 : 0, recorded);
        std::exit(inside == 0 && context && recorded == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "current 0 under the guard");
}

// A thread of the engine (ThreadLocalCaptureMode) may cudaMalloc and synchronize while the
// training thread captures a CUDA graph in the default, global mode: the capture is not broken.
// Without the guard the same calls fail with cudaErrorStreamCaptureUnsupported and invalidate
// the capture (checked too, so that the test shows what the guard prevents).
TEST_F(CudaUnitTypesGpu, AnEngineThreadsCudaCallsLeaveAGraphCapturedElsewhereIntact) {
  CudaStream capture(0);
  DeviceBuffer data(4096, 0);
  for (const bool guarded : {true, false}) {
    SCOPED_TRACE(guarded ? "the thread holds ThreadLocalCaptureMode" : "global mode");
    ASSERT_EQ(cudaStreamBeginCapture(capture.native_handle(), cudaStreamCaptureModeGlobal),
              cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(data.data(), 1, data.size(), capture.native_handle()), cudaSuccess);
    cudaError_t malloc_result = cudaSuccess;
    std::thread engine([&] {
      std::optional<detail::ThreadLocalCaptureMode> mode;
      if (guarded) mode.emplace();
      void* p = nullptr;
      malloc_result = cudaMalloc(&p, 1 << 20);
      if (malloc_result == cudaSuccess) (void)cudaFree(p);
      (void)cudaGetLastError();
    });
    engine.join();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(capture.native_handle(), &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (guarded) {
      EXPECT_EQ(malloc_result, cudaSuccess) << cudaGetErrorName(malloc_result);
      EXPECT_EQ(ended, cudaSuccess) << cudaGetErrorName(ended);
    } else {
      EXPECT_TRUE(malloc_result != cudaSuccess || ended != cudaSuccess)
          << "global mode no longer forbids cudaMalloc during another thread's capture";
    }
  }
  // The guard restores the thread's previous mode.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  {
    const detail::ThreadLocalCaptureMode guard;
    cudaStreamCaptureMode inside = cudaStreamCaptureModeGlobal;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&inside), cudaSuccess);
    EXPECT_EQ(inside, cudaStreamCaptureModeThreadLocal);
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&inside), cudaSuccess);  // put it back
  }
  cudaStreamCaptureMode after = cudaStreamCaptureModeGlobal;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&after), cudaSuccess);
  EXPECT_EQ(after, cudaStreamCaptureModeRelaxed);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);  // the test's own mode
}

}  // namespace
}  // namespace conveyor
