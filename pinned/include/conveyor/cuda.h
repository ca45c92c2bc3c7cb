// conveyor/cuda.h: the CUDA devices Conveyor uses: whether one is usable (and if not, why),
// which device a request means, CUDA's errors as exceptions, and owned CUDA events, streams and
// device memory.
//
// What it is for: one place for every rule of the CUDA path that a user can see. The loader,
// the slot ring and the copy stage all go through it, so a device is resolved, an error is
// reported and a device is made current in one way only.
//
// cuda_status(): how many CUDA devices the process can use, and when none, the CUDA runtime's
// own reason (its error's name and text: no driver, a driver too old for this runtime, no
// device). cuda_available() is cuda_status().usable().
//
// resolve_device(): the device a request means. The CPU stays the CPU; "cuda" means torch's
// current CUDA device (c10::cuda::current_device(), as torch.device("cuda") does); "cuda:N" must
// be one of the devices this process sees. Anything else is refused with std::invalid_argument
// naming the device and what is missing (with cuda_status()'s reason when no device is usable).
// When each process sees one GPU (SLURM, or CUDA_VISIBLE_DEVICES per rank), that GPU is cuda:0.
//
// CudaError: a failed CUDA runtime call, with the call's context, the error's name and code.
// Conveyor clears a recoverable (non-sticky) error before throwing, so it is not reported again
// by the next unrelated CUDA call (torch's, say); a sticky error stays, as CUDA keeps it.
//
// CudaEvent: one CUDA event on a given device, owned: created by the constructor, destroyed by
// the destructor (on its own device), moved but never copied. A default-constructed CudaEvent
// holds no event. Timing is always disabled (events here only order work); EventSync::kBlocking
// makes a host thread waiting on it sleep instead of spinning.
//
// CudaStream: one CUDA stream on a given device, owned like a CudaEvent. It is non-blocking
// (cudaStreamNonBlocking): its work never waits for the legacy default stream.
//
// DeviceBuffer: one block of device memory (cudaMalloc) on a given device, owned like a
// CudaEvent; its contents are not initialized. The pinned host counterpart is HostBuffer
// (conveyor/pinned.h).
//
// Requires: a CUDA-capable build of LibTorch (the same CUDA runtime as torch's).
// Guarantees: no function here makes a device current for longer than its own call, and none
// creates a CUDA context on a device other than the one it was asked to use: the previous device
// is restored by c10's rule (only where its context is already active), so a process that uses
// cuda:1 never opens a context on GPU 0. This header compiles as C++17 and includes no CUDA
// header.
// Thread safety: every free function may be called from any thread. A CudaEvent, CudaStream or
// DeviceBuffer is not synchronized: one owner at a time, as for any value.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include <c10/core/Device.h>

// The CUDA runtime's event and stream types are `CUevent_st*` (cudaEvent_t) and `CUstream_st*`
// (cudaStream_t); declared here so that this header needs no CUDA header.
struct CUevent_st;
struct CUstream_st;

namespace conveyor {

// Whether the process can use a CUDA device.
struct CudaStatus {
  int devices = 0;     // CUDA devices this process sees (0 when none is usable)
  std::string reason;  // why none is usable, in the CUDA runtime's words; empty when usable
  bool usable() const { return devices > 0; }
};
CudaStatus cuda_status();
// True when the process can use at least one CUDA device (a driver and a GPU are present).
bool cuda_available();

// The device that `device` means here (see the header comment). Throws std::invalid_argument.
c10::Device resolve_device(c10::Device device);

// The device a process of a multi-process job (torchrun, SLURM) trains on, from its LOCAL_RANK:
// cuda:LOCAL_RANK where the process sees more GPUs than its local rank (all of the node's);
// cuda:0 where it sees exactly one (each rank given its own GPU, through CUDA_VISIBLE_DEVICES or
// SLURM's GPU binding); the CPU where no CUDA device is usable. Throws std::invalid_argument
// naming LOCAL_RANK, the GPUs seen and CUDA_VISIBLE_DEVICES otherwise.
c10::Device device_for_local_rank(int64_t local_rank);

// A CUDA runtime call failed. what() reads "conveyor: WHAT failed (cudaErrorName: text)".
class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& what, int code, std::string name);
  // The cudaError_t value, and its name (e.g. "cudaErrorMemoryAllocation").
  int code() const { return code_; }
  const std::string& name() const { return name_; }

 private:
  int code_;
  std::string name_;
};

// How a host thread waits for a CudaEvent (cudaEventSynchronize).
enum class EventSync {
  kSpin,      // busy-waits: the lowest latency (CUDA's default)
  kBlocking,  // sleeps until the event completes (cudaEventBlockingSync): frees the core
};

// An owned CUDA event, created with cudaEventDisableTiming on one device.
class CudaEvent {
 public:
  // Holds no event; native_handle() is nullptr.
  CudaEvent() noexcept = default;
  // Creates an event on `cuda_device` (made current for the call, then restored by c10's rule).
  // Throws CudaError naming the device when the event cannot be created.
  explicit CudaEvent(int cuda_device, EventSync sync = EventSync::kSpin);
  // Destroys the event on its device. Work already recorded on it is unaffected (CUDA releases
  // the event once that work completes); callers that must outlive the work wait for it first.
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // The cudaEvent_t, or nullptr when this holds no event. Still owned by this object.
  CUevent_st* native_handle() const noexcept { return event_; }
  explicit operator bool() const noexcept { return event_ != nullptr; }
  // The device the event belongs to; -1 when this holds no event.
  int device() const noexcept { return device_; }

 private:
  void reset() noexcept;
  CUevent_st* event_ = nullptr;
  int device_ = -1;
};

// An owned, non-blocking CUDA stream on one device.
class CudaStream {
 public:
  // Holds no stream; native_handle() is nullptr.
  CudaStream() noexcept = default;
  // Creates a stream on `cuda_device` (made current for the call, then restored). Throws CudaError
  // naming the device when the stream cannot be created.
  explicit CudaStream(int cuda_device);
  // Destroys the stream on its device. Work queued on it still completes (CUDA releases the
  // stream once it has); callers whose memory that work uses wait for it first (synchronize()).
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  // Waits on the host until the work queued so far has finished. Throws CudaError (naming the
  // device) when that work failed; a no-op when this holds no stream.
  void synchronize() const;

  // The cudaStream_t, or nullptr when this holds no stream. Still owned by this object.
  CUstream_st* native_handle() const noexcept { return stream_; }
  explicit operator bool() const noexcept { return stream_ != nullptr; }
  // The device the stream belongs to; -1 when this holds no stream.
  int device() const noexcept { return device_; }

 private:
  void reset() noexcept;
  CUstream_st* stream_ = nullptr;
  int device_ = -1;
};

// Owned device memory on one device (cudaMalloc), uninitialized.
class DeviceBuffer {
 public:
  // Holds no memory; data() is nullptr and size() 0.
  DeviceBuffer() noexcept = default;
  // Allocates `bytes` (at least 1) on `cuda_device`. Throws CudaError naming the size and the
  // device when the allocation fails (the error is cleared: no later CUDA call reports it).
  DeviceBuffer(size_t bytes, int cuda_device);
  // Frees the memory on its device. cudaFree waits for the device's work, so callers free only
  // where a device-wide wait is acceptable (never mid-epoch on a hot path).
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }
  // The device the memory belongs to; -1 when this holds none.
  int device() const noexcept { return device_; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
};

}  // namespace conveyor
