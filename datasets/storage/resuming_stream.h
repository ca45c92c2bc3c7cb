// datasets/storage/resuming_stream.h (build-only): a resource's bytes in one unbroken pass over a
// ByteStream whose attempts fail: what streaming mode and conveyor-prepare read shards through.
//
// Each attempt starts at the byte where the last one stopped, when the source can (an HTTP Range
// request the server honours), or at the beginning: the bytes already handed out are then read
// again and dropped, after a check that their last 64 KiB are the same as the first time (so a
// resource changed in between fails instead of splicing two versions). `retries`
// (RemoteOptions) counts the failed attempts in a row that brought no new byte; each waits the
// backoff first, woken at once by the StreamCancel.
// Invariant: the bytes handed out are the resource's, each once and in order.
// Thread safety: one thread (the reader); cancel through the StreamCancel given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "conveyor/storage.h"

namespace conveyor::detail {

class ResumingStream {
 public:
  // `cancel` must outlive the stream.
  ResumingStream(std::string name, std::unique_ptr<ByteStream> source, const RemoteOptions& options,
                 const StreamCancel& cancel);
  ~ResumingStream();
  ResumingStream(const ResumingStream&) = delete;
  ResumingStream& operator=(const ResumingStream&) = delete;

  // The next bytes, valid until the next call; empty at the end. Throws std::runtime_error
  // "NAME: REASON (N attempts over T s)" once the retries are spent, or at once for a failure no
  // attempt can mend (HTTP 404, a resource that changed); StreamCancelled.
  std::span<const uint8_t> next();
  // Reads what is left and drops it, so that the source's own end is checked too (a command's
  // exit status) after the reader saw the archive's end. Throws as next().
  void finish();
  const std::string& name() const { return name_; }

 private:
  static constexpr size_t kCheckedTail = 64 * 1024;
  void remember(std::span<const uint8_t> bytes);
  // Checks the re-read bytes [at, at + bytes.size()) against the remembered tail.
  void check_again(uint64_t at, std::span<const uint8_t> bytes) const;

  std::string name_;
  std::unique_ptr<ByteStream> source_;
  const RemoteOptions options_;
  const StreamCancel& cancel_;
  bool running_ = false;  // an attempt is in progress
  bool ended_ = false;
  uint64_t delivered_ = 0;     // bytes handed out
  uint64_t position_ = 0;      // of the running attempt: the next byte's offset in the resource
  std::vector<uint8_t> tail_;  // the last kCheckedTail bytes handed out, as a ring by offset
};

}  // namespace conveyor::detail
