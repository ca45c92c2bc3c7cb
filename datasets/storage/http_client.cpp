// HttpClient (http.h): libcurl easy handles for whole and ranged GETs, and the libcurl helpers
// that the read-ahead and the streamed GETs share.
#include "storage/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
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

bool parse_status_line(const char* data, size_t bytes, long& status) {
  if (bytes < 5 || std::strncmp(data, "HTTP/", 5) != 0) return false;
  const std::string line(data, bytes);
  const size_t space = line.find(' ');
  status = space == std::string::npos ? 0 : std::strtol(line.c_str() + space + 1, nullptr, 10);
  return true;
}

bool parse_content_length(const std::string& value, int64_t& length) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || v < 0 || errno == ERANGE) return false;
  length = v;
  return true;
}

void set_handle_options(void* handle, const RemoteOptions& options, bool request_deadline) {
  CURL* c = handle;
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, kMaxRedirects);
  // http and https only, for the request and every redirect: libcurl's default list for
  // redirects has ftp, and its requests any protocol it was built with.
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85.0: the lists as text; the bitmasks are deprecated
  const bool limited = curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK &&
                       curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") == CURLE_OK;
#else
  const bool limited =
      curl_easy_setopt(c, CURLOPT_PROTOCOLS, long{CURLPROTO_HTTP | CURLPROTO_HTTPS}) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, long{CURLPROTO_HTTP | CURLPROTO_HTTPS}) ==
          CURLE_OK;
#endif
  if (!limited) {
    throw std::runtime_error("tar_shards: libcurl cannot limit requests to http and https");
  }
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

  // Why a callback stopped the transfer (libcurl then says CURLE_WRITE_ERROR).
  enum class Stop {
    kNo,
    kOverLimit,     // the body went past `limit` (a server that ignored Range, an endless body)
    kDeclaredOver,  // a 2xx response's Content-Length is over `limit`: refused before its body
    kErrorStatus,   // the final response is not 2xx: its status is the answer, not its body
    kFailed,        // a callback caught an exception: `failure`
  };

  // The transfer in progress.
  std::vector<uint8_t>* out = nullptr;
  uint64_t limit = 0;  // most body bytes accepted (a range's size, a whole body's cap)
  Stop stopped = Stop::kNo;
  std::exception_ptr failure;  // rethrown once curl_easy_perform returned
  long status = 0;             // of the final response, read once the body starts
  long header_status = 0;      // of the response whose headers arrive (a redirect's, then the next)
  int64_t declared = -1;       // its Content-Length, if sent
  std::string content_range;   // "bytes a-b/total" or "bytes */total", if sent

  Handle() {
    ensure_curl_initialised();
    curl = curl_easy_init();
    if (curl == nullptr) throw std::runtime_error("tar_shards: curl_easy_init failed");
  }
  ~Handle() { curl_easy_cleanup(curl); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  // libcurl's C callbacks: no exception leaves them (caught into `failure`); returning fewer
  // bytes than given stops the transfer.
  static size_t on_body(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Handle*>(self_ptr);
    const size_t bytes = one * n;
    try {
      if (self->status == 0) curl_easy_getinfo(self->curl, CURLINFO_RESPONSE_CODE, &self->status);
      if (self->status < 200 || self->status >= 300) {
        self->stopped = Stop::kErrorStatus;  // an error page: not read
        return 0;
      }
      if (self->out->size() + bytes > self->limit) {
        self->stopped = Stop::kOverLimit;
        return 0;
      }
      self->out->insert(self->out->end(), reinterpret_cast<const uint8_t*>(data),
                        reinterpret_cast<const uint8_t*>(data) + bytes);
      return bytes;
    } catch (...) {
      self->failure = std::current_exception();
      self->stopped = Stop::kFailed;
      return 0;
    }
  }

  static size_t on_header(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Handle*>(self_ptr);
    const size_t bytes = one * n;
    try {
      std::string value;
      if (parse_status_line(data, bytes, self->header_status)) {
        self->declared = -1;
      } else if (header_is(data, bytes, "content-range:", value)) {
        self->content_range = value;
      } else if (header_is(data, bytes, "content-length:", value) &&
                 parse_content_length(value, self->declared) && self->header_status >= 200 &&
                 self->header_status < 300 && static_cast<uint64_t>(self->declared) > self->limit) {
        self->stopped = Stop::kDeclaredOver;
        return 0;
      }
      return bytes;
    } catch (...) {
      self->failure = std::current_exception();
      self->stopped = Stop::kFailed;
      return 0;
    }
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

bool HttpClient::get_if_exists(const std::string& url, uint64_t max_bytes,
                               std::vector<uint8_t>& out) {
  return fetch(url, 0, 0, max_bytes, true, out);
}

void HttpClient::get_range(const std::string& url, uint64_t offset, uint64_t size,
                           std::vector<uint8_t>& out) {
  if (size == 0) throw std::invalid_argument("HttpClient::get_range: size 0");
  fetch(url, offset, size, size, false, out);
}

bool HttpClient::fetch(const std::string& url, uint64_t offset, uint64_t size, uint64_t max_bytes,
                       bool missing_ok, std::vector<uint8_t>& out) {
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
    h.limit = max_bytes;
    h.stopped = Handle::Stop::kNo;
    h.failure = nullptr;
    h.status = 0;
    h.header_status = 0;
    h.declared = -1;
    h.content_range.clear();
    h.error[0] = '\0';
    const CURLcode code = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    h.out = nullptr;
    if (h.failure) std::rethrow_exception(h.failure);

    Outcome outcome = Outcome::kFail;
    bool range_ignored = false;
    const bool over = h.stopped == Handle::Stop::kOverLimit;
    const bool declared_over = h.stopped == Handle::Stop::kDeclaredOver;
    if (code == CURLE_WRITE_ERROR && (over || declared_over)) {
      if (status == 200 && ranged) {
        reason = kRangeIgnored;
        range_ignored = true;
      } else if (ranged) {
        reason = "HTTP " + std::to_string(status) + " sent more than the " + std::to_string(size) +
                 " bytes asked for";
      } else if (declared_over) {
        reason = "its Content-Length, " + std::to_string(h.declared) + " bytes, is over the " +
                 std::to_string(max_bytes) + " bytes accepted; not read";
      } else {
        reason = "its body is longer than the " + std::to_string(max_bytes) +
                 " bytes accepted; stopped there";
      }
    } else if (code != CURLE_OK && h.stopped != Handle::Stop::kErrorStatus) {
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
