// The CUDA unit (conveyor/cuda.h, conveyor/internal/cuda_check.h): device status and resolution,
// CudaError and its check, the device guard, the engine threads' capture mode, and owned events,
// streams and device memory.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <c10/cuda/CUDAFunctions.h>

#include "conveyor/cuda.h"
#include "conveyor/internal/cuda_check.h"

namespace conveyor {

static_assert(std::is_same_v<cudaEvent_t, CUevent_st*>,
              "cuda.h declares CudaEvent's handle as CUevent_st*, which must be cudaEvent_t");
static_assert(std::is_same_v<cudaStream_t, CUstream_st*>,
              "cuda.h declares CudaStream's handle as CUstream_st*, which must be cudaStream_t");

namespace detail {

std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

void check_cuda(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return;
  // Clears the error where it is recoverable; a sticky one stays (CUDA keeps it).
  (void)cudaGetLastError();
  throw CudaError("conveyor: " + what + " failed (" + cuda_error_text(err) + ")",
                  static_cast<int>(err), cudaGetErrorName(err));
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  const std::string name = "cuda:" + std::to_string(device);
  // Torch's view of the current device (its lazily recorded one, if any): what leaving restores.
  c10::DeviceIndex previous = -1;
  check_cuda(c10::cuda::GetDevice(&previous), "reading the current device before using " + name);
  previous_ = previous;
  // c10's ExchangeDevice: SetDevice clears torch's record and compares with the actual current
  // device (cudaGetDevice), so a stale record never skips a needed switch.
  check_cuda(c10::cuda::SetDevice(static_cast<c10::DeviceIndex>(device_)),
             "making " + name + " current");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ < 0 || previous_ == device_) return;
  try {
    // c10's rule: cudaSetDevice only where the previous device's context is already active;
    // otherwise torch's record of the current device is restored without creating a context.
    if (c10::cuda::MaybeSetDevice(static_cast<c10::DeviceIndex>(previous_)) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  } catch (...) {  // c10 could not tell (no torch CUDA hooks): leave the device rather than
  }                // open a context on the previous one
}

ThreadLocalCaptureMode::ThreadLocalCaptureMode() noexcept {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  if (cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess) {
    previous_ = mode;
    exchanged_ = true;
  } else {
    (void)cudaGetLastError();  // no driver: this thread's later CUDA calls fail on their own
  }
}

ThreadLocalCaptureMode::~ThreadLocalCaptureMode() {
  if (!exchanged_) return;
  cudaStreamCaptureMode mode = previous_;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace detail

CudaError::CudaError(const std::string& what, int code, std::string name)
    : std::runtime_error(what), code_(code), name_(std::move(name)) {}

CudaStatus cuda_status() {
  CudaStatus status;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // "no driver" / "no device" is not sticky: clear it
    status.reason = detail::cuda_error_text(err);
    return status;
  }
  if (count == 0) {
    status.reason = "the CUDA runtime reports 0 devices";
    return status;
  }
  status.devices = count;
  return status;
}

bool cuda_available() { return cuda_status().usable(); }

c10::Device resolve_device(c10::Device device) {
  if (device.is_cpu()) return device;
  if (!device.is_cuda()) {
    throw std::invalid_argument("conveyor: device " + device.str() +
                                " is not supported (batches go to the cpu or a cuda device)");
  }
  const CudaStatus status = cuda_status();
  if (!status.usable()) {
    throw std::invalid_argument("conveyor: device " + device.str() +
                                " was requested but no CUDA device is usable on this machine (" +
                                status.reason + ")");
  }
  // "cuda" is torch's current device, as torch.device("cuda") is.
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  if (index >= status.devices) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw std::invalid_argument(
        "conveyor: device " + device.str() + " was requested but this process sees only " +
        std::to_string(status.devices) +
        " CUDA device(s), cuda:0 to cuda:" + std::to_string(status.devices - 1) +
        (visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "") +
        "; where each process is given one GPU, that GPU is cuda:0");
  }
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

c10::Device device_for_local_rank(int64_t local_rank) {
  if (local_rank < 0) {
    throw std::invalid_argument("conveyor: LOCAL_RANK must not be negative, got " +
                                std::to_string(local_rank));
  }
  const CudaStatus status = cuda_status();
  if (!status.usable()) return c10::Device(c10::DeviceType::CPU);
  if (local_rank < status.devices) {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(local_rank));
  }
  if (status.devices == 1) return c10::Device(c10::DeviceType::CUDA, 0);  // one GPU per rank
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  throw std::invalid_argument(
      "conveyor: LOCAL_RANK " + std::to_string(local_rank) + " has no GPU of its own: this " +
      "process sees " + std::to_string(status.devices) + " CUDA devices" +
      (visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "") +
      "; give each rank one GPU, or run at most that many ranks per node");
}

CudaEvent::CudaEvent(int cuda_device, EventSync sync) {
  const std::string name = "cuda:" + std::to_string(cuda_device);
  detail::DeviceGuard guard(cuda_device);
  const unsigned flags =
      cudaEventDisableTiming | (sync == EventSync::kBlocking ? cudaEventBlockingSync : 0u);
  cudaEvent_t event = nullptr;
  detail::check_cuda(cudaEventCreateWithFlags(&event, flags), "cudaEventCreate on " + name);
  event_ = event;
  device_ = cuda_device;
}

CudaEvent::~CudaEvent() { reset(); }

void CudaEvent::reset() noexcept {
  if (event_ != nullptr) {
    try {
      detail::DeviceGuard guard(device_);
      if (cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
    } catch (...) {  // the device is gone (a sticky error): CUDA frees the event with its context
    }
  }
  event_ = nullptr;
  device_ = -1;
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(std::exchange(other.device_, -1)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

CudaStream::CudaStream(int cuda_device) {
  const std::string name = "cuda:" + std::to_string(cuda_device);
  detail::DeviceGuard guard(cuda_device);
  cudaStream_t stream = nullptr;
  detail::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                     "creating a stream on " + name);
  stream_ = stream;
  device_ = cuda_device;
}

CudaStream::~CudaStream() { reset(); }

void CudaStream::synchronize() const {
  if (stream_ == nullptr) return;
  detail::check_cuda(cudaStreamSynchronize(stream_),
                     "waiting for a stream on cuda:" + std::to_string(device_));
}

void CudaStream::reset() noexcept {
  if (stream_ != nullptr) {
    try {
      detail::DeviceGuard guard(device_);
      if (cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
    } catch (...) {  // the device is gone (a sticky error): nothing runs on it any more
    }
  }
  stream_ = nullptr;
  device_ = -1;
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(std::exchange(other.device_, -1)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

DeviceBuffer::DeviceBuffer(size_t bytes, int cuda_device) {
  const size_t size = bytes == 0 ? 1 : bytes;
  detail::DeviceGuard guard(cuda_device);
  void* data = nullptr;
  detail::check_cuda(cudaMalloc(&data, size), "cudaMalloc of " + std::to_string(size) +
                                                  " bytes on cuda:" + std::to_string(cuda_device));
  data_ = data;
  size_ = size;
  device_ = cuda_device;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() noexcept {
  if (data_ != nullptr) {
    try {
      detail::DeviceGuard guard(device_);
      if (cudaFree(data_) != cudaSuccess) (void)cudaGetLastError();
    } catch (...) {  // the device is gone (a sticky error): the memory goes with its context
    }
  }
  data_ = nullptr;
  size_ = 0;
  device_ = -1;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

}  // namespace conveyor
