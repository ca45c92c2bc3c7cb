#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

// The copy stage's common part: the side stream, the copies into fresh device tensors, the slot's
// event and the consumer's wait. How a finished copy hands its slot back is the subclass's.
class CudaCopyEngine : public CopyEngine {
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
    } catch (...) {
      // Copies already queued may still read the slot: let them finish, then hand it back.
      cudaStreamSynchronize(stream_.stream());
      on_finished();
      throw;
    }
    // Owns on_finished from here on: runs it once the copies are done, also when it throws.
    hand_back_when_done(std::move(on_finished));
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

 protected:
  // Runs `on_finished` once the work queued so far on the stream is done. If it throws, it has
  // run on_finished first (after the stream's work finished).
  virtual void hand_back_when_done(std::function<void()> on_finished) = 0;

  c10::Device device_;
  c10::cuda::CUDAStream stream_;
};

// CopyCompletion::kHostCallback.
class HostCallbackCopyEngine final : public CudaCopyEngine {
 public:
  using CudaCopyEngine::CudaCopyEngine;

 private:
  void hand_back_when_done(std::function<void()> on_finished) override {
    std::unique_ptr<std::function<void()>> payload;
    try {
      payload = std::make_unique<std::function<void()>>(std::move(on_finished));
    } catch (...) {  // the allocation failed before on_finished was moved
      cudaStreamSynchronize(stream_.stream());
      on_finished();
      throw;
    }
    const cudaError_t err = cudaLaunchHostFunc(stream_.stream(), run_finished, payload.get());
    if (err != cudaSuccess) {
      cudaStreamSynchronize(stream_.stream());
      (*payload)();
      throw_if_failed(err, "cudaLaunchHostFunc");
    }
    payload.release();  // owned by the callback from here on
  }
};

// CopyCompletion::kEventThread: each batch records an event of the engine's own after its
// copies; one thread waits for them in issue order and runs the hand-backs.
// Invariants: `pending_` holds the batches whose hand-back has not run, in issue order, each with
// a recorded event; an event is either in `pending_`, being waited on by the thread, or in
// `spare_`. The thread exits only once `stopping_` is set and `pending_` is empty.
class EventThreadCopyEngine final : public CudaCopyEngine {
 public:
  explicit EventThreadCopyEngine(c10::Device device)
      : CudaCopyEngine(device), waiter_([this] { wait_in_order(); }) {}

  ~EventThreadCopyEngine() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    waiter_.join();  // after every pending hand-back has run
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  }

  void check() override {
    CudaCopyEngine::check();
    std::lock_guard<std::mutex> lock(mutex_);
    throw_if_failed(failure_, "waiting for a copy");
  }

 private:
  struct Pending {
    cudaEvent_t event;
    std::function<void()> on_finished;
  };

  void hand_back_when_done(std::function<void()> on_finished) override {
    cudaEvent_t event = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!spare_.empty()) {
        event = spare_.back();
        spare_.pop_back();
      }
    }
    cudaError_t err = cudaSuccess;
    if (event == nullptr) {
      // Blocking sync: the waiting thread sleeps instead of spinning on a core the workers use.
      err = cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming);
      if (err != cudaSuccess) event = nullptr;
    }
    if (err == cudaSuccess) err = cudaEventRecord(event, stream_.stream());
    if (err != cudaSuccess) {
      if (event != nullptr) {
        std::lock_guard<std::mutex> lock(mutex_);
        spare_.push_back(event);
      }
      cudaStreamSynchronize(stream_.stream());
      on_finished();
      throw_if_failed(err, "recording the copy's event");
    }
    Pending pending{event, std::move(on_finished)};
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(std::move(pending));  // unchanged if it throws
    } catch (...) {
      cudaStreamSynchronize(stream_.stream());
      pending.on_finished();
      try {
        std::lock_guard<std::mutex> lock(mutex_);
        spare_.push_back(event);
      } catch (...) {
        cudaEventDestroy(event);
      }
      throw;
    }
    wake_.notify_one();
  }

  void wait_in_order() {
    (void)cudaSetDevice(device_.index());  // the events belong to this device
    // This thread's event waits must not invalidate a CUDA graph the user captures meanwhile on
    // another thread (the default, global mode, forbids that); it never captures itself.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      cudaEvent_t event = pending_.front().event;
      std::function<void()> on_finished = std::move(pending_.front().on_finished);
      pending_.pop_front();
      lock.unlock();
      cudaError_t err = cudaEventSynchronize(event);
      if (err != cudaSuccess) {
        // The slot goes back only once nothing can read it: the stream has finished (the copy
        // with it), or the stream itself has failed (a sticky error: the context is lost).
        err = cudaStreamSynchronize(stream_.stream());
      }
      try {
        on_finished();
      } catch (...) {  // the contract says it does not throw; say so if it did
        std::fprintf(stderr, "conveyor: copy-finished hand-back threw\n");
      }
      on_finished = nullptr;  // its captures are released outside the lock
      lock.lock();
      spare_.push_back(event);
      if (err != cudaSuccess && failure_ == cudaSuccess) failure_ = err;
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_;
  bool stopping_ = false;
  cudaError_t failure_ = cudaSuccess;
  std::thread waiter_;  // last: started once the members above exist
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

std::unique_ptr<CopyEngine> make_cuda_copy_engine(c10::Device device, CopyCompletion completion) {
  if (!device.is_cuda()) {
    throw std::invalid_argument("conveyor: the copy engine needs a CUDA device, got " +
                                device.str());
  }
  const c10::Device resolved = resolve_device(device);
  if (completion == CopyCompletion::kEventThread) {
    return std::make_unique<EventThreadCopyEngine>(resolved);
  }
  return std::make_unique<HostCallbackCopyEngine>(resolved);
}

}  // namespace conveyor
