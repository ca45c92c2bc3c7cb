// datasets/storage/http.h (build-only): HTTP(S) through libcurl for system_storage(): GETs
// whole or of a byte range, with retries, backoff and a deadline on every request; ranged GETs
// started ahead of need; and the streamed GET of a whole resource (its body handed on as it
// arrives).
//
// Invariant: one HttpClient is one libcurl easy handle, so consecutive requests to the same host
// reuse its connection (keep-alive); nothing else touches the handle.
// Thread safety: each object here is used by one thread at a time (a StorageReader's). Any number
// run at once; libcurl's global initialisation happens once, before the first handle.
// libcurl's callbacks here (body and headers) let no C++ exception out: they catch it, stop the
// transfer, and the caller rethrows it once libcurl returned. A body is held to its cap as it
// arrives, and the body of an error status is not read: its status is the answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/storage.h"

namespace conveyor::detail {

// Thrown by HttpClient's ranged reads when the server answered a Range request with the whole
// resource (HTTP 200): reads at random cannot work with that server, streaming can.
struct RangeIgnored : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// libcurl's global initialisation, once per process; throws when it fails.
void ensure_curl_initialised();
// libcurl's failures (by CURLcode) and HTTP statuses that a later attempt may not meet.
bool transient_curl_code(int code);
bool transient_status(long status);
// The reason libcurl gives for `code`, with its error buffer and the status when there is one.
std::string curl_reason(int code, const char* error, long status);
// Redirects followed per request, at most.
constexpr long kMaxRedirects = 5;
// The options every handle here sets: no signals (worker threads), http and https only, for the
// request and its redirects; redirects followed, to any host (object stores and CDNs redirect
// between regions and hosts), kMaxRedirects at most; TCP_NODELAY and keep-alive, the user agent,
// the connect deadline and, with `request_deadline`, request_timeout for the whole request.
// Throws std::runtime_error if libcurl cannot limit the protocols.
void set_handle_options(void* curl, const RemoteOptions& options, bool request_deadline);
// True when the header line data[0, bytes) is a status line ("HTTP/1.1 302 Found"): a response
// begins; `status` is then its code.
bool parse_status_line(const char* data, size_t bytes, long& status);
// A Content-Length value: true, with `length`, when it is a number that is not negative.
bool parse_content_length(const std::string& value, int64_t& length);
// True when the header line data[0, bytes) is the header `name` ("content-range:", lower case);
// `value` is then its value without the surrounding blanks.
bool header_is(const char* data, size_t bytes, const char* name, std::string& value);

class HttpClient {
 public:
  explicit HttpClient(const RemoteOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // The whole resource at `url` into `out`, at most `max_bytes`; false for a 404 or 410 (it does
  // not exist). Throws std::runtime_error naming the URL, the HTTP status or libcurl's reason,
  // and the attempts; naming the cap, at once, when the body passes `max_bytes` (stopped there)
  // or its Content-Length is over it (refused before the body).
  bool get_if_exists(const std::string& url, uint64_t max_bytes, std::vector<uint8_t>& out);

  // Bytes [offset, offset + size) of `url` into `out` (reusing its capacity), through a Range
  // request. Throws std::runtime_error naming the URL and the range: after the retries for a
  // transient failure; at once when the resource ends before the range does (truncated), or for
  // a 4xx other than 408 and 429; RangeIgnored for a server that ignores Range.
  void get_range(const std::string& url, uint64_t offset, uint64_t size, std::vector<uint8_t>& out);

 private:
  bool fetch(const std::string& url, uint64_t offset, uint64_t size, uint64_t max_bytes,
             bool missing_ok, std::vector<uint8_t>& out);
  struct Handle;
  std::unique_ptr<Handle> handle_;
  RemoteOptions options_;
};

// Ranged GETs started ahead of need: up to `in_flight` at once on their own connections (a libcurl
// multi handle), so that the requests for a worker's next samples travel while it decodes.
// Only the happy path lives here: take() hands over a range that arrived whole with 206 (or 200
// for a whole resource), and reports anything else as not taken, so that the caller reads it
// again through HttpClient::get_range, with its retries and its errors.
class HttpReadAhead {
 public:
  HttpReadAhead(const RemoteOptions& options, size_t in_flight);
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

// The libcurl handles of streamed GETs (one easy handle on a multi handle), kept by a reader
// across streams, so that consecutive shards on one server reuse the connection.
class HttpStreamHandles {
 public:
  explicit HttpStreamHandles(const RemoteOptions& options);
  ~HttpStreamHandles();
  HttpStreamHandles(const HttpStreamHandles&) = delete;
  HttpStreamHandles& operator=(const HttpStreamHandles&) = delete;
  struct Transfer;  // http_stream.cpp
  Transfer& transfer() { return *transfer_; }

 private:
  std::unique_ptr<Transfer> transfer_;
};

// A remote resource's body through one plain GET, handed on as it arrives (at most about 1 MiB
// held: the transfer pauses until it is read), with no Range needed. An attempt after the first
// asks for the rest with "Range: bytes=N-" (and If-Range, where the first response had a strong
// ETag or a Last-Modified): a 206 goes on at byte N; a 200 (a server that ignores Range, or a
// changed resource) starts over. request_timeout bounds every wait for the next bytes, and
// min_bytes_per_second the whole stream (StreamBudget, clock.h). Failures name the HTTP status
// (an error page's body is not read) or libcurl's reason; a resource whose length changed between
// attempts fails for good.
std::unique_ptr<ByteStream> open_http_stream(HttpStreamHandles& handles, const std::string& url,
                                             const RemoteOptions& options,
                                             const StreamCancel& cancel);

}  // namespace conveyor::detail
