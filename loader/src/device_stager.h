// loader/src/device_stager.h (detail): the copy stage's queue on the consumer side.
//
// What it is for: keeping up to `depth` (prefetch_factor) batches' host-to-device copies in flight
// on the CopyEngine's side stream, ahead of the training loop, and handing them out in the order
// they were staged, each made safe to use on the consumer's stream.
//
// Invariants:
//   * Batches leave in the order they were staged; a failed batch (a sample error, or a copy that
//     could not start) holds its place and raises when its turn comes.
//   * Every staged copy's on_finished runs exactly once (the CopyEngine's guarantee), after the
//     copy stopped reading the slot; that is what hands the slot back (kCopying -> kFree). So
//     clear() need not wait: dropping a staged batch never frees a slot early.
//   * deliver() calls make_visible() before the batch reaches the user, so the consumer's stream
//     waits on the slot's event and the slot's event is not recorded again before that.
// Thread safety: the consumer thread only (on_finished runs on the engine's callback thread).
#pragma once

#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "conveyor/loader.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"

namespace conveyor::detail {

// What SlotRing::begin_copy() gives the copy stage for a slot: its CUDA event, or null.
using SlotEvent = decltype(std::declval<SlotRing&>().begin_copy(0));

class DeviceStager {
 public:
  DeviceStager(std::unique_ptr<CopyEngine> engine, size_t depth);
  // Drops what is staged, then destroys the engine, which waits for its copies and callbacks.
  ~DeviceStager();
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  bool full() const { return staged_.size() >= depth_; }
  bool empty() const { return staged_.empty(); }
  size_t size() const { return staged_.size(); }

  // Starts copying `host` (tensors viewing a slot in kCopying) to the device; `batch` is the
  // batch without its tensors. on_finished hands the slot back; it runs exactly once, also when
  // the copy cannot start (then the failure is staged in the batch's place).
  void stage(Batch batch, const std::vector<at::Tensor>& host, SlotEvent event,
             std::function<void()> on_finished);
  // A batch that failed: raised in its turn.
  void stage_failure(std::exception_ptr failure);
  // The oldest staged batch, made visible to the caller's stream; rethrows its failure.
  Batch deliver();
  // Forgets every staged batch (a cancelled epoch); their slots come back through on_finished.
  void clear() { staged_.clear(); }

  CopyEngine& engine() { return *engine_; }
  const CopyEngine& engine() const { return *engine_; }

 private:
  struct Staged {
    Batch batch;
    SlotEvent event{};
    std::exception_ptr failure;
  };
  std::unique_ptr<CopyEngine> engine_;
  size_t depth_;
  std::deque<Staged> staged_;
};

}  // namespace conveyor::detail
