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
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/batch.h"
#include "conveyor/datasets.h"
#include "conveyor/loader_options.h"
#include "conveyor/loader_state.h"
#include "conveyor/loader_stats.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"
#include "conveyor/samplers.h"

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace conveyor {

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
