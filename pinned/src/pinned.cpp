#include "conveyor/pinned.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include <cuda_runtime_api.h>

namespace conveyor {
namespace {

constexpr size_t kFieldAlign = 256;
constexpr size_t kPageAlign = 4096;

size_t round_up(size_t n, size_t align) { return (n + align - 1) / align * align; }

std::string cuda_message(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

// Makes `device` current for the scope and restores the previous one (RAII over cudaSetDevice).
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~CurrentDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace

bool cuda_available() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return false;
  }
  return count > 0;
}

HostBuffer::HostBuffer(size_t bytes, Kind kind, bool write_combined) {
  size_t rounded = round_up(bytes == 0 ? 1 : bytes, kPageAlign);
  if (kind == Kind::kAuto && cuda_available()) {
    unsigned flags = cudaHostAllocPortable | (write_combined ? cudaHostAllocWriteCombined : 0u);
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, rounded, flags);
    if (err != cudaSuccess) {
      throw std::runtime_error("conveyor: cudaHostAlloc of " + std::to_string(rounded) +
                               " bytes failed (" + cuda_message(err) + ")");
    }
    data_ = static_cast<std::byte*>(p);
    pinned_ = true;
  } else {
    void* p = std::aligned_alloc(kPageAlign, rounded);
    if (p == nullptr) {
      throw std::runtime_error("conveyor: allocating " + std::to_string(rounded) +
                               " bytes of host memory failed");
    }
    data_ = static_cast<std::byte*>(p);
  }
  size_ = rounded;
  std::memset(data_, 0, size_);
}

HostBuffer::~HostBuffer() { reset(); }

void HostBuffer::reset() noexcept {
  if (data_ != nullptr) {
    if (pinned_) {
      cudaFreeHost(data_);
    } else {
      std::free(data_);
    }
  }
  data_ = nullptr;
  size_ = 0;
  pinned_ = false;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), pinned_(other.pinned_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.pinned_ = false;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_ = other.size_;
    pinned_ = other.pinned_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.pinned_ = false;
  }
  return *this;
}

const char* to_string(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "free";
    case SlotState::kFilling:
      return "filling";
    case SlotState::kReady:
      return "ready";
    case SlotState::kCopying:
      return "copying";
  }
  return "unknown";
}

namespace {
size_t layout_bytes(const SlotLayout& layout, std::vector<size_t>& offsets) {
  size_t offset = 0;
  for (size_t bytes : layout.field_bytes) {
    offsets.push_back(offset);
    offset += round_up(bytes == 0 ? 1 : bytes, kFieldAlign);
  }
  return round_up(offset == 0 ? kFieldAlign : offset, kFieldAlign);
}
}  // namespace

SlotRing::SlotRing(Options options)
    : field_bytes_(options.layout.field_bytes),
      slot_bytes_(layout_bytes(options.layout, offsets_)),
      slots_(options.slots),
      free_(options.slots) {
  if (options.slots == 0) throw std::invalid_argument("conveyor: SlotRing needs at least 1 slot");
  std::optional<CurrentDevice> device;
  if (options.memory == HostBuffer::Kind::kAuto && cuda_available())
    device.emplace(options.cuda_device);
  memory_ = HostBuffer(slot_bytes_ * options.slots, options.memory, options.write_combined);
  if (memory_.is_pinned()) {
    for (auto& slot : slots_) {
      cudaEvent_t event = nullptr;
      cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (err != cudaSuccess) {
        for (auto& s : slots_) {
          if (s.event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(s.event));
        }
        throw std::runtime_error("conveyor: cudaEventCreate failed (" + cuda_message(err) + ")");
      }
      slot.event = event;
    }
  }
  for (uint32_t i = 0; i < slots_.size(); ++i) push_free(i);
}

SlotRing::~SlotRing() {
  close();
  for (auto& slot : slots_) {
    if (slot.event != nullptr) {
      // A copy may still read this slot: wait for it before the memory goes away.
      cudaEventSynchronize(static_cast<cudaEvent_t>(slot.event));
      cudaEventDestroy(static_cast<cudaEvent_t>(slot.event));
    }
  }
}

std::byte* SlotRing::field(uint32_t slot, size_t field) const {
  return memory_.data() + static_cast<size_t>(slot) * slot_bytes_ + offsets_[field];
}

void SlotRing::push_free(uint32_t slot) {
  // The queue was sized for every slot at construction, so push never allocates or fails.
  free_.bounded_push(slot);
  free_count_.release();
}

std::optional<uint32_t> SlotRing::pop_free() {
  uint32_t slot = 0;
  if (!free_.pop(slot)) {
    // A permit always matches a queued index (push before release), so this cannot happen.
    throw std::logic_error("conveyor: SlotRing free queue out of step with its count");
  }
  transition(slot, SlotState::kFree, SlotState::kFilling);
  return slot;
}

std::optional<uint32_t> SlotRing::acquire() {
  if (closed()) return std::nullopt;
  free_count_.acquire();
  if (closed()) {
    free_count_.release();  // pass the wake-up on to the next waiter
    return std::nullopt;
  }
  return pop_free();
}

std::optional<uint32_t> SlotRing::try_acquire_for(std::chrono::milliseconds timeout) {
  if (closed()) return std::nullopt;
  if (!free_count_.try_acquire_for(timeout)) return std::nullopt;
  if (closed()) {
    free_count_.release();
    return std::nullopt;
  }
  return pop_free();
}

std::optional<uint32_t> SlotRing::try_acquire() {
  if (closed() || !free_count_.try_acquire()) return std::nullopt;
  if (closed()) {  // the permit may be one of close()'s wake-ups: pass it on
    free_count_.release();
    return std::nullopt;
  }
  return pop_free();
}

void SlotRing::transition(uint32_t slot, SlotState from, SlotState to) {
  if (slot >= slots_.size()) throw std::logic_error("conveyor: slot index out of range");
  SlotState expected = from;
  if (!slots_[slot].state.compare_exchange_strong(expected, to, std::memory_order_acq_rel)) {
    throw std::logic_error(std::string("conveyor: slot ") + std::to_string(slot) + " is " +
                           to_string(expected) + ", expected " + to_string(from) +
                           " for a move to " + to_string(to));
  }
}

void SlotRing::mark_ready(uint32_t slot) {
  transition(slot, SlotState::kFilling, SlotState::kReady);
}

void SlotRing::release(uint32_t slot) {
  if (slot >= slots_.size()) throw std::logic_error("conveyor: slot index out of range");
  SlotState expected = SlotState::kReady;
  if (!slots_[slot].state.compare_exchange_strong(expected, SlotState::kFree)) {
    transition(slot, SlotState::kFilling, SlotState::kFree);
  }
  push_free(slot);
}

void* SlotRing::begin_copy(uint32_t slot) {
  transition(slot, SlotState::kReady, SlotState::kCopying);
  return slots_[slot].event;
}

void SlotRing::copy_finished(uint32_t slot) {
  transition(slot, SlotState::kCopying, SlotState::kFree);
  push_free(slot);
}

SlotState SlotRing::state(uint32_t slot) const {
  return slots_.at(slot).state.load(std::memory_order_acquire);
}

std::vector<size_t> SlotRing::count_states() const {
  std::vector<size_t> counts(4, 0);
  for (const auto& slot : slots_) ++counts[static_cast<size_t>(slot.state.load())];
  return counts;
}

void SlotRing::close() {
  if (closed_.exchange(true)) return;
  // Wake every possible waiter; each passes the permit on when it sees the ring closed.
  free_count_.release(static_cast<std::ptrdiff_t>(slots_.size()) + 1);
}

}  // namespace conveyor
