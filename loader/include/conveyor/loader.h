// conveyor/loader.h: the data loader: samplers, worker pool, ordered batches, prefetch to the GPU.
//
// What it is for: iterating over a SampleSource in batches with the decoding done by a pool of
// worker threads, each batch written straight into a slot of a pinned SlotRing and, with a CUDA
// device, copied there on a side stream ahead of the training loop:
//
//   conveyor::LoaderOptions options;
//   options.batch_size = 256;
//   options.workers = 8;
//   options.device = torch::Device("cuda:0");
//   conveyor::DataLoader loader(conveyor::ImageSource::image_folder(root, train_transform),
//                               options, conveyor::RandomSampler::make(seed));
//   for (int epoch = 0; epoch < 90; ++epoch)
//     for (conveyor::Batch& batch : loader) train_step(batch.images(), batch.labels());
//
// Requires: C++17 or later. One consumer thread iterates a loader; the SampleSource is safe to call
// from the workers as SampleSource documents. Guarantees:
//   * Each begin() starts a new epoch (0, 1, 2, ...). Within an epoch every index the sampler
//     yields is delivered exactly once (or, with ErrorPolicy::kSkip, replaced by a substitute and
//     counted in stats().skipped). With enforce_ordering (the default) batches come in sampler
//     order, otherwise as they finish.
//   * Memory is allocated up front: pinned_bytes() host bytes for the ring, constant for the
//     loader's lifetime; at most prefetch_factor batches are staged on the device.
//   * Without a CUDA device the same pipeline runs on the CPU: pageable memory, no copy stage, and
//     batches are tensors that view their slot (no copy); the slot is recycled when the batch's
//     tensors are released. mode() says which path is in use.
//   * A sample that fails raises SampleError naming the sample index and its file, carrying the
//     original exception; a batch that does not arrive within `timeout` raises TimeoutError.
//   * Calling begin() again before an epoch ended (e.g. after `break`) cancels the rest of that
//     epoch and starts the next one; destroying the loader mid-epoch returns promptly; neither
//     leaks a thread, a stream or pinned memory. (torch::data instead rejects a second begin()
//     while batches are in flight; Conveyor deliberately allows it.)
// Thread safety: a DataLoader and its iterators are used by one thread at a time (the consumer);
// the worker threads are the loader's own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "conveyor/datasets.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace conveyor {

// ---------------------------------------------------------------------------------------------
// A loader's checkpoint as plain values (DataLoader::state(), DataLoader::load_state()).
//
// What it is for: saving and loading a loader's position without executing anything. A state
// is a map from names to values (64-bit integers, strings, lists of 64-bit integers); its byte
// form (serialize(), parse()) is a small text format that parse() reads with strict bounds, so
// a state from a file, a peer or a download is data, never code. A torch archive
// (DataLoader::save(), load()) carries the same values, but loading one runs torch::jit::load,
// which may run code from the file (docs/resume.md).
//
// The byte form, version 1 (every number decimal ASCII, every line ending in '\n'):
//   conveyor-loader-state 1
//   <key> i <int64>                       one integer: an optional '-', then 1 to 19 digits
//   <key> s <length>:<length bytes>       one string: any bytes, as many as <length> says
//   <key> l <count>[ <int64>]...          a list: <count> integers, each after one space
// in any order of keys, each key once. A key is 1 to kMaxKeyBytes bytes of [A-Za-z0-9_].
//
// Requires nothing. Guarantees: set_*() and parse() refuse, with std::invalid_argument naming
// the key (quoted, bounded and escaped), a key that is not a name, a string over
// kMaxStringBytes, more than kMaxEntries entries, and parse() also anything not in the format
// above: an unknown type, a number out of int64's range or with stray characters, a length past
// the end of the bytes, a repeated key, bytes after the last line. Nothing is allocated for a
// length or count before the bytes it claims are known to be there.
// Thread safety: a value type; const calls are safe from several threads.
class LoaderState {
 public:
  using Value = std::variant<int64_t, std::string, std::vector<int64_t>>;
  static constexpr size_t kMaxKeyBytes = 64;
  static constexpr size_t kMaxStringBytes = 4096;
  static constexpr size_t kMaxEntries = 256;

  // Sets `key` (replacing its value, if any).
  void set_int(std::string_view key, int64_t value);
  void set_string(std::string_view key, std::string_view value);
  void set_list(std::string_view key, std::vector<int64_t> value);
  // The value of `key`, or null.
  const Value* find(const std::string& key) const;
  const std::map<std::string, Value>& values() const { return values_; }
  bool operator==(const LoaderState& other) const { return values_ == other.values_; }
  bool operator!=(const LoaderState& other) const { return !(*this == other); }

  // The byte form above; parse(serialize()) == *this.
  std::string serialize() const;
  static LoaderState parse(std::string_view bytes);

 private:
  void set(std::string_view key, Value value);
  std::map<std::string, Value> values_;
};

// ---------------------------------------------------------------------------------------------
// Samplers: the order of dataset indices in each epoch.

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Writes the indices of `epoch` for a dataset of `dataset_size` samples into `out`.
  // Must be a pure function of its arguments and the sampler's construction parameters.
  virtual void indices(size_t dataset_size, uint64_t epoch, std::vector<size_t>& out) const = 0;

  // --- Checkpoints (DataLoader::state/load_state, save/load). The defaults suit a sampler used
  // by one process. Keys of the loader's own ("epoch", "batch_size", ...: docs/resume.md) are
  // not the sampler's to write; a sampler's keys start with "sampler".
  // Writes the parameters that shape the order (a seed, a world size, ...).
  virtual void save(LoaderState& state) const;
  // Throws std::invalid_argument naming a parameter in `state` (written by save()) that does
  // not fit this sampler, or is missing, or out of its range. A distributed sampler accepts
  // another world size and rank.
  virtual void check(const LoaderState& state) const;
  // The processes that share each epoch's order (1 unless distributed).
  virtual size_t world_size() const { return 1; }
  // This process's indices for the rest of `epoch` once an earlier job consumed the first
  // `consumed` entries of the epoch's global order (the order before it is shared out among
  // ranks). Default: indices() without its first `consumed` entries.
  virtual void remaining_indices(size_t dataset_size, uint64_t epoch, size_t consumed,
                                 std::vector<size_t>& out) const;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  static std::unique_ptr<Sampler> make() { return std::make_unique<SequentialSampler>(); }
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override;
  void save(LoaderState& state) const override;
  void check(const LoaderState& state) const override;
};

// A permutation that is a pure function of (seed, epoch): the same whatever the number of workers,
// different from epoch to epoch.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(uint64_t seed = 0) : seed_(seed) {}
  static std::unique_ptr<Sampler> make(uint64_t seed = 0) {
    return std::make_unique<RandomSampler>(seed);
  }
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override;
  void save(LoaderState& state) const override;
  void check(const LoaderState& state) const override;

 private:
  uint64_t seed_;
};

// PyTorch's DistributedSampler: each of `world_size` ranks gets a disjoint share of one (optionally
// shuffled by seed and epoch) permutation. Without drop_last the permutation is padded by repeating
// its head so every rank gets ceil(n / world_size) indices; with drop_last the tail is dropped so
// every rank gets floor(n / world_size).
//
// Elastic resume: when an epoch is resumed from a checkpoint saved by a job of N ranks into a job
// of M ranks (remaining_indices()), the epoch's global order is the same permutation; its first
// `consumed` entries (what the N ranks had received: N x the batches each received x batch size,
// never padding, since every rank received the same number of batches) are dropped, and the rest
// is shared out over the M ranks by the same rule: padded by repeating the head of the rest so
// that every rank gets ceil(rest / M) (some samples then come twice in that epoch, as with
// PyTorch's padding), or with drop_last its tail dropped so that every rank gets floor(rest / M).
// With M == N the loader instead continues each rank's own order, so a resume is bit-exact.
class DistributedSampler : public Sampler {
 public:
  // The most ranks a job may have: the constructor refuses more, and so does a checkpoint's
  // world size (more than any job runs; a larger number is a corrupt or forged state).
  static constexpr size_t kMaxWorldSize = size_t{1} << 24;
  // Throws std::invalid_argument unless 1 <= world_size <= kMaxWorldSize and rank < world_size.
  DistributedSampler(size_t rank, size_t world_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  static std::unique_ptr<Sampler> make(size_t rank, size_t world_size, bool shuffle = true,
                                       uint64_t seed = 0, bool drop_last = false) {
    return std::make_unique<DistributedSampler>(rank, world_size, shuffle, seed, drop_last);
  }
  void indices(size_t n, uint64_t epoch, std::vector<size_t>& out) const override;
  void save(LoaderState& state) const override;
  void check(const LoaderState& state) const override;
  size_t world_size() const override { return world_size_; }
  size_t rank() const { return rank_; }
  void remaining_indices(size_t n, uint64_t epoch, size_t consumed,
                         std::vector<size_t>& out) const override;
  // Indices per rank for a dataset of n samples.
  size_t per_rank(size_t n) const;

 private:
  size_t rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
};

// ---------------------------------------------------------------------------------------------
// Options and results.

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
};

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

struct SkippedSample {
  size_t index;
  std::string path;
  std::string message;
  uint64_t epoch;
};

// A change of the active workers under kAutoWorkers: from the batch handed out `batch` (counted
// over the loader's life) and `seconds` after the loader started, `workers` work.
struct ActiveWorkers {
  uint64_t batch = 0;
  double seconds = 0;
  size_t workers = 0;
};

// How the images were shared between the CPU and the GPU decoder (LoaderOptions::gpu_decode).
struct GpuDecodeStats {
  bool active = false;  // the GPU decoder runs
  // Off, why it cannot run, or which decoder runs on which device.
  std::string status = "off";
  uint64_t gpu_images = 0;  // images decoded on the device
  uint64_t cpu_images = 0;  // images decoded on the CPU (by the workers, and the refused ones)
  // Of the images sent to the device decoder, those it left to the CPU: files the hardware does
  // not take, files it could not read (the CPU path then names the error), and substitutes.
  uint64_t refused = 0;
  // Batched decode calls that failed on the device (CUDA or nvJPEG), their images then decoded on
  // the CPU.
  uint64_t failed_batches = 0;
  double gpu_busy_seconds = 0;  // the decode threads' time on chunks, summed over them
  double gpu_idle_seconds = 0;  // the decode threads' time waiting for chunks, summed
  double cpu_idle_seconds = 0;  // the workers' time waiting for a chunk, summed over workers
  // kAuto: the balancer's estimates of the cost per image (the CPU's: one worker's).
  double cpu_ns_per_image = 0;
  double gpu_ns_per_image = 0;
  double gpu_share() const {
    const uint64_t all = gpu_images + cpu_images;
    return all == 0 ? 0.0 : static_cast<double>(gpu_images) / static_cast<double>(all);
  }
};

struct LoaderStats {
  uint64_t batches = 0;                        // delivered to the consumer
  uint64_t samples = 0;                        // rows delivered
  uint64_t skipped = 0;                        // samples replaced under kSkip
  uint64_t errors = 0;                         // sample failures seen (raised or skipped)
  std::vector<SkippedSample> skipped_samples;  // the first 1000
  double fill_seconds = 0;          // worker time spent writing samples, summed over workers
  double copy_issue_seconds = 0;    // consumer time spent issuing device copies
  double wait_seconds = 0;          // time the consumer waited for a batch
  std::vector<size_t> slot_states;  // slots per SlotState, now
  uint64_t copies_to_host = 0;      // batches handed out as copies because the user held every slot
  size_t active_workers = 0;        // workers that work now (all of them unless kAutoWorkers)
  // Under kAutoWorkers: the active workers from the start, then every change (the first 4096).
  std::vector<ActiveWorkers> active_workers_history;
  GpuDecodeStats gpu_decode;  // the split between the decoders (LoaderOptions::gpu_decode)
};

// ---------------------------------------------------------------------------------------------

namespace detail {
class TorchConventionEngine;  // the drop-in's bridge (torch_data/src/torch_data_engine.h)
}  // namespace detail

class DataLoader {
 public:
  class Iterator;
  struct Sentinel {};

  // Throws std::invalid_argument on bad options (batch_size 0, a CUDA device without a GPU, ...).
  // `sampler` defaults to SequentialSampler; `copy_engine` defaults to the CUDA engine for a CUDA
  // device (tests pass their own).
  DataLoader(std::shared_ptr<SampleSource> source, LoaderOptions options,
             std::unique_ptr<Sampler> sampler = nullptr,
             std::unique_ptr<CopyEngine> copy_engine = nullptr);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts the next epoch (cancelling the rest of the current one, if any).
  Iterator begin();
  Sentinel end() const { return {}; }
  // The next batch of the current epoch, or nullopt at its end. Starts epoch 0 if none started.
  std::optional<Batch> next();
  // What poll() found: the next batch, or the end of the epoch, or (neither) nothing yet.
  struct Poll {
    std::optional<Batch> batch;
    bool end = false;
  };
  // Like next(), but waits at most about `wait` (0: not at all) for the next batch. When none is
  // ready in time it returns neither a batch nor the end, and a later call (poll() or next())
  // continues with the same batch: nothing is lost, skipped or doubled. `timeout` counts from the
  // first call that waited for the batch. For a consumer that must stay responsive while it waits
  // (a UI, a signal check, Python's Ctrl-C).
  Poll poll(std::chrono::milliseconds wait);
  // Starts the next epoch without iterating (begin() calls it).
  void start_epoch();
  // Makes the next begin() start `epoch` instead of the one after the current: to resume
  // training, or to follow an outside epoch counter (PyTorch's DistributedSampler.set_epoch).
  void set_epoch(uint64_t epoch);

  // --- Checkpoints: resume mid-epoch, bit-exactly, in O(1) (docs/resume.md).
  // The loader's position as plain values: the epoch, the batches the consumer has received in
  // it, and what shapes the order: seed, batch_size, drop_last, the dataset's size and the
  // sampler's parameters. Nothing about workers, chunk_size, slots or prefetch_factor. Throws
  // std::logic_error mid-epoch when enforce_ordering is off (batches then arrive out of order, so
  // a count does not say which were received). state().serialize() is a byte form to store.
  LoaderState state() const;
  // Continues from a state written by state() (or save()). The next begin() (or next())
  // continues that epoch with the batch after the last one received, without reading any sample
  // before it; its batches and every later epoch's are byte-identical to an uninterrupted run's,
  // whatever the workers, chunk_size or prefetch_factor. If that epoch was complete, the next
  // begin() starts the one after it. Nothing in `state` is executed or trusted: every number is
  // checked against what it can mean before it is used. Throws std::invalid_argument naming the
  // field (and its value) that is missing, of the wrong type, out of range (a negative count, a
  // position past the dataset, a world size over DistributedSampler::kMaxWorldSize, more batches
  // received than the saved ranks' shares hold) or that does not fit this loader (batch_size,
  // drop_last, dataset size, seed, the sampler's kind or parameters), leaving the loader as it
  // was. A DistributedSampler's world size and rank may differ: elastic resume (see
  // DistributedSampler). Keys it does not read are ignored.
  void load_state(const LoaderState& state);
  // The same values through a torch archive, for a checkpoint beside torch::save's: save()
  // writes state() into `archive` (integers and strings as attributes, a list as an int64
  // tensor), load() reads every attribute of `archive` and calls load_state(). Only load archives
  // you wrote yourself: InputArchive::load_from() is torch::jit::load(), which can run code from
  // the file (__setstate__) before load() sees any value. For a checkpoint from anywhere else use
  // state() and load_state() with LoaderState::serialize() and parse(), which execute nothing.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

  // Stops the workers and releases the copy stage; the loader yields nothing afterwards.
  void join();

  uint64_t epoch() const;
  size_t batches_per_epoch() const;
  size_t workers() const;
  // The options as resolved (defaults filled in: workers, slots, chunk_size, ...).
  const LoaderOptions& options() const;
  size_t pinned_bytes() const;  // bytes of the slot ring (pinned or not)
  bool is_pinned() const;
  // One line saying which path is in use: GPU copy stage, or CPU only (and why).
  std::string mode() const;
  LoaderStats stats() const;

 private:
  class Impl;  // loader/src/engine.h: the engine's threads, queues and slots
  // The drop-in builds its engine from options it resolved once, and hands it resume positions.
  friend class detail::TorchConventionEngine;
  explicit DataLoader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class DataLoader::Iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using pointer = Batch*;
  using reference = Batch&;

  Batch& operator*();
  Batch* operator->() { return &**this; }
  Iterator& operator++();
  bool operator==(const Sentinel&) const { return !batch_.has_value(); }
  bool operator!=(const Sentinel& s) const { return !(*this == s); }

 private:
  friend class DataLoader;
  Iterator(DataLoader* loader, uint64_t epoch, uint64_t run);
  void check_current() const;
  DataLoader* loader_;
  uint64_t epoch_;  // for the message only: set_epoch() can start the same epoch again
  uint64_t run_;    // the loader's count of epoch starts and loads when begin() made it
  std::optional<Batch> batch_;
};

// The umbrella of what a training loop usually wants: a loader over an ImageFolder.
std::unique_ptr<DataLoader> make_image_folder_loader(const std::string& root,
                                                     const ImageTransform& transform,
                                                     const LoaderOptions& options,
                                                     bool shuffle = true);

}  // namespace conveyor
