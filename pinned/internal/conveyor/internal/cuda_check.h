// conveyor/internal/cuda_check.h (build-only, never installed): the CUDA unit's machinery that
// Conveyor's own sources share: the check of a runtime call and the device guard.
//
// check_cuda(err, what) / CONVEYOR_CUDA_CHECK(call): throws CudaError (conveyor/cuda.h) carrying
// the error's name and code and what was being done, after clearing the error where it is
// recoverable (cudaGetLastError), so that the next, unrelated CUDA call does not report it again.
// A sticky error (the context is lost) cannot be cleared and stays, as CUDA keeps it.
//
// DeviceGuard: makes a device current for its scope and restores the previous one by c10's rule
// (c10::cuda::MaybeSetDevice): the previous device is made current again only when its primary
// context is already active; otherwise only torch's record of the current device is restored.
// Since CUDA 12 cudaSetDevice creates the device's context, so restoring with it would open a
// context on GPU 0 in every process that uses another GPU.
//
// Thread safety: both are per-thread (the current device is a thread's own).
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

}  // namespace conveyor::detail

// Checks a CUDA runtime call, naming the call itself.
#define CONVEYOR_CUDA_CHECK(call) ::conveyor::detail::check_cuda((call), #call)
