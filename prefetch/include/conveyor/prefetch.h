// conveyor/prefetch.h: the copy stage (host slot -> device tensors) and GPU-side batch ops.
//
// What it is for: moving a ready batch slot to the GPU without the training loop waiting for it.
// CudaCopyEngine allocates the destination tensors through LibTorch's CUDA caching allocator,
// issues cudaMemcpyAsync on a side stream from LibTorch's stream pool, records the slot's event
// after the copy and, through a host callback on that stream, hands the slot back as soon as the
// copy has finished reading it. make_visible() makes the consumer's current stream wait on the
// event and records the tensors on that stream, so the caching allocator never reuses their memory
// while the consumer may still use them.
//
// CopyEngine is the interface the loader drives; tests substitute a host-side engine whose copies
// finish late, to prove that no slot is reused before its copy is done. The slot's event travels
// as a CudaEvent* (conveyor/pinned.h), owned by the slot ring; null means no event.
//
// Requires: the host tensors passed to start() stay unchanged until on_finished runs; on_finished
// does not throw and calls no CUDA function (it runs on a CUDA callback thread, or on the engine's
// event thread under CopyCompletion::kEventThread).
// Guarantees: on_finished runs exactly once per start(), after the copy stopped reading the host
// memory, also when start() throws (then before start() returns). Destroying an engine waits for
// its outstanding copies and callbacks. resolve_device() refuses a device that cannot be used
// with std::invalid_argument naming it. This header compiles as C++17 and includes no CUDA header.
// Thread safety: a CopyEngine's member functions are called from one thread at a time (the
// loader's consumer thread); an engine need not support concurrent calls. on_finished may run on
// another thread (a CUDA callback thread, or the engine's event thread). resolve_device(),
// make_cuda_copy_engine() and normalize_images() may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "conveyor/pinned.h"

namespace conveyor {

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Starts copying `host` to the engine's device and returns the destination tensors, whose
  // content is valid only after make_visible(). `event` is the slot's CUDA event, recorded after
  // the copy; null when there is none (pageable memory, non-CUDA engines).
  virtual std::vector<at::Tensor> start(const std::vector<at::Tensor>& host, CudaEvent* event,
                                        std::function<void()> on_finished) = 0;
  // Orders the caller's later work after the copy that produced `device`; `event` is the one
  // given to start() for it (or null).
  virtual void make_visible(std::vector<at::Tensor>& device, CudaEvent* event) = 0;
  virtual c10::Device device() const = 0;
  // Throws if the engine can no longer finish its copies (e.g. a sticky CUDA error), so that a
  // loader waiting for a slot reports it instead of waiting forever.
  virtual void check() {}
};

// Checks that batches can be delivered to `device` here: the CPU, or a CUDA device that is usable
// (a driver, a GPU, and the index in range). Returns it with its index filled in for CUDA (cuda
// means cuda:0). Throws std::invalid_argument naming the device and what is missing.
c10::Device resolve_device(c10::Device device);

// How the CUDA copy engine learns that a copy has finished reading its slot, to hand it back.
enum class CopyCompletion {
  // A host function queued on the side stream after each batch's copies (cudaLaunchHostFunc).
  // The default, and the path measured on the H200. The stream runs no later copy until that
  // function has run on CUDA's callback thread, so each batch's copy waits for the previous
  // batch's hand-back.
  kHostCallback,
  // A thread of the engine waits for each batch's event in order (cudaEventSynchronize on a
  // blocking-sync event) and hands the slot back; the stream never waits for the host, so copies
  // run back to back. Not yet measured on a GPU: conveyor-bench reports both
  // (h2d_gb_per_s, h2d_event_thread_gb_per_s) against the plain copy loop.
  kEventThread,
};

// The real copy stage: one side stream of the given CUDA device.
// Throws std::invalid_argument as resolve_device() does, or for a CPU device.
std::unique_ptr<CopyEngine> make_cuda_copy_engine(
    c10::Device device, CopyCompletion completion = CopyCompletion::kHostCallback);

// Normalization on the device after the copy, so the PCIe link carries uint8:
// out = (images / 255 - mean) / std, per channel, as `dtype` (float32, float16 or bfloat16).
// `images` is uint8 [B,3,H,W] (CHW) or [B,H,W,3] (HWC, `hwc` = true). The result is [B,3,H,W],
// in channels-last memory format when `channels_last`. On CUDA it is one fused kernel; on the CPU
// it uses LibTorch ops.
struct NormalizeOptions {
  std::vector<float> mean{0.485f, 0.456f, 0.406f};  // ImageNet
  std::vector<float> std{0.229f, 0.224f, 0.225f};
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool hwc = false;
  bool channels_last = false;
};
at::Tensor normalize_images(const at::Tensor& images, const NormalizeOptions& options = {});

}  // namespace conveyor
