// datasets/sources/shard_stream.h (build-only): streaming mode of ImageSource::tar_shards. One
// reader thread per source reads this rank's shards whole and in order (libarchive over a local
// descriptor, over one plain HTTP GET per shard, or over a pipe: command's standard output),
// passes the samples through a bounded shuffle buffer, and numbers what comes out 0, 1, 2, ...
// (the stream's positions). Workers fetch positions; the loader's sequential sampler asks for
// them in order.
//
// The order is a pure function of (seed, epoch) and the shards' contents:
//   1. the shards are permuted by (seed, epoch); rank r takes permuted shards r, r + W, r + 2W...;
//   2. the rank's samples, in shard order and tar order, pass through a buffer of up to B
//      samples (as WebDataset's shuffle): output starts once 100 are in, the buffer grows two in
//      for one out until it holds B, then one in for one out; each sample out is drawn at random
//      (SampleRng of (seed, epoch, rank)); at the end the rest come out in random order.
// Every rank has the same number of positions (positions()), at most what any rank can hold in
// any epoch, so that every rank yields the same number of batches.
//
// A shard's bytes come through the Storage's streams (StorageReader::open_stream) and a
// ResumingStream, which restarts a dropped connection or a failed command where it stopped (HTTP
// Range) or from the beginning, skipping what was already read; libarchive (TarSampleReader) sees
// one unbroken stream, so no sample is emitted twice.
//
// Invariant: the reader emits positions in order, never more than `lookahead` past the highest
// position asked for, and keeps the last `behind` positions below it for a late or substitute
// read; memory is thus (B + lookahead + behind) encoded samples at most, whatever the dataset.
// Thread safety: fetch() and describe() are called from any number of workers; reset() when no
// fetch runs (DataLoader construction, through ImageSource::prepare).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/datasets.h"
#include "shards/tar_reader.h"
#include "sources/sample_kind.h"

namespace conveyor {
namespace detail {

struct StreamShard {
  ShardLocation where;
  size_t samples = 0;  // as the index or a counting pass says; 0 when unknown
};

class ShardStream {
 public:
  // Reads `shards` through options.storage (system_storage() when null).
  // `rule`: what a sample is (tar_reader.h): kImages for ImageSource (the image and its label),
  // kMembers for a FieldSource (every member of any key).
  ShardStream(std::vector<StreamShard> shards, ShardOptions options, size_t positions,
              SampleRule rule);
  ~ShardStream();
  ShardStream(const ShardStream&) = delete;
  ShardStream& operator=(const ShardStream&) = delete;

  size_t positions() const { return positions_; }

  // Forgets the stream in progress: the next fetch starts its epoch from the beginning.
  void reset();

  // Copies position `position` of the (seed, epoch) stream into `out`,
  // waiting for the reader as long as it takes (its reads have deadlines, so it always ends).
  // Starts that stream if another runs (a new epoch). Throws std::runtime_error naming the
  // shard and member for a sample without a label or a failed position (TarSample::error: a
  // damaged header, a refused member, a label that is not one), naming the shards' read errors when
  // the stream ended before `position`, or when `position` was already dropped (read out of order).
  // Under kImages `out` holds the image ("jpg") and the label ("cls"); under kMembers every member
  // of the sample.
  void fetch(uint64_t seed, uint64_t epoch, size_t position, SampleMembers& out);

  // "SHARD (member KEY.jpg)" while the position is held, else "stream position N".
  std::string describe(size_t position) const;

  // The shards (indices into the list given) that `rank` reads in `epoch`, in reading order.
  static std::vector<size_t> rank_shards(size_t shard_count, uint64_t seed, uint64_t epoch,
                                         size_t rank, size_t world_size);
  // Positions every rank can fill in every epoch: the sum of the floor(S/W) smallest counts.
  static size_t equal_positions(std::vector<size_t> counts, size_t world_size);

 private:
  using Entry = TarSample;
  struct Key {
    uint64_t seed = 0;
    uint64_t epoch = 0;
    bool operator==(const Key& o) const { return seed == o.seed && epoch == o.epoch; }
  };

  void restart(std::unique_lock<std::mutex>& lock, Key key);
  void stop_reader(std::unique_lock<std::mutex>& lock);
  void run(uint64_t generation, Key key, const StreamCancel* cancel);
  // Hands `entry` out as the next position; false when the reader should stop.
  bool emit(uint64_t generation, Entry&& entry);

  const std::vector<StreamShard> shards_;
  const ShardOptions options_;
  const std::shared_ptr<const Storage> storage_;
  const size_t positions_;
  const size_t lookahead_;
  const size_t behind_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::thread reader_;
  std::unique_ptr<StreamCancel> cancel_;  // the running reader's; outlives it (joined first)
  bool running_ = false;                  // a stream for key_ is (or was) read
  bool restarting_ = false;               // a fetch is replacing the reader
  bool stopping_ = false;                 // the destructor runs
  uint64_t generation_ = 0;               // bumped at each restart; an old reader sees it and stops
  Key key_;
  std::map<size_t, Entry> window_;  // positions held
  size_t emitted_ = 0;              // positions handed out so far
  size_t floor_ = 0;                // positions below were dropped
  size_t highest_ = 0;              // highest position asked for
  bool ended_ = false;              // the reader emitted all it will
  std::string errors_;              // the failed shards of this stream, for the ended-early message
  std::vector<std::vector<uint8_t>> spare_;  // byte buffers of dropped positions, reused
  SampleRule rule_;
  // The buffer of `entry` that holds its bytes under rule_ (what spare_ recycles).
  std::vector<uint8_t>& bytes_of(Entry& entry) const {
    return rule_ == SampleRule::kImages ? entry.bytes : entry.data;
  }
};

// The stream kind of ImageSource: sample i is position i of the (seed, epoch) stream.
std::unique_ptr<ImageSource::Kind> stream_kind(std::shared_ptr<ShardStream> stream,
                                               std::vector<std::string> classes);

}  // namespace detail
}  // namespace conveyor
