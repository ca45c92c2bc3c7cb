// conveyor/pinned.h: page-locked host memory and the fixed ring of batch slots.
//
// What it is for: worker threads write each batch straight into a slot of a SlotRing; the copy
// stage reads the slot with an asynchronous host-to-device copy; the slot is then reused. All of
// the ring's memory is allocated once, up front, so memory use is bounded and known before the
// first batch.
//
// HostBuffer: one block of host memory. With a usable CUDA device it is page-locked
// (cudaHostAlloc, portable, optionally write-combined) through that device's context, so
// cudaMemcpyAsync from it really is asynchronous; without one it is ordinary 4 KiB-aligned memory,
// and is_pinned() says so.
//
// CudaEvent (conveyor/cuda.h): how an event travels between the ring, the copy stage and the
// loader (never as void*).
//
// SlotRing: `slots` slots, each holding one batch's fields as fixed byte ranges. Every slot has an
// explicit state and, when memory is pinned, a CUDA event that guards its reuse:
//
//   kFree --acquire()--> kFilling --mark_ready()--> kReady --begin_copy()--> kCopying
//     ^                                               |                        |
//     +-------------------release()-------------------+<--copy_finished()------+
//
// Requires: a slot index passed to a transition was obtained from acquire() and is in the state
// the transition leaves; violations throw std::logic_error (they are bugs, not input errors).
// Guarantees:
//   * acquire() only ever returns a free slot, so a slot is never written while a copy may still
//     read it: a kCopying slot becomes free only through copy_finished(), which the copy stage
//     calls once the copy's event has completed.
//   * Free slot indices travel through a lock-free queue; acquire/release take no lock, and no
//     transition allocates.
//   * bytes() and the field layout are constant for the ring's lifetime.
//   * The destructor waits for outstanding copies (the slot events) before freeing memory.
//   * This header pulls in no CUDA, Boost or threading header: the ring's machinery is private
//     (pinned.cpp), and it compiles as C++17.
// Thread safety: all member functions of SlotRing may be called concurrently, except construction
// and destruction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "conveyor/cuda.h"

namespace conveyor {

// One block of host memory, pinned when a CUDA device is usable.
class HostBuffer {
 public:
  enum class Kind { kAuto, kPageable };
  HostBuffer() = default;
  // Allocates `bytes` (zero-filled). kAuto pins when cuda_available(), through the context of
  // `cuda_device` (default: torch's current device), which also frees it; write_combined only
  // applies to pinned memory (fast for the GPU to read, slow for the CPU to read back).
  // Throws std::runtime_error naming the size when the allocation fails (CudaError for
  // cudaHostAlloc, whose error is cleared so that no later CUDA call reports it).
  explicit HostBuffer(size_t bytes, Kind kind = Kind::kAuto, bool write_combined = false,
                      std::optional<int> cuda_device = std::nullopt);
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool is_pinned() const { return pinned_; }

 private:
  void reset() noexcept;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
  int device_ = -1;  // the CUDA device whose context pinned the memory
};

enum class SlotState : uint8_t { kFree, kFilling, kReady, kCopying };
const char* to_string(SlotState state);

// Layout of one slot: one byte range per field (e.g. images, labels), each 256-byte aligned.
struct SlotLayout {
  std::vector<size_t> field_bytes;
};

class SlotRing {
 public:
  struct Options {
    size_t slots = 4;   // number of batch slots; at least 1
    SlotLayout layout;  // bytes of each field of one batch
    HostBuffer::Kind memory = HostBuffer::Kind::kAuto;
    bool write_combined = false;  // only for pinned memory the CPU never reads back
    int cuda_device = 0;          // the device whose context pins the memory and owns the events
  };
  // Throws std::invalid_argument for zero slots, std::runtime_error when memory or an event
  // cannot be allocated.
  explicit SlotRing(Options options);
  ~SlotRing();
  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;

  size_t slots() const { return slots_; }
  size_t fields() const { return offsets_.size(); }
  size_t slot_bytes() const { return slot_bytes_; }
  // Total host bytes held by the ring (slots x slot_bytes); constant.
  size_t bytes() const { return memory_.size(); }
  bool is_pinned() const { return memory_.is_pinned(); }

  // The start of `field` in `slot` (not range-checked).
  std::byte* field(uint32_t slot, size_t field) const {
    return memory_.data() + static_cast<size_t>(slot) * slot_bytes_ + offsets_[field];
  }
  size_t field_bytes(size_t field) const { return field_bytes_[field]; }

  // Blocks until a slot is free, marks it kFilling and returns it; nullopt once close() was called.
  std::optional<uint32_t> acquire();
  // Like acquire() but gives up after `timeout`.
  std::optional<uint32_t> try_acquire_for(std::chrono::milliseconds timeout);
  // Non-blocking acquire.
  std::optional<uint32_t> try_acquire();
  // kFilling -> kReady.
  void mark_ready(uint32_t slot);
  // kFilling or kReady -> kFree: the slot's content is no longer needed.
  void release(uint32_t slot);
  // kReady -> kCopying. With pinned memory, returns the slot's event for the copy stage to record
  // after its copy (owned by the ring, valid for the ring's lifetime); nullptr otherwise.
  CudaEvent* begin_copy(uint32_t slot);
  // kCopying -> kFree, once the copy no longer reads the slot. Safe to call from a CUDA host
  // callback (it calls no CUDA function).
  void copy_finished(uint32_t slot);

  SlotState state(uint32_t slot) const;
  // Number of slots in each state, indexed by SlotState.
  std::vector<size_t> count_states() const;
  // Wakes every thread blocked in acquire(); later acquires return nullopt.
  void close();
  bool closed() const;

 private:
  // The machinery: slot states, events, the free queue and its semaphore (pinned.cpp).
  struct Impl;

  // The layout, fixed at construction and read without synchronization (field() is on the
  // workers' hot path, so it stays inline).
  HostBuffer memory_;
  std::vector<size_t> offsets_;
  std::vector<size_t> field_bytes_;
  size_t slot_bytes_ = 0;
  size_t slots_ = 0;
  int cuda_device_ = 0;  // the device that owns the memory and the events
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor
