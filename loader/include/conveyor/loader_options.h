// conveyor/loader_options.h: how a DataLoader runs: LoaderOptions and GPU decode's GpuDecode.
// Part of the loader's public interface (conveyor/loader.h includes it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

namespace conveyor {

enum class ErrorPolicy {
  kRaise,  // the consumer gets a SampleError for the batch holding the failed sample
  kSkip,   // the failed sample is replaced by the next index that loads, and counted
};

// LoaderOptions::workers = kAutoWorkers: the loader starts max_workers threads and chooses, while
// it runs, how many of them work (the others are parked) and how many batches it dispatches ahead,
// from what it measures: the consumer's wait per batch, the workers' busy time per sample, and the
// consumer's own time per sample. Few workers when the training step is the bottleneck (the
// consumer still waits under a few percent of the time), up to max_workers when it is not.
// Batches are byte-identical to those of any fixed number of workers, and resume is unchanged.
// stats().active_workers and stats().active_workers_history show the choice.
inline constexpr size_t kAutoWorkers = SIZE_MAX;

class DeviceDecoderFactory;  // conveyor/gpu_decode.h
class BatchOp;               // conveyor/augment.h

// GPU decode: the JPEGs of a source's image field decoded on the GPU's hardware JPEG engines
// (nvJPEG's hardware backend on an A100, H100 or H200) as well as by the workers, each image
// straight into the batch's device memory with the same crop box (choose_crop) as the CPU path.
// Off by default. It needs the CUDA copy stage (a CUDA device) and a source that offers a field
// (SampleSource::encoded_image_field: an ImageSource's "image"); where GPU decode cannot run (no
// libnvjpeg.so.13, no CUDA device, no hardware engine, a CPU device, a source without a fitting
// field) the loader decodes everything on the CPU exactly as with kOff, and mode() and
// stats().gpu_decode.status say why. Decode threads of the loader's (`threads`) drive the
// engines, each call a batch of up to `max_batch` images from the chunks queued for them. Files
// the hardware refuses (progressive, arithmetic-coded, CMYK, YCCK, 4:1:1, 4:1:0) and files it
// cannot read are decoded on the CPU, so errors, the skip policy and their messages are the CPU
// path's. A CUDA or nvJPEG failure of a batched decode call decodes its images on the CPU
// instead, so only a file that really fails meets on_error; a sticky one (the device is lost) is
// raised as a GpuDecodeError naming GPU decode and the error. The copy takes from the host only
// the rows the CPU wrote: rows decoded on the GPU never cross PCIe. Pixels differ
// between the decoders only by their IDCT and chroma upsampling (GpuCropDecoder::kMaxAbsDiff,
// kMinPsnr); each decoder is bit-exact on its own. Device memory: slots x batch_size images.
struct GpuDecode {
  enum class Mode {
    kOff,    // every image on the CPU (the default)
    kShare,  // sample (seed, epoch, index) goes to the GPU when fixed_share_decoder() says so
             // (conveyor/decode_balance.h): a pure function, so a sample meets the same decoder,
             // and has the same bytes, whatever the workers, chunk_size, timing or resume
    kAuto,   // each chunk to the decoder whose queue drains first (DecodeBalancer), from the
             // measured cost per image of each: neither idles while the other has a backlog.
             // Which decoder a sample meets then depends on timing, so its bytes may differ
             // from run to run (and after a resume) within the decoders' tolerance; its crop box
             // never does
  };
  Mode mode = Mode::kOff;
  // kShare: the share of samples sent to the GPU, in [0, 1] (the loader refuses others). 1 is
  // "hardware only": every file the hardware takes. The default is DALI's hw_decoder_load.
  double share = 0.65;
  // The decoder on the device. Null (the default): nvJPEG's hardware backend
  // (nvjpeg_hardware_decoders(), conveyor/gpu_decode.h).
  std::shared_ptr<const DeviceDecoderFactory> decoder;
  // Threads that drive the device decoder, each with a decoder (nvJPEG state and stream) of its
  // own, so that one reads and parses its next files while another's are decoded. At least 1.
  size_t threads = 2;
  // Images one batched decode call takes, at most (and at least chunk_size): a decode thread
  // takes as many queued chunks as fit. Under kAuto the balancer keeps this many images queued
  // for the device, so that its calls are full.
  size_t max_batch = 256;

  // "off", "auto", "hw-only" (hardware_only()) or a share in [0, 1] such as "0.65": what
  // conveyor-bench's --gpu-decode and the Python package's gpu_decode take. Throws
  // std::invalid_argument naming `text` otherwise.
  static GpuDecode parse(const std::string& text);
  static GpuDecode off() { return {}; }
  static GpuDecode automatic() { return {Mode::kAuto, 0.65, nullptr}; }
  static GpuDecode fixed_share(double share) { return {Mode::kShare, share, nullptr}; }
  static GpuDecode hardware_only() { return {Mode::kShare, 1.0, nullptr}; }
};

struct LoaderOptions {
  size_t batch_size = 1;
  // Worker threads that decode samples. 0 means one per hardware thread; kAutoWorkers: see above.
  size_t workers = 0;
  // With workers = kAutoWorkers, the budget: the most workers that work at once (and the threads
  // started). 0 means one per hardware thread.
  size_t max_workers = 0;
  // Drop the last batch of an epoch when it is smaller than batch_size.
  bool drop_last = false;
  // Deliver batches in sampler order (true) or as soon as each is ready (false).
  bool enforce_ordering = true;
  // Longest wait for one batch before TimeoutError; none by default.
  std::optional<std::chrono::milliseconds> timeout;
  // Seed for augmentations (and for samplers made by the drop-in API).
  uint64_t seed = 0;
  ErrorPolicy on_error = ErrorPolicy::kRaise;
  // With kSkip: how many following indices to try as a substitute before failing the batch.
  size_t max_substitutes = 16;
  // Where batches are delivered. A CUDA device adds the side-stream copy stage.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // With a CUDA device the ring is always pinned (asynchronous copies need it). With the CPU
  // device, true hands out each batch as a copy in LibTorch's pinned host memory (when a GPU is
  // usable), safe for your own non_blocking copies; false (the default, as in torch::data) hands
  // out views of the ring's pageable slots, no copy.
  bool pin_memory = false;
  // Batches copied to the device ahead of the consumer (CUDA devices only); at least 1.
  size_t prefetch_factor = 2;
  // Batch slots in the ring. 0 means workers + prefetch_factor + 2.
  size_t slots = 0;
  // Samples per job: the workers share each batch in chunks of this many samples, so a batch is
  // ready in about 1/workers of the time one worker would take, and no worker idles at the end of
  // an epoch while another finishes a whole batch. 0 means batch_size / (4 * workers), at least
  // 8 samples (one chunk per batch with one worker). When several samples of a batch fail, the
  // SampleError names the first of them in batch order, as with one chunk.
  size_t chunk_size = 0;
  // Decoding on the GPU's hardware JPEG engines as well (see GpuDecode); off by default.
  GpuDecode gpu_decode;
  // The batch stage: ops (conveyor/augment.h; several of them through compose()) run on each
  // batch, on the batch's device, before it is handed out: on a CPU loader by the worker that
  // finishes the batch (never on the thread that iterates the loader), on a CUDA loader on the
  // copy's side stream after the copy and before the batch's fence. Their randomness comes from
  // (seed, epoch, the batch's sequence and indices), so batches stay identical for any number of
  // workers and after a resume. The ops see the fixed fields that go to the device; a field they
  // change (Normalize: uint8 -> float; MixUp: int64 labels -> float [B, classes]) is handed out
  // as they made it. An op that fails fails its batch with a BatchTransformError naming the op
  // and the batch; a pipeline that cannot take the source's fields is refused when the loader is
  // built (std::invalid_argument). None by default.
  std::shared_ptr<const BatchOp> batch_transform;
  // Record what batch_transform's ops drew for each batch (each row's ops and magnitudes, boxes,
  // factors; MixUp's lambda, CutMix's box) as Batch::augment_params. Off by default (the record
  // costs a few small allocations per row).
  bool record_augment_params = false;
};

}  // namespace conveyor
