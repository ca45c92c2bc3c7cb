// loader/src/batch_stage.h (detail): the engine's batch stage, LoaderOptions::batch_transform run
// on each batch before it is handed out (conveyor/augment.h has the ops' contract).
//
// Where it runs: on a CPU loader, on the worker that finishes the batch's last job, on the slot's
// views (ops that work in place write the slot; a field an op replaces is kept in the slot's
// SlotMeta::transformed and handed out instead of the slot's view); on a CUDA loader, by the
// DeviceStager after the batch's copy, with the copy engine's side stream current, and the
// batch's fence is then recorded after the ops (StagedFence): the consumer's stream waits for
// both, so the stream contract is unchanged.
// Invariants: the pipeline's out_fields() are computed once, when the engine is built; the ops
// see the fixed fields that go to the batch's device (not ragged, not host_only); the context of
// a batch is (seed, epoch, sequence, indices), so a batch's result does not depend on the worker
// count, timing or a resume.
// Thread safety: run() may be called from several threads at once, on different batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "conveyor/augment.h"
#include "conveyor/loader.h"

namespace conveyor::detail {

class BatchStage {
 public:
  // Throws std::invalid_argument naming the op when the pipeline cannot take `fields`.
  BatchStage(std::shared_ptr<const BatchOp> op, const std::vector<FieldSpec>& fields, uint64_t seed,
             bool record = false);
  // Whether the ops see field f (fixed, not host_only).
  bool sees(size_t f) const { return sees_[f]; }
  // Runs the pipeline on `tensors` (one per field; those it does not see are left alone), in
  // place or replacing tensors. Throws BatchTransformError naming the op and the batch.
  // `repeats`: the rows' repeat numbers (empty: all 0). Returns what the ops drew when the stage
  // records (record_augment_params), else null.
  std::shared_ptr<const AugmentRecord> run(std::vector<at::Tensor>& tensors,
                                           const std::vector<size_t>& indices,
                                           const std::vector<uint32_t>& repeats, uint64_t epoch,
                                           size_t sequence) const;

 private:
  std::shared_ptr<const BatchOp> op_;
  std::vector<FieldSpec> in_;  // the fields the ops see, as the source gives them
  std::vector<bool> sees_;
  uint64_t seed_;
  bool record_;
};

// A batch's fence once the stage's ops ran after its copy on `stream` (a CUDA stream): a stream
// that uses it waits for the copy and for the ops.
std::shared_ptr<const CopyFence> fence_after_stage(std::shared_ptr<const CopyFence> copy,
                                                   const c10::Stream& stream);

}  // namespace conveyor::detail
