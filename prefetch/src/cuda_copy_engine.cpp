// The CUDA copy stage (conveyor/prefetch.h): an owned side stream, per-batch fences from a pool of
// events, and the two ways of handing a slot back (a host function, or the engine's event thread).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "conveyor/cuda.h"
#include "conveyor/internal/cuda_check.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"

namespace conveyor {
namespace {

using detail::check_cuda;

std::string device_name(int device) { return "cuda:" + std::to_string(device); }

// Events for the batches' fences, reused: a fence takes one and gives it back when the last
// holder of the batch lets go. Shared by the engine and every fence, so it outlives both.
// Invariant: every event in `spare_` belongs to `device_`, has `sync_`, and no fence holds it.
class EventPool {
 public:
  EventPool(int device, EventSync sync) : device_(device), sync_(sync) {}
  CudaEvent take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!spare_.empty()) {
        CudaEvent event = std::move(spare_.back());
        spare_.pop_back();
        return event;
      }
    }
    return CudaEvent(device_, sync_);
  }
  void give_back(CudaEvent event) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      spare_.push_back(std::move(event));
    } catch (...) {  // no room to keep it: the event is destroyed instead
    }
  }

 private:
  const int device_;
  const EventSync sync_;
  std::mutex mutex_;
  std::vector<CudaEvent> spare_;
};

// One batch's fence: an event recorded on the copy stream after the batch's copies.
class CudaCopyFence final : public CopyFence {
 public:
  CudaCopyFence(std::shared_ptr<EventPool> pool, int device)
      : pool_(std::move(pool)), event_(pool_->take()), device_(device) {}
  ~CudaCopyFence() override { pool_->give_back(std::move(event_)); }
  CudaCopyFence(const CudaCopyFence&) = delete;
  CudaCopyFence& operator=(const CudaCopyFence&) = delete;

  // Called once, by the engine, after the copies are queued on `stream`.
  void record(cudaStream_t stream) {
    check_cuda(cudaEventRecord(event_.native_handle(), stream), "recording a batch's copy fence");
  }
  // Waits on the host (the event thread).
  cudaError_t synchronize() const { return cudaEventSynchronize(event_.native_handle()); }

  void use_on(c10::Stream stream, const std::vector<at::Tensor>& tensors) const override {
    if (!stream.device().is_cuda()) {
      throw std::invalid_argument("conveyor: a batch on " + device_name(device_) +
                                  " cannot be ordered before work on a " + stream.device().str() +
                                  " stream");
    }
    const c10::cuda::CUDAStream cuda(stream);
    detail::DeviceGuard guard(cuda.device_index());
    check_cuda(cudaStreamWaitEvent(cuda.stream(), event_.native_handle(), 0),
               "making a stream on " + stream.device().str() + " wait for a batch's copy");
    for (const at::Tensor& t : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), cuda);
    }
  }
  c10::Stream current_stream() const override {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).unwrap();
  }
  bool done() const override {
    detail::DeviceGuard guard(device_);
    const cudaError_t err = cudaEventQuery(event_.native_handle());
    if (err == cudaErrorNotReady) return false;
    check_cuda(err, "querying a batch's copy fence");
    return true;
  }

 private:
  std::shared_ptr<EventPool> pool_;
  CudaEvent event_;
  int device_;
};

// The first hand-back that failed, or CUDA error that stopped one: check() reports it from then
// on, because its slot may never come back.
class HandBackFailure {
 public:
  // Runs `hand_back`; anything it throws is remembered, never propagated (it runs on a thread
  // of CUDA's or of the engine, where nothing could catch it).
  void run(std::function<void()>& hand_back) noexcept {
    try {
      hand_back();
    } catch (...) {
      remember(std::current_exception());
    }
  }
  void remember(std::exception_ptr error) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!first_) first_ = std::move(error);
    failed_.store(true, std::memory_order_release);
  }
  void rethrow() const {
    if (!failed_.load(std::memory_order_acquire)) return;
    std::exception_ptr first;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      first = first_;
    }
    std::string cause;
    try {
      std::rethrow_exception(first);
    } catch (const std::exception& e) {
      cause = e.what();
    } catch (...) {
      cause = "an exception not derived from std::exception";
    }
    throw std::runtime_error(
        "conveyor: the copy stage could not hand a batch slot back, so the slot is lost and the "
        "loader cannot go on: " +
        cause);
  }

 private:
  mutable std::mutex mutex_;
  std::exception_ptr first_;
  std::atomic<bool> failed_{false};
};

// What a host function on the stream runs: the hand-back, reporting to the engine's record.
// Invariant: the engine outlives every payload it queued (its destructor synchronizes the stream,
// which runs the queued host functions first).
struct HostCallbackPayload {
  std::function<void()> hand_back;
  HandBackFailure* failure;
};

void CUDART_CB run_hand_back(void* payload) {
  std::unique_ptr<HostCallbackPayload> p(static_cast<HostCallbackPayload*>(payload));
  p->failure->run(p->hand_back);
}

// The copy stage's common part: the owned side stream, the copies into fresh device tensors, the
// slot's event and the batch's fence. How a finished copy hands its slot back is the subclass's.
class CudaCopyEngine : public CopyEngine {
 public:
  CudaCopyEngine(c10::Device device, EventSync fence_sync)
      : device_(device),
        stream_(create_stream(device)),
        fences_(std::make_shared<EventPool>(device.index(), fence_sync)) {}

  ~CudaCopyEngine() override {
    // Outstanding copies read slot memory and their hand-backs touch the ring: wait for both,
    // then destroy the stream (tensors allocated on it may live on: the allocator copes).
    try {
      detail::DeviceGuard guard(device_.index());
      if (cudaStreamSynchronize(stream_.stream()) != cudaSuccess) (void)cudaGetLastError();
      if (cudaStreamDestroy(stream_.stream()) != cudaSuccess) (void)cudaGetLastError();
    } catch (...) {  // the device is gone (a sticky error): nothing runs on it any more
    }
  }

  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent* slot_event, std::function<void()> on_finished) override {
    DeviceCopy copy;
    std::shared_ptr<CudaCopyFence> fence;
    std::optional<c10::cuda::CUDAStreamGuard> stream_guard;  // also makes the device current
    try {
      check_device_rows(host, on_device, device_);
      stream_guard.emplace(stream_);  // allocations belong to the side stream
      fence = std::make_shared<CudaCopyFence>(fences_, device_.index());
      copy.tensors.reserve(host.size());
      for (const auto& h : host) {
        copy.tensors.push_back(
            at::empty(h.sizes(), h.options().device(device_).pinned_memory(false)));
      }
      // From the host only the rows not decoded on the device.
      for (const HostRows& run : host_rows(host, on_device)) {
        const at::Tensor& h = host[run.field];
        const size_t row_bytes =
            h.dim() == 0 ? h.nbytes() : h.nbytes() / static_cast<size_t>(h.size(0));
        const size_t offset = static_cast<size_t>(run.first_row) * row_bytes;
        check_cuda(
            cudaMemcpyAsync(static_cast<std::byte*>(copy.tensors[run.field].data_ptr()) + offset,
                            static_cast<const std::byte*>(h.data_ptr()) + offset,
                            static_cast<size_t>(run.rows) * row_bytes, cudaMemcpyHostToDevice,
                            stream_.stream()),
            "cudaMemcpyAsync of a batch to " + device_.str());
      }
      // Rows decoded on the device, device to device.
      for (const DeviceRows& rows : on_device) {
        const at::Tensor& d = copy.tensors[rows.field];
        const size_t row_bytes = d.nbytes() / static_cast<size_t>(d.size(0));
        check_cuda(cudaMemcpyAsync(static_cast<std::byte*>(d.data_ptr()) +
                                       static_cast<size_t>(rows.first_row) * row_bytes,
                                   rows.rows.data_ptr(), rows.rows.nbytes(),
                                   cudaMemcpyDeviceToDevice, stream_.stream()),
                   "cudaMemcpyAsync of GPU-decoded rows on " + device_.str());
      }
      if (slot_event != nullptr && *slot_event) {
        check_cuda(cudaEventRecord(slot_event->native_handle(), stream_.stream()),
                   "recording the slot's event");
      }
      fence->record(stream_.stream());
    } catch (...) {
      // Copies already queued may still read the slot: let them finish, then hand it back.
      finish_now(on_finished);
      throw;
    }
    copy.fence = fence;
    // Owns on_finished from here on: runs it once the copies are done, also when it throws.
    hand_back_when_done(std::move(on_finished), std::move(fence));
    return copy;
  }

  c10::Device device() const override { return device_; }
  std::optional<c10::Stream> stream() const override { return stream_.unwrap(); }

  void check() override {
    failure_.rethrow();
    detail::DeviceGuard guard(device_.index());
    const cudaError_t err = cudaStreamQuery(stream_.stream());
    if (err != cudaSuccess && err != cudaErrorNotReady) check_cuda(err, "the copy stream");
  }

 protected:
  // Runs `on_finished` once the work queued so far on the stream is done. If it throws, it has
  // run on_finished first (after the stream's work finished).
  virtual void hand_back_when_done(std::function<void()> on_finished,
                                   std::shared_ptr<CudaCopyFence> fence) = 0;

  // The hand-back of a copy that could not be queued whole: after the stream's work is done.
  void finish_now(std::function<void()>& on_finished) noexcept {
    if (cudaStreamSynchronize(stream_.stream()) != cudaSuccess) (void)cudaGetLastError();
    failure_.run(on_finished);
  }

  c10::Device device_;
  c10::cuda::CUDAStream stream_;
  std::shared_ptr<EventPool> fences_;
  HandBackFailure failure_;

 private:
  static c10::cuda::CUDAStream create_stream(c10::Device device) {
    detail::DeviceGuard guard(device.index());
    cudaStream_t raw = nullptr;
    // Non-blocking: the copies never wait for work on the legacy default stream.
    check_cuda(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking),
               "creating the copy stream on " + device.str());
    return c10::cuda::getStreamFromExternal(raw, device.index());
  }
};

// CopyCompletion::kHostCallback.
class HostCallbackCopyEngine final : public CudaCopyEngine {
 public:
  explicit HostCallbackCopyEngine(c10::Device device) : CudaCopyEngine(device, EventSync::kSpin) {}

 private:
  void hand_back_when_done(std::function<void()> on_finished,
                           std::shared_ptr<CudaCopyFence>) override {
    std::unique_ptr<HostCallbackPayload> payload;
    try {
      payload = std::make_unique<HostCallbackPayload>(HostCallbackPayload{{}, &failure_});
    } catch (...) {  // the allocation failed before on_finished was moved
      finish_now(on_finished);
      throw;
    }
    payload->hand_back = std::move(on_finished);
    const cudaError_t err = cudaLaunchHostFunc(stream_.stream(), run_hand_back, payload.get());
    if (err != cudaSuccess) {
      finish_now(payload->hand_back);
      check_cuda(err, "cudaLaunchHostFunc");
    }
    payload.release();  // owned by the host function from here on
  }
};

// CopyCompletion::kEventThread: one thread waits for the batches' fences (blocking-sync events) in
// issue order and runs the hand-backs.
// Invariants: `pending_` holds the batches whose hand-back has not run, in issue order, each with
// its recorded fence; the thread exits only once `stopping_` is set and `pending_` is empty.
class EventThreadCopyEngine final : public CudaCopyEngine {
 public:
  explicit EventThreadCopyEngine(c10::Device device)
      : CudaCopyEngine(device, EventSync::kBlocking), waiter_([this] { wait_in_order(); }) {}

  ~EventThreadCopyEngine() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    waiter_.join();  // after every pending hand-back has run
  }

 private:
  struct Pending {
    std::shared_ptr<CudaCopyFence> fence;
    std::function<void()> on_finished;
  };

  void hand_back_when_done(std::function<void()> on_finished,
                           std::shared_ptr<CudaCopyFence> fence) override {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(Pending{std::move(fence), {}});
      pending_.back().on_finished = std::move(on_finished);  // moved only once the push held
    } catch (...) {
      finish_now(on_finished);
      throw;
    }
    wake_.notify_one();
  }

  void wait_in_order() {
    try {  // this thread's CUDA calls all use the engine's device: it stays current
      check_cuda(c10::cuda::SetDevice(device_.index()), "making " + device_.str() + " current");
    } catch (...) {
      failure_.remember(std::current_exception());  // its waits then fail, and say so
    }
    // This thread's event waits must not invalidate a CUDA graph the user captures meanwhile on
    // another thread (the default, global mode, forbids that); it never captures itself.
    const detail::ThreadLocalCaptureMode capture_mode;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      Pending next = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      cudaError_t err = next.fence->synchronize();
      if (err != cudaSuccess) {
        // The slot goes back only once nothing can read it: the stream has finished (the copy
        // with it), or the stream itself has failed (a sticky error: the context is lost).
        (void)cudaGetLastError();
        const cudaError_t stream_err = cudaStreamSynchronize(stream_.stream());
        if (stream_err != cudaSuccess) (void)cudaGetLastError();
        try {
          check_cuda(err, "waiting for a batch's copy");
        } catch (...) {
          failure_.remember(std::current_exception());
        }
      }
      failure_.run(next.on_finished);
      next = Pending{};  // the fence and the hand-back's captures are released outside the lock
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  bool stopping_ = false;
  std::thread waiter_;  // last: started once the members above exist
};

}  // namespace

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
