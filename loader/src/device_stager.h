// loader/src/device_stager.h (detail): the copy stage's queue on the consumer side.
//
// What it is for: keeping up to `depth` (prefetch_factor) batches' host-to-device copies in flight
// on the CopyEngine's side stream, ahead of the training loop, and handing them out in the order
// they were staged, each made safe to use on the consumer's current stream.
//
// Invariants:
//   * Batches leave in the order they were staged; a failed batch (a sample error, or a copy that
//     could not start) holds its place and is handed out as its failure when its turn comes.
//   * Every staged copy's on_finished runs exactly once (the CopyEngine's guarantee), after the
//     copy stopped reading the slot; that is what hands the slot back (kCopying -> kFree). So
//     clear() need not wait: dropping a staged batch never frees a slot early.
//   * deliver() orders the consumer's current stream after the batch's own copy (its fence)
//     before the batch leaves: a fence is the batch's, never reused while the batch lives, so a
//     later copy into the same slot cannot make the consumer wait for the wrong copy.
//   * The staged batches live in a ring of `depth` entries allocated once: staging allocates
//     nothing of its own, and delivering only the list of tensors its fence orders, before the
//     batch moves, so no batch is lost to an allocation failure in here.
//   * A fence orders every tensor the copy made: each field's and each ragged field's offsets
//     (fenced_tensors()); host_only fields are CPU tensors the copy never touched.
// Thread safety: the consumer thread only (on_finished runs on the engine's callback thread).
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "batch_stage.h"
#include "conveyor/loader.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"

namespace conveyor::detail {

// Where a tensor copied to the device goes in its batch: fields[field], or offsets[field] (a
// ragged field's offsets).
struct CopyTarget {
  size_t field = 0;
  bool offsets = false;
};

// The tensors of `batch` that a fence orders for `stream`: its fields and offsets on the stream's
// kind of device (a host_only field stays on the CPU and needs no ordering).
std::vector<at::Tensor> fenced_tensors(const Batch& batch, const c10::Stream& stream);

class DeviceStager {
 public:
  // `stage`, when not null, runs on each batch after its copy (batch_stage.h): with the engine's
  // side stream current, and the batch's fence then orders the ops too. An engine without a
  // stream of its own (host-side test engines) has the copy waited for, then the ops run.
  DeviceStager(std::unique_ptr<CopyEngine> engine, size_t depth,
               std::shared_ptr<const BatchStage> stage = nullptr);
  // Drops what is staged, then destroys the engine, which waits for its copies and callbacks.
  ~DeviceStager();
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  bool full() const { return count_ >= ring_.size(); }
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }

  // Starts copying `host` (tensors viewing a slot in kCopying) to the device, then `on_device`
  // (the slot's rows that GPU decode wrote on the device, naming `host` entries) over their rows;
  // the copy of host[i] becomes the batch's tensor that targets[i] names. `batch` is the batch
  // without those tensors (its fields and offsets sized to its fields: host_only fields already
  // there, on the CPU). on_finished hands the slot back; it runs exactly once, also when the copy
  // cannot start (then the failure is staged in the batch's place), and when the batch stage
  // fails (its BatchTransformError is staged in the batch's place). Never throws.
  void stage(Batch batch, const std::vector<at::Tensor>& host,
             const std::vector<CopyTarget>& targets, const std::vector<DeviceRows>& on_device,
             CudaEvent* slot_event, std::function<void()> on_finished) noexcept;
  // A batch that failed: handed out as its failure in its turn. Never throws.
  void stage_failure(std::exception_ptr failure) noexcept;

  // The oldest staged batch, made visible to the caller's current stream, or its failure; either
  // way it has left the stager. If making it visible throws, it stays first and the exception
  // propagates (a later deliver() tries again).
  struct Delivered {
    std::optional<Batch> batch;
    std::exception_ptr failure;
  };
  Delivered deliver();
  // Forgets every staged batch (a cancelled epoch); their slots come back through on_finished.
  void clear();

  // Time spent queuing (or, without a stream, running) the batch stage's ops, in seconds.
  double transform_seconds() const { return transform_seconds_; }
  CopyEngine& engine() { return *engine_; }
  const CopyEngine& engine() const { return *engine_; }

 private:
  struct Staged {
    Batch batch;
    std::exception_ptr failure;
  };
  Staged& push_slot();

  std::unique_ptr<CopyEngine> engine_;
  std::shared_ptr<const BatchStage> batch_stage_;
  double transform_seconds_ = 0;
  std::vector<Staged> ring_;  // depth entries; [head_, head_ + count_) modulo depth are staged
  size_t head_ = 0;
  size_t count_ = 0;
};

}  // namespace conveyor::detail
