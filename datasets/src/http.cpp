// HttpClient: libcurl easy handles for tar_shards' index and ranged member reads.
#include "http.h"

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

namespace conveyor {
namespace detail {

namespace {

// libcurl's global initialisation, once per process and before the first easy handle (a
// function-local static: thread-safe, and no cleanup that could race with a late handle).
void ensure_curl_initialised() {
  static const CURLcode status = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (status != CURLE_OK) {
    throw std::runtime_error(std::string("tar_shards: libcurl failed to initialise: ") +
                             curl_easy_strerror(status));
  }
}

// libcurl failures that a later attempt may not meet: a refused, reset or timed-out connection,
// a name that did not resolve (yet), a transfer cut short.
bool transient(CURLcode code) {
  switch (code) {
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

constexpr const char* kRangeIgnored =
    "the server ignored the Range request (HTTP 200 with the whole resource): random access "
    "reads each sample with a Range request, so it needs a server that honours them; streaming "
    "(ShardOptions::streaming, conveyor-bench --streaming) reads each shard with one plain GET "
    "and works with this server";

// The reason libcurl gives for `code`, with its error buffer and the status when there is one.
std::string curl_reason(CURLcode code, const char* error, long status) {
  std::string reason = curl_easy_strerror(code);
  if (error != nullptr && error[0] != '\0') reason += " (" + std::string(error) + ")";
  if (status != 0) reason += ", HTTP " + std::to_string(status);
  return reason;
}

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline`, for one wait: 0 .. 1000.
int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
}

std::string seconds_text(std::chrono::steady_clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

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
    static constexpr char kName[] = "content-range:";
    constexpr size_t kLength = sizeof kName - 1;
    if (bytes > kLength) {
      bool match = true;
      for (size_t i = 0; i < kLength && match; ++i) {
        match = std::tolower(static_cast<unsigned char>(data[i])) == kName[i];
      }
      if (match) {
        std::string value(data + kLength, bytes - kLength);
        const auto first = value.find_first_not_of(" \t");
        const auto last = value.find_last_not_of(" \t\r\n");
        self->content_range =
            first == std::string::npos ? std::string() : value.substr(first, last - first + 1);
      }
    }
    return bytes;
  }
};

HttpClient::HttpClient(const ShardOptions& options)
    : handle_(std::make_unique<Handle>()), options_(options) {
  if (options_.retries < 0) throw std::invalid_argument("tar_shards: retries must be >= 0");
  CURL* c = handle_->curl;
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // worker threads: no SIGALRM for timeouts
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, handle_->error);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Handle::on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, handle_.get());
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &Handle::on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, handle_.get());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);  // object stores redirect between regions
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "conveyor-tar-shards");
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.request_timeout.count()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
}

HttpClient::~HttpClient() = default;

namespace {

// What one attempt came to.
enum class Outcome { kDone, kRetry, kFail };

}  // namespace

void HttpClient::get(const std::string& url, std::vector<uint8_t>& out) {
  fetch(url, 0, 0, true, false, out);
}

bool HttpClient::get_if_exists(const std::string& url, std::vector<uint8_t>& out) {
  return fetch(url, 0, 0, true, true, out);
}

void HttpClient::get_range(const std::string& url, uint64_t offset, uint64_t size,
                           std::vector<uint8_t>& out) {
  fetch(url, offset, size, true, false, out);
}

void HttpClient::get_chunk(const std::string& url, uint64_t offset, uint64_t size,
                           std::vector<uint8_t>& out) {
  if (size == 0) throw std::invalid_argument("HttpClient::get_chunk: size 0");
  fetch(url, offset, size, false, false, out);
}

bool HttpClient::fetch(const std::string& url, uint64_t offset, uint64_t size, bool exact,
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
      auto wait = options_.backoff_initial;
      for (int k = 1; k < attempt && wait < options_.backoff_max; ++k) wait *= 2;
      std::this_thread::sleep_for(std::min(wait, options_.backoff_max));
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
    if (code == CURLE_WRITE_ERROR && h.overflow) {
      if (status == 200 && ranged) {
        reason = kRangeIgnored;
      } else {
        reason = "HTTP " + std::to_string(status) + " sent more than the " + std::to_string(size) +
                 " bytes asked for";
      }
    } else if (code != CURLE_OK) {
      reason = curl_reason(code, h.error, status);
      outcome = transient(code) ? Outcome::kRetry : Outcome::kFail;
    } else if (status == 416 && ranged && !exact) {
      out.clear();  // the resource ends at or before `offset`
      outcome = Outcome::kDone;
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
    } else if (ranged && out.size() != size && exact) {
      // A 206 whose range the server clipped at the resource's end.
      reason = "HTTP " + std::to_string(status) + " brought " + std::to_string(out.size()) +
               " of " + std::to_string(size) + " bytes" +
               (h.content_range.empty() ? "" : " (Content-Range: " + h.content_range + ")") +
               ": the resource ends inside the range; truncated since the index was written?";
    } else if (ranged && status == 200 && offset != 0) {
      reason = kRangeIgnored;
    } else {
      outcome = Outcome::kDone;
    }
    if (outcome == Outcome::kDone) return true;
    if (outcome == Outcome::kFail) {
      throw std::runtime_error(
          what + ": " + reason +
          (attempt > 0 ? " (attempt " + std::to_string(attempt + 1) + ")" : std::string()));
    }
  }
  throw std::runtime_error(what + ": " + reason + " after " + std::to_string(attempts) +
                           " attempts over " +
                           seconds_text(std::chrono::steady_clock::now() - start));
}

HttpClient::RangeSupport HttpClient::range_support(const std::string& url) {
  Handle& h = *handle_;
  CURL* c = h.curl;
  std::vector<uint8_t> out;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_RANGE, "0-0");
  h.out = &out;
  h.limit = 1;
  h.overflow = false;
  h.status = 0;
  h.content_range.clear();
  h.error[0] = '\0';
  const CURLcode code = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  h.out = nullptr;
  curl_easy_setopt(c, CURLOPT_RANGE, nullptr);
  if (status == 206) return RangeSupport::kHonoured;
  if (status == 200 && code == CURLE_WRITE_ERROR && h.overflow) return RangeSupport::kIgnored;
  return RangeSupport::kUnknown;
}

// ---------------------------------------------------------------------------------------------
// HttpReadAhead

struct HttpReadAhead::Transfers {
  struct Transfer {
    CURL* curl = nullptr;
    Range range;
    std::string range_text;
    std::vector<uint8_t> body;
    bool active = false;  // added to the multi handle, not finished
    bool done = false;    // finished (ok or not)
    bool ok = false;      // finished whole with 206 (or 200 for offset 0 and the whole size)
    bool overflow = false;
  };
  CURLM* multi = nullptr;
  std::vector<Transfer> slots;  // in_flight easy handles, each reused
  std::vector<Range> pending;   // not started yet, in order
  size_t next_pending = 0;

  static size_t on_body(char* data, size_t one, size_t n, void* self_ptr) {
    auto* t = static_cast<Transfer*>(self_ptr);
    const size_t bytes = one * n;
    if (t->body.size() + bytes > t->range.size) {
      t->overflow = true;
      return 0;
    }
    t->body.insert(t->body.end(), reinterpret_cast<const uint8_t*>(data),
                   reinterpret_cast<const uint8_t*>(data) + bytes);
    return bytes;
  }

  void launch(Transfer& t, const Range& r) {
    t.range = r;
    t.range_text = std::to_string(r.offset) + "-" + std::to_string(r.offset + r.size - 1);
    t.body.clear();
    if (t.body.capacity() < r.size) t.body.reserve(r.size);
    t.done = t.ok = t.overflow = false;
    curl_easy_setopt(t.curl, CURLOPT_URL, r.url->c_str());
    curl_easy_setopt(t.curl, CURLOPT_RANGE, t.range_text.c_str());
    curl_multi_add_handle(multi, t.curl);
    t.active = true;
  }

  void finish(Transfer& t, CURLcode code) {
    long status = 0;
    curl_easy_getinfo(t.curl, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(multi, t.curl);
    t.active = false;
    t.done = true;
    t.ok = code == CURLE_OK && !t.overflow && t.body.size() == t.range.size &&
           (status == 206 || (status == 200 && t.range.offset == 0));
  }

  void abort(Transfer& t) {
    if (t.active) curl_multi_remove_handle(multi, t.curl);
    t.active = false;
    t.done = false;
    t.range = Range{};
  }

  // Lets libcurl move every transfer on, and records those that finished.
  void pump() {
    int running = 0;
    curl_multi_perform(multi, &running);
    int left = 0;
    while (CURLMsg* message = curl_multi_info_read(multi, &left)) {
      if (message->msg != CURLMSG_DONE) continue;
      for (Transfer& t : slots) {
        if (t.curl == message->easy_handle && t.active) finish(t, message->data.result);
      }
    }
  }
};

HttpReadAhead::HttpReadAhead(const ShardOptions& options, size_t in_flight)
    : transfers_(std::make_unique<Transfers>()) {
  ensure_curl_initialised();
  transfers_->multi = curl_multi_init();
  if (transfers_->multi == nullptr) throw std::runtime_error("tar_shards: curl_multi_init failed");
  transfers_->slots.resize(std::max<size_t>(1, in_flight));
  for (auto& t : transfers_->slots) {
    t.curl = curl_easy_init();
    if (t.curl == nullptr) throw std::runtime_error("tar_shards: curl_easy_init failed");
    curl_easy_setopt(t.curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t.curl, CURLOPT_WRITEFUNCTION, &Transfers::on_body);
    curl_easy_setopt(t.curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(t.curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(t.curl, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(t.curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(t.curl, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(t.curl, CURLOPT_USERAGENT, "conveyor-tar-shards");
    curl_easy_setopt(t.curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(options.request_timeout.count()));
    curl_easy_setopt(t.curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options.connect_timeout.count()));
  }
}

HttpReadAhead::~HttpReadAhead() {
  for (auto& t : transfers_->slots) {
    if (t.active) curl_multi_remove_handle(transfers_->multi, t.curl);
    if (t.curl != nullptr) curl_easy_cleanup(t.curl);
  }
  if (transfers_->multi != nullptr) curl_multi_cleanup(transfers_->multi);
}

void HttpReadAhead::start(const std::vector<Range>& ranges) {
  Transfers& x = *transfers_;
  for (auto& t : x.slots) x.abort(t);
  x.pending = ranges;
  x.next_pending = 0;
  for (auto& t : x.slots) {
    if (x.next_pending == x.pending.size()) break;
    x.launch(t, x.pending[x.next_pending++]);
  }
  x.pump();  // sends the requests
}

bool HttpReadAhead::take(const Range& range, std::vector<uint8_t>& out) {
  Transfers& x = *transfers_;
  auto same = [&](const Range& r) {
    return r.url != nullptr && *r.url == *range.url && r.offset == range.offset &&
           r.size == range.size;
  };
  Transfers::Transfer* mine = nullptr;
  for (auto& t : x.slots) {
    if ((t.active || t.done) && same(t.range)) mine = &t;
  }
  if (mine == nullptr) return false;
  while (!mine->done) {
    x.pump();
    if (!mine->done) curl_multi_poll(x.multi, nullptr, 0, 100, nullptr);
  }
  const bool ok = mine->ok;
  if (ok) out.swap(mine->body);
  mine->done = false;
  mine->range = Range{};
  // The freed handle starts the next range asked for.
  if (x.next_pending < x.pending.size()) {
    x.launch(*mine, x.pending[x.next_pending++]);
    x.pump();
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Streamed GETs

namespace {

constexpr size_t kHeldBody = 1 << 20;  // body bytes held before the transfer pauses

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

}  // namespace

struct HttpStreamHandles::Transfer {
  CURLM* multi = nullptr;
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;  // If-Range of the attempt
  char error[CURL_ERROR_SIZE] = {};
  std::string range;

  // The attempt in progress.
  bool attached = false;  // on the multi handle
  bool done = false;      // finished, `result` says how
  CURLcode result = CURLE_OK;
  long status = 0;  // of the final response, read once its body starts
  bool paused = false;
  std::vector<uint8_t> pending;  // body bytes arrived, not handed out yet
  std::vector<uint8_t> handed;   // the bytes handed out last
  // Headers of the latest response (a redirect's are replaced by the next one's).
  std::string content_range, etag, last_modified;
  int64_t content_length = -1;

  static size_t on_body(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Transfer*>(self_ptr);
    const size_t bytes = one * n;
    if (self->status == 0) curl_easy_getinfo(self->curl, CURLINFO_RESPONSE_CODE, &self->status);
    if (self->status < 200 || self->status >= 300) return bytes;  // an error page: dropped
    if (self->pending.size() >= kHeldBody) {
      self->paused = true;
      return CURL_WRITEFUNC_PAUSE;  // delivered again once unpaused
    }
    self->pending.insert(self->pending.end(), reinterpret_cast<const uint8_t*>(data),
                         reinterpret_cast<const uint8_t*>(data) + bytes);
    return bytes;
  }

  static size_t on_header(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Transfer*>(self_ptr);
    const size_t bytes = one * n;
    std::string value;
    if (bytes >= 5 && std::strncmp(data, "HTTP/", 5) == 0) {  // a new response begins
      self->content_range.clear();
      self->etag.clear();
      self->last_modified.clear();
      self->content_length = -1;
    } else if (header_is(data, bytes, "content-range:", value)) {
      self->content_range = value;
    } else if (header_is(data, bytes, "etag:", value)) {
      self->etag = value;
    } else if (header_is(data, bytes, "last-modified:", value)) {
      self->last_modified = value;
    } else if (header_is(data, bytes, "content-length:", value)) {
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (end != value.c_str() && *end == '\0' && v >= 0) self->content_length = v;
    }
    return bytes;
  }

  // Starts a GET of `url` (from byte `offset` when it is not 0, with If-Range `validator`).
  void attach(const std::string& url, uint64_t offset, const std::string& validator) {
    detach();
    range = offset > 0 ? std::to_string(offset) + "-" : std::string();
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_RANGE, range.empty() ? nullptr : range.c_str());
    if (headers != nullptr) curl_slist_free_all(headers);
    headers = nullptr;
    if (offset > 0 && !validator.empty()) {
      headers = curl_slist_append(nullptr, ("If-Range: " + validator).c_str());
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    done = false;
    result = CURLE_OK;
    status = 0;
    paused = false;
    pending.clear();
    handed.clear();
    content_range.clear();
    etag.clear();
    last_modified.clear();
    content_length = -1;
    error[0] = '\0';
    if (curl_multi_add_handle(multi, curl) != CURLM_OK) {
      throw StreamFailure("curl_multi_add_handle failed", false);
    }
    attached = true;
  }

  // Ends the attempt; a finished transfer leaves its connection to the next one.
  void detach() {
    if (!attached) return;
    curl_multi_remove_handle(multi, curl);
    attached = false;
    paused = false;
    pending.clear();
  }

  // Lets libcurl move the transfer on, waiting up to `timeout_ms` for its socket (or `cancel`).
  void pump(int timeout_ms, const ReadCancel& cancel) {
    int running = 0;
    curl_multi_perform(multi, &running);
    int left = 0;
    while (CURLMsg* message = curl_multi_info_read(multi, &left)) {
      if (message->msg == CURLMSG_DONE && message->easy_handle == curl) {
        done = true;
        result = message->data.result;
      }
    }
    if (status == 0) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (done || !pending.empty()) return;
    curl_waitfd wake{cancel.fd(), CURL_WAIT_POLLIN, 0};
    curl_multi_poll(multi, &wake, 1, timeout_ms, nullptr);
    if (cancel.cancelled()) throw ReadCancelled();
  }
};

HttpStreamHandles::HttpStreamHandles(const ShardOptions& options)
    : transfer_(std::make_unique<Transfer>()) {
  ensure_curl_initialised();
  Transfer& t = *transfer_;
  t.multi = curl_multi_init();
  t.curl = curl_easy_init();
  if (t.multi == nullptr || t.curl == nullptr) {
    if (t.curl != nullptr) curl_easy_cleanup(t.curl);
    if (t.multi != nullptr) curl_multi_cleanup(t.multi);
    throw std::runtime_error("tar_shards: libcurl handles could not be made");
  }
  CURL* c = t.curl;
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, t.error);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Transfer::on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &Transfer::on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 256L * 1024);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "conveyor-tar-shards");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options.connect_timeout.count()));
}

HttpStreamHandles::~HttpStreamHandles() {
  Transfer& t = *transfer_;
  t.detach();
  if (t.headers != nullptr) curl_slist_free_all(t.headers);
  curl_easy_cleanup(t.curl);
  curl_multi_cleanup(t.multi);
}

namespace {

class HttpShardStream final : public ShardByteStream {
 public:
  HttpShardStream(HttpStreamHandles::Transfer& transfer, std::string url,
                  const ShardOptions& options, const ReadCancel& cancel)
      : ShardByteStream(url, options, cancel), t_(transfer), url_(std::move(url)) {}
  ~HttpShardStream() override { stop(); }

 protected:
  uint64_t start(uint64_t offset) override {
    // If-Range takes a strong ETag, else the date: a resource changed since gets a 200.
    const bool strong = !etag_.empty() && etag_.rfind("W/", 0) != 0;
    t_.attach(url_, offset, strong ? etag_ : last_modified_);
    const auto deadline = Clock::now() + options_.request_timeout;
    while (t_.pending.empty() && !t_.done) {  // until the body starts, or the transfer ends
      if (Clock::now() >= deadline) {
        throw StreamFailure("no answer within " + seconds_text(options_.request_timeout) +
                                " (ShardOptions::request_timeout)",
                            true);
      }
      t_.pump(milliseconds_until(deadline), cancel_);
    }
    const long status = t_.status;
    if (t_.done && t_.result != CURLE_OK && t_.pending.empty()) {
      throw StreamFailure(curl_reason(t_.result, t_.error, status), transient(t_.result));
    }
    if (status == 416) {
      throw StreamFailure("HTTP 416 for bytes " + std::to_string(offset) +
                              "-: the resource now ends before the bytes already read (changed "
                              "while being read?)",
                          false);
    }
    if (status < 200 || status >= 300) {
      throw StreamFailure("HTTP " + std::to_string(status), transient_status(status));
    }
    uint64_t from = 0;
    int64_t total = t_.content_length;
    if (status == 206) {
      // "bytes FIRST-LAST/TOTAL"
      unsigned long long first = 0, last = 0, whole = 0;
      const int fields =
          std::sscanf(t_.content_range.c_str(), "bytes %llu-%llu/%llu", &first, &last, &whole);
      if (fields < 2 || first != offset) {
        throw StreamFailure("HTTP 206 with Content-Range '" + t_.content_range +
                                "', not from byte " + std::to_string(offset),
                            false);
      }
      from = offset;
      total = fields == 3 ? static_cast<int64_t>(whole) : -1;
    } else if (status != 200) {
      throw StreamFailure("HTTP " + std::to_string(status) + " (neither 200 nor 206)", false);
    }
    if (first_response_) {
      first_response_ = false;
      length_ = total;
      etag_ = t_.etag;
      last_modified_ = t_.last_modified;
    } else if (length_ >= 0 && total >= 0 && total != length_) {
      throw StreamFailure("the resource is now " + std::to_string(total) + " bytes, not " +
                              std::to_string(length_) + ": it changed while being read",
                          false);
    }
    return from;
  }

  std::span<const uint8_t> read() override {
    t_.handed.clear();
    const auto deadline = Clock::now() + options_.request_timeout;
    while (t_.pending.empty()) {
      if (t_.done) {
        if (t_.result == CURLE_OK) return {};
        throw StreamFailure(curl_reason(t_.result, t_.error, t_.status), transient(t_.result));
      }
      if (t_.paused) {
        t_.paused = false;
        curl_easy_pause(t_.curl, CURLPAUSE_CONT);  // may deliver the held bytes at once
        continue;
      }
      if (Clock::now() >= deadline) {
        throw StreamFailure("no bytes for " + seconds_text(options_.request_timeout) +
                                " (ShardOptions::request_timeout)",
                            true);
      }
      t_.pump(milliseconds_until(deadline), cancel_);
    }
    std::swap(t_.pending, t_.handed);
    return {t_.handed.data(), t_.handed.size()};
  }

  void stop() override { t_.detach(); }

 private:
  HttpStreamHandles::Transfer& t_;
  std::string url_;
  bool first_response_ = true;
  int64_t length_ = -1;  // of the whole resource, as the first response said; -1 unknown
  std::string etag_, last_modified_;
};

}  // namespace

std::unique_ptr<ShardByteStream> open_http_stream(HttpStreamHandles& handles,
                                                  const std::string& url,
                                                  const ShardOptions& options,
                                                  const ReadCancel& cancel) {
  return std::make_unique<HttpShardStream>(handles.transfer(), url, options, cancel);
}

}  // namespace detail
}  // namespace conveyor
