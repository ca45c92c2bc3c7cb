// conveyor/prefetch.h: the copy stage (host slot -> device tensors) and GPU-side batch ops.
//
// What it is for: moving a ready batch slot to the GPU without the training loop waiting for it.
// The CUDA copy engine owns one side stream (created for it, never shared with other code, so
// that nothing else queued there waits behind its hand-backs). It allocates the destination
// tensors through LibTorch's CUDA caching allocator on that stream, issues cudaMemcpyAsync,
// records the slot's event and the batch's own event (its CopyFence) after the copy, and hands
// the slot back as soon as the copy has finished reading it. A CopyFence lets any stream wait for
// the batch: use_on() makes the stream wait for the copy and records the tensors on that stream,
// so the caching allocator never reuses their memory while work queued there may still read
// them. The loader calls use_on() with the consumer's current stream when it hands a batch out;
// Batch::record_stream (conveyor/loader.h) calls it for any other stream.
//
// CopyEngine is the interface the loader drives; tests substitute host-side engines whose copies
// finish late or at once, to prove that no slot is reused before its copy is done.
//
// Requires: the host tensors passed to start() stay unchanged until on_finished runs; on_finished
// calls no CUDA function (it runs on a CUDA callback thread, or on the engine's event thread under
// CopyCompletion::kEventThread). If on_finished throws anyway, the engine remembers it and
// check() reports it from then on: its slot may be lost, and the loader raises that instead of
// waiting for the slot.
// Guarantees: on_finished runs exactly once per start(), after the copy stopped reading the host
// memory, also when start() throws (then before start() returns). A fence outlives the engine
// safely. Destroying an engine waits for its outstanding copies and hand-backs. This header
// compiles as C++17 and includes no CUDA header.
// Thread safety: a CopyEngine's member functions are called from one thread at a time (the
// loader's consumer thread); an engine need not support concurrent calls. on_finished may run on
// another thread. A CopyFence may be used from any thread. make_cuda_copy_engine() and
// normalize_images() may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Stream.h>

#include "conveyor/cuda.h"
#include "conveyor/pinned.h"

namespace conveyor {

// The end of one batch's copy: what a stream waits for before it reads the batch.
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  // Makes `stream` wait for the copy, and records `tensors` (the copy's destination tensors) as
  // used by `stream`: their memory is not reused while work queued on `stream` may read them.
  // Throws CudaError (or std::invalid_argument for a stream this fence cannot order).
  virtual void use_on(c10::Stream stream, const std::vector<at::Tensor>& tensors) const = 0;
  // The calling thread's current stream on the copy's device.
  virtual c10::Stream current_stream() const = 0;
  // True once the copy has finished, without waiting.
  virtual bool done() const = 0;
};

// What CopyEngine::start() gives back: the destination tensors, whose content is valid only on
// a stream that `fence` ordered after the copy.
struct DeviceCopy {
  std::vector<at::Tensor> tensors;
  std::shared_ptr<const CopyFence> fence;  // never null
};

// Rows of a batch's field that are already on the engine's device (decoded there: GPU decode,
// LoaderOptions::gpu_decode): `rows` ([n, ...sample_shape], contiguous, on the engine's device,
// written before start() was called and unchanged until on_finished runs) replace rows
// [first_row, first_row + n) of field `field`.
struct DeviceRows {
  size_t field = 0;
  int64_t first_row = 0;
  at::Tensor rows;
};

// The rule every CopyEngine applies to `on_device` before it queues anything: each entry names a
// field of `host`, lies within its rows, has that field's row shape and dtype, is contiguous and
// is on `device`. Throws std::invalid_argument naming the entry and what is wrong.
void check_device_rows(const std::vector<at::Tensor>& host,
                       const std::vector<DeviceRows>& on_device, const c10::Device& device);

// The runs of host rows a copy engine copies, for `host` and `on_device` that passed
// check_device_rows: for each field, the rows no entry of `on_device` replaces, in field then row
// order, each run as long as it can be. So rows decoded on the device never cross PCIe, and a
// field whose rows all came from the device has no run at all.
struct HostRows {
  size_t field = 0;
  int64_t first_row = 0;
  int64_t rows = 0;
};
std::vector<HostRows> host_rows(const std::vector<at::Tensor>& host,
                                const std::vector<DeviceRows>& on_device);

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Starts copying the batch to the engine's device: into a fresh tensor per field, the runs of
  // `host` rows that host_rows() names, and `on_device` into the rows they name (all before the
  // fence: a batch's rows are final when its fence is). `slot_event` is
  // the slot ring's CUDA event for this slot, recorded after the copies so that the ring never
  // frees memory a copy still reads (the host slot, and the device rows of GPU decode, which
  // belong to the slot too); null when there is none (pageable memory, host-side engines).
  // Throws std::invalid_argument for device rows that do not fit their field or are not on the
  // engine's device (after on_finished ran, as for any throw).
  virtual DeviceCopy start(const std::vector<at::Tensor>& host,
                           const std::vector<DeviceRows>& on_device, CudaEvent* slot_event,
                           std::function<void()> on_finished) = 0;
  virtual c10::Device device() const = 0;
  // Throws if the engine can no longer finish its copies or hand their slots back (a sticky CUDA
  // error, a hand-back that threw), so that a loader waiting for a slot reports it instead of
  // waiting forever.
  virtual void check() {}
  // The engine's own side stream, where it has one.
  virtual std::optional<c10::Stream> stream() const { return std::nullopt; }
};

// How the CUDA copy engine learns that a copy has finished reading its slot, to hand it back.
enum class CopyCompletion {
  // A host function queued on the side stream after each batch's copies (cudaLaunchHostFunc).
  // The default, and the path measured on the H200. The stream runs no later copy until that
  // function has run on CUDA's callback thread, so each batch's copy waits for the previous
  // batch's hand-back.
  kHostCallback,
  // A thread of the engine waits for each batch's fence in order (cudaEventSynchronize on a
  // blocking-sync event) and hands the slot back; the stream never waits for the host, so copies
  // run back to back. conveyor-bench reports both (h2d_gb_per_s, h2d_event_thread_gb_per_s)
  // against the plain copy loop.
  kEventThread,
};

// The real copy stage: its own side stream on the given CUDA device (resolved as
// resolve_device() does). Throws std::invalid_argument as resolve_device() does, or for a CPU
// device; CudaError when the stream cannot be created.
std::unique_ptr<CopyEngine> make_cuda_copy_engine(
    c10::Device device, CopyCompletion completion = CopyCompletion::kHostCallback);

// Normalization on the device after the copy, so the PCIe link carries uint8:
// out = (images / 255 - mean) / std, per channel, as `dtype` (float32, float16 or bfloat16).
// `images` is uint8 [B,3,H,W] (CHW) or [B,H,W,3] (HWC, `hwc` = true). The result is [B,3,H,W],
// in channels-last memory format when `channels_last`. On CUDA it is one fused kernel on the
// current stream, which throws CudaError with the launch's own error (never an earlier one); on
// the CPU it uses LibTorch ops. Both compute in float32 and round once to `dtype`.
struct NormalizeOptions {
  std::vector<float> mean{0.485f, 0.456f, 0.406f};  // ImageNet
  std::vector<float> std{0.229f, 0.224f, 0.225f};
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool hwc = false;
  bool channels_last = false;
};
at::Tensor normalize_images(const at::Tensor& images, const NormalizeOptions& options = {});

}  // namespace conveyor
