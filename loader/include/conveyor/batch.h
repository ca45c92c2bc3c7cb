// conveyor/batch.h: one batch of named fields, and the errors a loader raises.
// Part of the loader's public interface (conveyor/loader.h includes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include "conveyor/prefetch.h"

namespace conveyor {

struct AugmentRecord;  // conveyor/augment.h

// A sample failed to load; what() names the sample index and its file.
class SampleError : public std::runtime_error {
 public:
  SampleError(const std::string& message, size_t index, std::string path,
              std::exception_ptr original);
  size_t index() const { return index_; }
  const std::string& path() const { return path_; }
  // The exception the dataset threw.
  std::exception_ptr original() const { return original_; }
  [[noreturn]] void rethrow_original() const { std::rethrow_exception(original_); }

 private:
  size_t index_;
  std::string path_;
  std::exception_ptr original_;
};

class TimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One batch. On a CUDA device its tensors are ready on the stream that was current on the
// consumer thread (for the batch's device) when the loader handed it out: next() or the
// iterator's ++ / begin() made that stream wait for the batch's copy, and told the caching
// allocator that the stream uses the tensors. To read the batch on any other stream (a loop that
// runs its model under its own CUDAStreamGuard, a side stream of the user's), call
// record_stream(stream) first: that stream then waits for the copy, and the tensors' memory is
// not reused while work queued there may still read it, even after the batch is dropped.
struct Batch {
  // One tensor per field, in the order of the source's fields(): [B, ...sample_shape] for a fixed
  // field; for a ragged field (FieldSpec::ragged) its `values`, [total items, ...sample_shape].
  // On the loader's device, but a host_only field (FieldSpec::host_only), which stays a CPU
  // tensor of its own (never a view of the loader's memory) when batches go to a CUDA device.
  std::vector<at::Tensor> fields;
  // One per field: undefined for a fixed field; for a ragged field its `offsets`, int64 [B + 1],
  // row r's items being fields[i][offsets[r] .. offsets[r + 1]). On the values' device (the CPU
  // for a host_only field).
  std::vector<at::Tensor> offsets;
  std::vector<std::string> names;
  // The dataset indices in this batch, in row order (substitutes under kSkip included).
  std::vector<size_t> indices;
  // Each row's repeat number under a sampler that draws samples several times per epoch
  // (RASampler: the k-th draw of an index is repeat k-1); empty when every row is repeat 0.
  std::vector<uint32_t> repeats;
  // What LoaderOptions::batch_transform drew for this batch, when record_augment_params is on
  // (rows[r]: row r's draws); null otherwise.
  std::shared_ptr<const AugmentRecord> augment_params;
  uint64_t epoch = 0;
  size_t sequence = 0;  // position in the epoch's sampler order
  // The end of the batch's copy to the device (set by the loader); null for a CPU batch.
  std::shared_ptr<const CopyFence> copy_fence;

  // The tensor of field `name` (a ragged field's values). Throws std::out_of_range naming it.
  const at::Tensor& field(const std::string& name) const;
  // A ragged field's offsets. Throws std::out_of_range naming a field that is not ragged.
  const at::Tensor& field_offsets(const std::string& name) const;
  const at::Tensor& images() const { return field("image"); }
  const at::Tensor& labels() const { return field("label"); }
  size_t size() const { return indices.size(); }
  // Makes `stream` wait for this batch's copy and records its tensors as used by `stream` (see
  // above). Does nothing for a CPU batch. Throws CudaError, or std::invalid_argument for a
  // stream that is not a CUDA stream.
  void record_stream(c10::Stream stream) const;
};

}  // namespace conveyor
