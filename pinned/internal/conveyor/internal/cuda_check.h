// conveyor/internal/cuda_check.h (build-only, never installed): the CUDA unit's machinery that
// Conveyor's own sources share: the check of a runtime call, the device guard and the
// stream-capture mode of the engine's threads. (The rule for launching a kernel is
// kernel_launch.h's.)
//
// check_cuda(err, what) / CONVEYOR_CUDA_CHECK(call): throws CudaError (conveyor/cuda.h) carrying
// the error's name and code and what was being done, after clearing the error where it is
// recoverable (cudaGetLastError), so that the next, unrelated CUDA call does not report it again.
// A sticky error (the context is lost) cannot be cleared and stays, as CUDA keeps it.
//
// DeviceGuard: makes a device current for its scope and restores the previous one, as c10's own
// CUDAGuard does (c10::cuda::ExchangeDevice, then MaybeSetDevice). Entering compares the device
// asked for with the thread's *actual* current device (cudaGetDevice), never with torch's lazily
// recorded one: after work on cuda:1, torch may record cuda:0 as current (MaybeSetDevice, when
// GPU 0 has no context yet) while cuda:1 stays current, and a guard for cuda:0 that trusted the
// record would leave its allocations, events and streams on GPU 1. Leaving restores torch's view
// of the previous device by c10's rule: it is made current again only where its primary context
// is already active; otherwise only torch's record is restored. Since CUDA 12 cudaSetDevice
// creates the device's context, so restoring with it would open a context on GPU 0 in every
// process that uses another GPU.
//
// ThreadLocalCaptureMode: for its scope, the thread's stream-capture mode is
// cudaStreamCaptureModeThreadLocal (cudaThreadExchangeStreamCaptureMode), and the previous mode
// is restored after. In the default, global mode, a call such as cudaMalloc, cudaFree or a
// synchronization made on any thread while another thread captures a CUDA graph fails and
// invalidates that capture. Every engine thread that calls CUDA (the copy stage's event thread,
// GPU decode's threads) holds one for its whole life, so a user's graph capture on the training
// thread is never broken by the loader. Such a thread never captures itself.
//
// Thread safety: all are per-thread (the current device and the capture mode are a thread's own).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "conveyor/cuda.h"

namespace conveyor::detail {

// "cudaErrorName: text" for an error code.
std::string cuda_error_text(cudaError_t err);

// Throws CudaError("conveyor: " + what + " failed (...)") unless err is cudaSuccess.
void check_cuda(cudaError_t err, const std::string& what);

class DeviceGuard {
 public:
  // Makes `device` current (creating its context if needed). Throws CudaError.
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

class ThreadLocalCaptureMode {
 public:
  ThreadLocalCaptureMode() noexcept;
  ~ThreadLocalCaptureMode();
  ThreadLocalCaptureMode(const ThreadLocalCaptureMode&) = delete;
  ThreadLocalCaptureMode& operator=(const ThreadLocalCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeGlobal;
  bool exchanged_ = false;  // false: the runtime refused (no driver); nothing to restore
};

}  // namespace conveyor::detail

// Checks a CUDA runtime call, naming the call itself.
#define CONVEYOR_CUDA_CHECK(call) ::conveyor::detail::check_cuda((call), #call)
