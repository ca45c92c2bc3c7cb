#include "conveyor/pinned.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include "conveyor/internal/cuda_check.h"
#include "conveyor/internal/index_queue.h"

namespace conveyor {
namespace {

constexpr size_t kFieldAlign = 256;
constexpr size_t kPageAlign = 4096;

size_t round_up(size_t n, size_t align) { return (n + align - 1) / align * align; }

}  // namespace

HostBuffer::HostBuffer(size_t bytes, Kind kind, bool write_combined,
                       std::optional<int> cuda_device) {
  size_t rounded = round_up(bytes == 0 ? 1 : bytes, kPageAlign);
  if (kind == Kind::kAuto && cuda_available()) {
    const int device = cuda_device ? *cuda_device : c10::cuda::current_device();
    detail::DeviceGuard guard(device);
    unsigned flags = cudaHostAllocPortable | (write_combined ? cudaHostAllocWriteCombined : 0u);
    void* p = nullptr;
    detail::check_cuda(
        cudaHostAlloc(&p, rounded, flags),
        "cudaHostAlloc of " + std::to_string(rounded) + " bytes on cuda:" + std::to_string(device));
    data_ = static_cast<std::byte*>(p);
    pinned_ = true;
    device_ = device;
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
      try {
        detail::DeviceGuard guard(device_);  // freed through the context that pinned it
        if (cudaFreeHost(data_) != cudaSuccess) (void)cudaGetLastError();
      } catch (...) {  // the device is gone (a sticky error): the memory goes with its context
      }
    } else {
      std::free(data_);
    }
  }
  data_ = nullptr;
  size_ = 0;
  pinned_ = false;
  device_ = -1;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      pinned_(std::exchange(other.pinned_, false)),
      device_(std::exchange(other.device_, -1)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    pinned_ = std::exchange(other.pinned_, false);
    device_ = std::exchange(other.device_, -1);
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

// The ring's machinery. Each slot's state is one atomic, moved only by compare-and-swap from the
// state a transition leaves, so an illegal move is detected, never applied. A free slot's index is
// in `free` exactly once (an IndexQueue, like the loader's job queues: a permit stands for a
// queued index, and close() ends every wait).
struct SlotRing::Impl {
  struct Slot {
    std::atomic<SlotState> state{SlotState::kFree};
    CudaEvent event;  // holds an event when the ring's memory is pinned
  };

  explicit Impl(size_t slots) : slots(slots), free(slots) {}

  void transition(uint32_t slot, SlotState from, SlotState to) {
    if (slot >= slots.size()) throw std::logic_error("conveyor: slot index out of range");
    SlotState expected = from;
    if (!slots[slot].state.compare_exchange_strong(expected, to, std::memory_order_acq_rel)) {
      throw std::logic_error(std::string("conveyor: slot ") + std::to_string(slot) + " is " +
                             to_string(expected) + ", expected " + to_string(from) +
                             " for a move to " + to_string(to));
    }
  }

  // A slot popped from `free` (nullopt: none, or closed) moves to kFilling.
  std::optional<uint32_t> fill(std::optional<uint32_t> slot) {
    if (slot) transition(*slot, SlotState::kFree, SlotState::kFilling);
    return slot;
  }

  std::vector<Slot> slots;
  detail::IndexQueue free;
};

SlotRing::SlotRing(Options options)
    : field_bytes_(options.layout.field_bytes),
      slot_bytes_(layout_bytes(options.layout, offsets_)),
      slots_(options.slots),
      cuda_device_(options.cuda_device) {
  if (options.slots == 0) throw std::invalid_argument("conveyor: SlotRing needs at least 1 slot");
  memory_ = HostBuffer(slot_bytes_ * options.slots, options.memory, options.write_combined,
                       options.cuda_device);
  impl_ = std::make_unique<Impl>(options.slots);
  if (memory_.is_pinned()) {
    for (auto& slot : impl_->slots) slot.event = CudaEvent(options.cuda_device);
  }
  impl_->free.push_many(slots_, [](size_t i) { return static_cast<uint32_t>(i); });
}

SlotRing::~SlotRing() {
  close();
  if (!memory_.is_pinned()) return;
  try {
    detail::DeviceGuard guard(cuda_device_);
    for (auto& slot : impl_->slots) {
      // A copy may still read this slot: wait for it before the memory goes away.
      if (slot.event && cudaEventSynchronize(slot.event.native_handle()) != cudaSuccess) {
        (void)cudaGetLastError();
      }
    }
  } catch (...) {  // the device is gone (a sticky error): no copy runs any more
  }
}

std::optional<uint32_t> SlotRing::acquire() { return impl_->fill(impl_->free.wait()); }

std::optional<uint32_t> SlotRing::try_acquire_for(std::chrono::milliseconds timeout) {
  return impl_->fill(impl_->free.pop_for(timeout));
}

std::optional<uint32_t> SlotRing::try_acquire() { return impl_->fill(impl_->free.try_pop()); }

void SlotRing::mark_ready(uint32_t slot) {
  impl_->transition(slot, SlotState::kFilling, SlotState::kReady);
}

void SlotRing::release(uint32_t slot) {
  if (slot >= slots_) throw std::logic_error("conveyor: slot index out of range");
  SlotState expected = SlotState::kReady;
  if (!impl_->slots[slot].state.compare_exchange_strong(expected, SlotState::kFree)) {
    impl_->transition(slot, SlotState::kFilling, SlotState::kFree);
  }
  impl_->free.push(slot);
}

CudaEvent* SlotRing::begin_copy(uint32_t slot) {
  impl_->transition(slot, SlotState::kReady, SlotState::kCopying);
  CudaEvent& event = impl_->slots[slot].event;
  return event ? &event : nullptr;
}

void SlotRing::copy_finished(uint32_t slot) {
  impl_->transition(slot, SlotState::kCopying, SlotState::kFree);
  impl_->free.push(slot);
}

SlotState SlotRing::state(uint32_t slot) const {
  return impl_->slots.at(slot).state.load(std::memory_order_acquire);
}

std::vector<size_t> SlotRing::count_states() const {
  std::vector<size_t> counts(4, 0);
  for (const auto& slot : impl_->slots) ++counts[static_cast<size_t>(slot.state.load())];
  return counts;
}

bool SlotRing::closed() const { return impl_->free.closed(); }

void SlotRing::close() { impl_->free.close(); }

}  // namespace conveyor
