// HttpClient (http.h): libcurl easy handles for whole and ranged GETs, and the libcurl helpers
// that the read-ahead and the streamed GETs share.
#include "storage/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "storage/clock.h"

namespace conveyor::detail {

// A function-local static: thread-safe, and no cleanup that could race with a late handle.
void ensure_curl_initialised() {
  static const CURLcode status = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (status != CURLE_OK) {
    throw std::runtime_error(std::string("tar_shards: libcurl failed to initialise: ") +
                             curl_easy_strerror(status));
  }
}

// A refused, reset or timed-out connection, a name that did not resolve (yet), a transfer cut
// short.
bool transient_curl_code(int code) {
  switch (static_cast<CURLcode>(code)) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

bool transient_status(long status) { return status >= 500 || status == 408 || status == 429; }

std::string curl_reason(int code, const char* error, long status) {
  std::string reason = curl_easy_strerror(static_cast<CURLcode>(code));
  if (error != nullptr && error[0] != '\0') reason += " (" + std::string(error) + ")";
  if (status != 0) reason += ", HTTP " + std::to_string(status);
  return reason;
}

bool header_is(const char* data, size_t bytes, const char* name, std::string& value) {
  const size_t length = std::strlen(name);
  if (bytes <= length) return false;
  for (size_t i = 0; i < length; ++i) {
    if (std::tolower(static_cast<unsigned char>(data[i])) != name[i]) return false;
  }
  std::string text(data + length, bytes - length);
  const auto first = text.find_first_not_of(" \t");
  const auto last = text.find_last_not_of(" \t\r\n");
  value = first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
  return true;
}

void set_handle_options(void* handle, const RemoteOptions& options, bool request_deadline) {
  CURL* c = handle;
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "conveyor-tar-shards");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options.connect_timeout.count()));
  if (request_deadline) {
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options.request_timeout.count()));
  }
}

namespace {

constexpr const char* kRangeIgnored =
    "the server ignored the Range request (HTTP 200 with the whole resource): random access "
    "reads each sample with a Range request, so it needs a server that honours them; streaming "
    "(ShardOptions::streaming, conveyor-bench --streaming) reads each shard with one plain GET "
    "and works with this server";

}  // namespace

struct HttpClient::Handle {
  CURL* curl = nullptr;
  char error[CURL_ERROR_SIZE] = {};

  // The transfer in progress.
  std::vector<uint8_t>* out = nullptr;
  uint64_t limit = 0;         // most body bytes accepted (a range's size); 0: no limit
  bool overflow = false;      // the body went past `limit` (a server that ignored Range)
  long status = 0;            // of the final response, read once the body starts
  std::string content_range;  // "bytes a-b/total" or "bytes */total", if sent

  Handle() {
    ensure_curl_initialised();
    curl = curl_easy_init();
    if (curl == nullptr) throw std::runtime_error("tar_shards: curl_easy_init failed");
  }
  ~Handle() { curl_easy_cleanup(curl); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  static size_t on_body(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Handle*>(self_ptr);
    const size_t bytes = one * n;
    if (self->status == 0) curl_easy_getinfo(self->curl, CURLINFO_RESPONSE_CODE, &self->status);
    if (self->status < 200 || self->status >= 300) return bytes;  // an error page: dropped
    if (self->limit != 0 && self->out->size() + bytes > self->limit) {
      self->overflow = true;
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    self->out->insert(self->out->end(), reinterpret_cast<const uint8_t*>(data),
                      reinterpret_cast<const uint8_t*>(data) + bytes);
    return bytes;
  }

  static size_t on_header(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Handle*>(self_ptr);
    const size_t bytes = one * n;
    std::string value;
    if (header_is(data, bytes, "content-range:", value)) self->content_range = value;
    return bytes;
  }
};

HttpClient::HttpClient(const RemoteOptions& options)
    : handle_(std::make_unique<Handle>()), options_(options) {
  if (options_.retries < 0) throw std::invalid_argument("RemoteOptions: retries must be >= 0");
  CURL* c = handle_->curl;
  set_handle_options(c, options_, true);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, handle_->error);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Handle::on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, handle_.get());
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &Handle::on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, handle_.get());
}

HttpClient::~HttpClient() = default;

namespace {

// What one attempt came to.
enum class Outcome { kDone, kRetry, kFail };

}  // namespace

bool HttpClient::get_if_exists(const std::string& url, std::vector<uint8_t>& out) {
  return fetch(url, 0, 0, true, out);
}

void HttpClient::get_range(const std::string& url, uint64_t offset, uint64_t size,
                           std::vector<uint8_t>& out) {
  if (size == 0) throw std::invalid_argument("HttpClient::get_range: size 0");
  fetch(url, offset, size, false, out);
}

bool HttpClient::fetch(const std::string& url, uint64_t offset, uint64_t size, bool missing_ok,
                       std::vector<uint8_t>& out) {
  const bool ranged = size != 0;
  std::string range;
  std::string what = "GET " + url;
  if (ranged) {
    range = std::to_string(offset) + "-" + std::to_string(offset + size - 1);
    what += " (bytes " + range + ")";
  }
  Handle& h = *handle_;
  CURL* c = h.curl;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_RANGE, ranged ? range.c_str() : nullptr);
  if (ranged && out.capacity() < size) out.reserve(size + size / 4);

  const auto start = std::chrono::steady_clock::now();
  const int attempts = options_.retries + 1;
  std::string reason;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) {
      std::this_thread::sleep_for(
          backoff_before(attempt, options_.backoff_initial, options_.backoff_max));
    }
    out.clear();
    h.out = &out;
    h.limit = size;
    h.overflow = false;
    h.status = 0;
    h.content_range.clear();
    h.error[0] = '\0';
    const CURLcode code = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    h.out = nullptr;

    Outcome outcome = Outcome::kFail;
    bool range_ignored = false;
    if (code == CURLE_WRITE_ERROR && h.overflow) {
      if (status == 200 && ranged) {
        reason = kRangeIgnored;
        range_ignored = true;
      } else {
        reason = "HTTP " + std::to_string(status) + " sent more than the " + std::to_string(size) +
                 " bytes asked for";
      }
    } else if (code != CURLE_OK) {
      reason = curl_reason(code, h.error, status);
      outcome = transient_curl_code(code) ? Outcome::kRetry : Outcome::kFail;
    } else if (status == 416 && ranged) {
      reason = "HTTP 416: the resource ends before byte " + std::to_string(offset) +
               (h.content_range.empty() ? "" : " (Content-Range: " + h.content_range + ")") +
               "; truncated since the index was written?";
    } else if (missing_ok && (status == 404 || status == 410)) {
      out.clear();
      return false;
    } else if (status < 200 || status >= 300) {
      reason = "HTTP " + std::to_string(status);
      outcome = transient_status(status) ? Outcome::kRetry : Outcome::kFail;
    } else if (ranged && out.size() != size) {
      // A 206 whose range the server clipped at the resource's end.
      reason = "HTTP " + std::to_string(status) + " brought " + std::to_string(out.size()) +
               " of " + std::to_string(size) + " bytes" +
               (h.content_range.empty() ? "" : " (Content-Range: " + h.content_range + ")") +
               ": the resource ends inside the range; truncated since the index was written?";
    } else if (ranged && status == 200 && offset != 0) {
      reason = kRangeIgnored;
      range_ignored = true;
    } else {
      outcome = Outcome::kDone;
    }
    if (outcome == Outcome::kDone) return true;
    if (outcome == Outcome::kFail) {
      const std::string message =
          what + ": " + reason +
          (attempt > 0 ? " (attempt " + std::to_string(attempt + 1) + ")" : std::string());
      if (range_ignored) throw RangeIgnored(message);
      throw std::runtime_error(message);
    }
  }
  throw std::runtime_error(what + ": " + reason + " after " + std::to_string(attempts) +
                           " attempts over " +
                           seconds_text(std::chrono::steady_clock::now() - start));
}

}  // namespace conveyor::detail
