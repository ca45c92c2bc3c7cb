// datasets/src/http.h (build-only): HTTP(S) GETs through libcurl for tar_shards, whole or as a
// byte range, with retries, backoff and a deadline on every request; and the streamed GET of a
// whole shard for streaming mode (libcurl's body fed to libarchive as it arrives).
//
// Invariant: one HttpClient is one libcurl easy handle, so consecutive requests to the same host
// reuse its connection (keep-alive); nothing else touches the handle.
// Thread safety: an HttpClient is used by one thread at a time (one per worker). Any number of
// clients run at once; libcurl's global initialisation happens once, before the first handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/datasets.h"
#include "shard_stream.h"

namespace conveyor {
namespace detail {

class HttpClient {
 public:
  explicit HttpClient(const ShardOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // The whole resource at `url` into `out`. Throws std::runtime_error naming the URL, the HTTP
  // status or libcurl's reason, and the attempts made.
  void get(const std::string& url, std::vector<uint8_t>& out);
  // As get(), but returns false for a 404 or 410 (the resource does not exist) instead of
  // throwing.
  bool get_if_exists(const std::string& url, std::vector<uint8_t>& out);

  // Bytes [offset, offset + size) of `url` into `out` (reusing its capacity), through a Range
  // request. Throws std::runtime_error naming the URL and the range: after the retries for a
  // transient failure; at once when the resource ends before the range does (truncated), for a
  // 4xx other than 408 and 429, or for a server that ignores Range.
  void get_range(const std::string& url, uint64_t offset, uint64_t size, std::vector<uint8_t>& out);

  // Up to `size` bytes of `url` from `offset` into `out`: fewer where the resource ends inside
  // the range, none when it ends at or before `offset` (reading a resource of unknown length in
  // chunks). Retries and throws as get_range() does, except for the short ends.
  void get_chunk(const std::string& url, uint64_t offset, uint64_t size, std::vector<uint8_t>& out);

  // What `url`'s server does with a Range request, found with one request for its first byte
  // (no retry): kIgnored when it answers 200 with the whole resource. kUnknown for any failure,
  // which the reads then meet and report.
  enum class RangeSupport { kHonoured, kIgnored, kUnknown };
  RangeSupport range_support(const std::string& url);

 private:
  // Returns false for a 404 or 410 when `missing_ok`, else throws for them too.
  bool fetch(const std::string& url, uint64_t offset, uint64_t size, bool exact, bool missing_ok,
             std::vector<uint8_t>& out);
  struct Handle;
  std::unique_ptr<Handle> handle_;
  ShardOptions options_;
};

// Ranged GETs started ahead of need: up to `in_flight` at once on their own connections (a libcurl
// multi handle), so that the requests for a worker's next samples travel while it decodes.
// Only the happy path lives here: take() hands over a range that arrived whole with 206 (or 200
// for a whole resource), and reports anything else as not taken, so that the caller reads it
// again through HttpClient::get_range, with its retries and its errors.
// Thread safety: one per worker, used by that worker only.
class HttpReadAhead {
 public:
  HttpReadAhead(const ShardOptions& options, size_t in_flight);
  ~HttpReadAhead();
  HttpReadAhead(const HttpReadAhead&) = delete;
  HttpReadAhead& operator=(const HttpReadAhead&) = delete;

  struct Range {
    const std::string* url = nullptr;  // must outlive the request
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // Forgets the ranges asked for before (aborting their requests) and starts these, in order.
  void start(const std::vector<Range>& ranges);
  // If `range` was started, waits for it and moves its bytes into `out`: true when they arrived
  // whole. False when it was not started or did not arrive whole.
  bool take(const Range& range, std::vector<uint8_t>& out);

 private:
  struct Transfers;
  std::unique_ptr<Transfers> transfers_;
};

// The libcurl handles of streamed GETs (one easy handle on a multi handle), kept by a stream's
// reader across shards, so that consecutive shards on one server reuse the connection.
// Thread safety: one thread (the reader).
class HttpStreamHandles {
 public:
  explicit HttpStreamHandles(const ShardOptions& options);
  ~HttpStreamHandles();
  HttpStreamHandles(const HttpStreamHandles&) = delete;
  HttpStreamHandles& operator=(const HttpStreamHandles&) = delete;
  struct Transfer;  // http.cpp
  Transfer& transfer() { return *transfer_; }

 private:
  std::unique_ptr<Transfer> transfer_;
};

// A remote shard's body through one plain GET, handed on as it arrives (at most about 1 MiB
// held: the transfer pauses until libarchive takes it), with no Range needed. After a dropped
// connection, a timeout or a retryable status, the next attempt asks for the rest with
// "Range: bytes=N-" (and If-Range, where the first response had an ETag or Last-Modified): a 206
// goes on at byte N; a 200 (a server that ignores Range, or a changed resource) starts over,
// and ShardByteStream drops the bytes already read after checking them. request_timeout bounds
// every wait for the next bytes, not the whole body. Errors name the URL and the HTTP status.
std::unique_ptr<ShardByteStream> open_http_stream(HttpStreamHandles& handles,
                                                  const std::string& url,
                                                  const ShardOptions& options,
                                                  const ReadCancel& cancel);

}  // namespace detail
}  // namespace conveyor
