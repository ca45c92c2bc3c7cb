#include <cstdio>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"

namespace conveyor {
namespace {

void throw_if_failed(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("conveyor: ") + what + " failed (" +
                             cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + ")");
  }
}

// The callback's payload travels through the C API as a raw pointer; ownership is taken back
// inside the callback.
void CUDART_CB run_finished(void* payload) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(payload));
  try {
    (*fn)();
  } catch (const std::exception& e) {  // nothing can propagate out of a CUDA callback
    std::fprintf(stderr, "conveyor: copy-finished callback failed: %s\n", e.what());
  }
}

class CudaCopyEngine final : public CopyEngine {
 public:
  explicit CudaCopyEngine(c10::Device device)
      : device_(device),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  ~CudaCopyEngine() override {
    // Outstanding copies read slot memory and their callbacks touch the ring: wait for both.
    cudaStreamSynchronize(stream_.stream());
  }

  std::vector<at::Tensor> start(const std::vector<at::Tensor>& host, CudaEvent* event,
                                std::function<void()> on_finished) override {
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::CUDAStreamGuard stream_guard(stream_);  // allocations belong to the side stream
    std::vector<at::Tensor> device;
    device.reserve(host.size());
    auto payload = std::make_unique<std::function<void()>>(std::move(on_finished));
    try {
      for (const auto& h : host) {
        at::Tensor d = at::empty(h.sizes(), h.options().device(device_).pinned_memory(false));
        throw_if_failed(cudaMemcpyAsync(d.data_ptr(), h.data_ptr(), h.nbytes(),
                                        cudaMemcpyHostToDevice, stream_.stream()),
                        "cudaMemcpyAsync");
        device.push_back(std::move(d));
      }
      if (event != nullptr && *event) {
        throw_if_failed(cudaEventRecord(event->native_handle(), stream_.stream()),
                        "cudaEventRecord");
      }
      throw_if_failed(cudaLaunchHostFunc(stream_.stream(), run_finished, payload.get()),
                      "cudaLaunchHostFunc");
    } catch (...) {
      // Copies already queued may still read the slot: let them finish, then hand it back.
      cudaStreamSynchronize(stream_.stream());
      (*payload)();
      throw;
    }
    payload.release();  // owned by the callback from here on
    return device;
  }

  void make_visible(std::vector<at::Tensor>& device, CudaEvent* event) override {
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::CUDAStream consumer = c10::cuda::getCurrentCUDAStream(device_.index());
    if (consumer != stream_) {
      if (event != nullptr && *event) {
        throw_if_failed(cudaStreamWaitEvent(consumer.stream(), event->native_handle(), 0),
                        "cudaStreamWaitEvent");
      } else {
        throw_if_failed(cudaStreamSynchronize(stream_.stream()), "cudaStreamSynchronize");
      }
      for (auto& t : device) {
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), consumer);
      }
    }
  }

  c10::Device device() const override { return device_; }

  void check() override {
    cudaError_t err = cudaStreamQuery(stream_.stream());
    if (err != cudaSuccess && err != cudaErrorNotReady) {
      throw_if_failed(err, "the copy stream");
    }
  }

 private:
  c10::Device device_;
  c10::cuda::CUDAStream stream_;
};

}  // namespace

c10::Device resolve_device(c10::Device device) {
  if (device.is_cpu()) return device;
  if (!device.is_cuda()) {
    throw std::invalid_argument("conveyor: device " + device.str() +
                                " is not supported (batches go to the cpu or a cuda device)");
  }
  if (!cuda_available()) {
    throw std::invalid_argument("conveyor: device " + device.str() +
                                " was requested but no CUDA device is usable on this machine");
  }
  int count = 0;
  throw_if_failed(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  const int index = device.has_index() ? device.index() : 0;
  if (index >= count) {
    throw std::invalid_argument("conveyor: device " + device.str() + " was requested but only " +
                                std::to_string(count) + " CUDA device(s) exist");
  }
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

std::unique_ptr<CopyEngine> make_cuda_copy_engine(c10::Device device) {
  if (!device.is_cuda()) {
    throw std::invalid_argument("conveyor: the copy engine needs a CUDA device, got " +
                                device.str());
  }
  return std::make_unique<CudaCopyEngine>(resolve_device(device));
}

}  // namespace conveyor
