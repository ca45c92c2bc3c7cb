// datasets/src/shard_stream.h (build-only): streaming mode of ImageSource::tar_shards. One
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
// A remote or pipe: shard's bytes come through a ShardByteStream, which restarts a dropped
// connection or a failed command where it stopped (HTTP Range) or from the beginning, skipping
// what was already read; libarchive sees one unbroken stream, so no sample is emitted twice.
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
#include "file_descriptor.h"

namespace conveyor {
namespace detail {

// Wakes a reader that waits for a shard's bytes or sleeps before a retry, so that a stream being
// replaced or destroyed stops at once instead of at its deadline.
// Thread safety: cancel() from any thread; the rest from the reader's.
class ReadCancel {
 public:
  ReadCancel();  // an eventfd; throws std::runtime_error if none can be made
  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Readable once cancel() was called: for poll() and curl_multi_poll() beside their own fds.
  int fd() const { return event_.get(); }
  // Sleeps `duration`, or less when cancelled; false when cancelled.
  bool sleep_for(std::chrono::milliseconds duration) const;

 private:
  FileDescriptor event_;
  std::atomic<bool> cancelled_{false};
};

// What a ShardByteStream throws when its ReadCancel fired: not a shard's failure.
struct ReadCancelled : std::runtime_error {
  ReadCancelled() : std::runtime_error("tar_shards: the read was cancelled") {}
};

// One attempt's failure, thrown by a ShardByteStream's start() or read(): `transient` ones are
// tried again; the reason is the cause alone (the stream adds the shard's name and the attempts).
struct StreamFailure : std::runtime_error {
  StreamFailure(const std::string& reason, bool transient_failure)
      : std::runtime_error(reason), transient(transient_failure) {}
  bool transient;
};

// A shard's bytes in order, read in one pass and restarted after a failure.
//
// Each attempt starts at the byte where the last one stopped, when the source can (an HTTP Range
// request the server honours), or at the shard's beginning: the bytes already handed out are
// then read again and dropped, after a check that their last 64 KiB are the same as the first
// time (so a shard changed in between fails instead of splicing two versions). `retries`
// (ShardOptions) counts the failed attempts in a row that brought no new byte; each waits the
// backoff first.
// Thread safety: one thread (the reader); cancel through the ReadCancel given.
class ShardByteStream {
 public:
  ShardByteStream(std::string name, const ShardOptions& options, const ReadCancel& cancel);
  virtual ~ShardByteStream() = default;
  ShardByteStream(const ShardByteStream&) = delete;
  ShardByteStream& operator=(const ShardByteStream&) = delete;

  // The shard's next bytes, valid until the next call; empty at its end. Throws
  // std::runtime_error "NAME: REASON (N attempts over T s)" once the retries are spent, or at
  // once for a failure no attempt can mend (HTTP 404, a shard that changed); ReadCancelled.
  std::span<const uint8_t> next();
  // Reads what is left and drops it, so that the source's own end is checked too (a command's
  // exit status) after libarchive saw the archive's end. Throws as next().
  void finish();
  const std::string& name() const { return name_; }

 protected:
  // Starts an attempt at byte `offset` (0 for the first). Returns where its bytes start: `offset`,
  // or 0 when the source starts over. Throws StreamFailure.
  virtual uint64_t start(uint64_t offset) = 0;
  // The attempt's next bytes, valid until the next call, waiting at most the request deadline
  // for them; empty at the source's end (a whole body, a command that exited 0). Throws
  // StreamFailure or ReadCancelled.
  virtual std::span<const uint8_t> read() = 0;
  // Ends the attempt: closes its connection, kills its command. No-op when none runs.
  virtual void stop() = 0;

  const ShardOptions& options_;
  const ReadCancel& cancel_;

 private:
  static constexpr size_t kCheckedTail = 64 * 1024;
  void remember(std::span<const uint8_t> bytes);
  // Checks the re-read bytes [at, at + bytes.size()) against the remembered tail.
  void check_again(uint64_t at, std::span<const uint8_t> bytes) const;

  std::string name_;
  bool running_ = false;  // an attempt is in progress
  bool ended_ = false;
  uint64_t delivered_ = 0;     // bytes handed out
  uint64_t position_ = 0;      // of the running attempt: the next byte's offset in the shard
  std::vector<uint8_t> tail_;  // the last kCheckedTail bytes handed out, as a ring by offset
};

// A pipe: shard: COMMAND's standard output, through /bin/sh -c with the process's environment,
// in a process group of its own. An attempt fails when COMMAND writes nothing for
// request_timeout, or exits other than 0 (the reason gives the status and the last lines of its
// stderr); each attempt runs it again. stop() and the destructor kill the group (SIGKILL) and
// reap the shell, so no process is left behind.
std::unique_ptr<ShardByteStream> open_pipe_stream(const std::string& command,
                                                  const ShardOptions& options,
                                                  const ReadCancel& cancel);

// Runs `command` once and reads its whole output into `out` (at most `max_bytes`): true when it
// exited 0. False with `failure` set when it could not start, exited otherwise, wrote more than
// `max_bytes` or nothing for request_timeout. For an index beside pipe: shards.
bool read_command_output(const std::string& command, const ShardOptions& options, size_t max_bytes,
                         std::vector<uint8_t>& out, std::string& failure);

// One sample of a tar shard: its image member's bytes and the label beside it.
struct TarSample {
  std::vector<uint8_t> bytes;
  int64_t label = 0;
  bool has_label = false;
  std::string name;  // "SHARD (member KEY.jpg)"
};

class HttpStreamHandles;  // http.h

// The samples of one shard in tar order: a KEY with a .jpg or .jpeg member (the first, if
// several) and its .cls label, by WebDataset's key rule; other members are skipped. A local shard
// is read through its descriptor, a remote one through one streamed GET, a command through its
// output (ShardByteStream: restarted after failures).
// Thread safety: one thread.
class TarSampleReader {
 public:
  // `http` (made on first use, kept across shards for the connection) and `cancel` must outlive
  // the reader. Throws std::runtime_error naming the shard when it cannot be opened.
  TarSampleReader(const ShardLocation& shard, const ShardOptions& options,
                  std::unique_ptr<HttpStreamHandles>& http, const ReadCancel& cancel);
  ~TarSampleReader();
  TarSampleReader(const TarSampleReader&) = delete;
  TarSampleReader& operator=(const TarSampleReader&) = delete;

  // The next sample into `out` (reusing out.bytes' capacity); false after the last one, once the
  // shard's source ended well too (ShardByteStream::finish). Throws std::runtime_error naming the
  // shard (and the member) on a read or tar error; ReadCancelled.
  bool next(TarSample& out);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct StreamShard {
  ShardLocation where;
  size_t samples = 0;  // as the index or a counting pass says; 0 when unknown
};

class ShardStream {
 public:
  ShardStream(std::vector<StreamShard> shards, ShardOptions options, size_t positions);
  ~ShardStream();
  ShardStream(const ShardStream&) = delete;
  ShardStream& operator=(const ShardStream&) = delete;

  size_t positions() const { return positions_; }

  // Forgets the stream in progress: the next fetch starts its epoch from the beginning.
  void reset();

  // Copies position `position` of the (seed, epoch) stream into `out` and returns its label,
  // waiting for the reader as long as it takes (its reads have deadlines, so it always ends).
  // Starts that stream if another runs (a new epoch). Throws std::runtime_error naming the
  // shard and member for a sample without a label, naming the shards' read errors when the
  // stream ended before `position`, or when `position` was already dropped (read out of order).
  int64_t fetch(uint64_t seed, uint64_t epoch, size_t position, std::vector<uint8_t>& out);

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
  void run(uint64_t generation, Key key, const ReadCancel* cancel);
  // Hands `entry` out as the next position; false when the reader should stop.
  bool emit(uint64_t generation, Entry&& entry);

  const std::vector<StreamShard> shards_;
  const ShardOptions options_;
  const size_t positions_;
  const size_t lookahead_;
  const size_t behind_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::thread reader_;
  std::unique_ptr<ReadCancel> cancel_;  // the running reader's; outlives it (joined first)
  bool running_ = false;                // a stream for key_ is (or was) read
  bool restarting_ = false;             // a fetch is replacing the reader
  bool stopping_ = false;               // the destructor runs
  uint64_t generation_ = 0;             // bumped at each restart; an old reader sees it and stops
  Key key_;
  std::map<size_t, Entry> window_;  // positions held
  size_t emitted_ = 0;              // positions handed out so far
  size_t floor_ = 0;                // positions below were dropped
  size_t highest_ = 0;              // highest position asked for
  bool ended_ = false;              // the reader emitted all it will
  std::string errors_;              // the failed shards of this stream, for the ended-early message
  std::vector<std::vector<uint8_t>> spare_;  // byte buffers of dropped positions, reused
};

// Samples in a local tar shard: the keys that have a .jpg or .jpeg member, counted by walking the
// tar headers (libarchive, member data skipped). Throws naming the shard on a tar error.
size_t count_tar_samples(const std::string& path);

}  // namespace detail

struct ImageSource::Stream : detail::ShardStream {
  using detail::ShardStream::ShardStream;
};

}  // namespace conveyor
