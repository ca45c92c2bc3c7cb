// Streamed GETs (http.h): one plain GET per resource, its body handed on as it arrives, resumed
// with a Range request after a failed attempt.
#include <curl/curl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/clock.h"
#include "storage/http.h"

namespace conveyor::detail {

namespace {

constexpr size_t kHeldBody = 1 << 20;  // body bytes held before the transfer pauses

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
  long status = 0;             // of the final response, read once its body starts
  bool error_status = false;   // the body of a status other than 2xx came: stopped unread
  std::exception_ptr failure;  // what a callback caught; rethrown by pump()
  bool paused = false;
  std::vector<uint8_t> pending;  // body bytes arrived, not handed out yet
  std::vector<uint8_t> handed;   // the bytes handed out last
  // Headers of the latest response (a redirect's are replaced by the next one's).
  std::string content_range, etag, last_modified;
  int64_t content_length = -1;

  Transfer() = default;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  // Also when the constructor of HttpStreamHandles throws half-way.
  ~Transfer() {
    detach();
    if (headers != nullptr) curl_slist_free_all(headers);
    if (curl != nullptr) curl_easy_cleanup(curl);
    if (multi != nullptr) curl_multi_cleanup(multi);
  }

  // libcurl's C callbacks: no exception leaves them (caught into `failure`); returning fewer
  // bytes than given stops the transfer.
  static size_t on_body(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Transfer*>(self_ptr);
    const size_t bytes = one * n;
    try {
      if (self->status == 0) curl_easy_getinfo(self->curl, CURLINFO_RESPONSE_CODE, &self->status);
      if (self->status < 200 || self->status >= 300) {
        self->error_status = true;  // an error page: its status is the answer, not its body
        return 0;
      }
      if (self->pending.size() >= kHeldBody) {
        self->paused = true;
        return CURL_WRITEFUNC_PAUSE;  // delivered again once unpaused
      }
      self->pending.insert(self->pending.end(), reinterpret_cast<const uint8_t*>(data),
                           reinterpret_cast<const uint8_t*>(data) + bytes);
      return bytes;
    } catch (...) {
      self->failure = std::current_exception();
      return 0;
    }
  }

  static size_t on_header(char* data, size_t one, size_t n, void* self_ptr) {
    auto* self = static_cast<Transfer*>(self_ptr);
    const size_t bytes = one * n;
    try {
      std::string value;
      long status = 0;
      if (parse_status_line(data, bytes, status)) {  // a new response begins
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
        parse_content_length(value, self->content_length);
      }
      return bytes;
    } catch (...) {
      self->failure = std::current_exception();
      return 0;
    }
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
    error_status = false;
    failure = nullptr;
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
  void pump(int timeout_ms, const StreamCancel& cancel) {
    int running = 0;
    curl_multi_perform(multi, &running);
    int left = 0;
    while (CURLMsg* message = curl_multi_info_read(multi, &left)) {
      if (message->msg == CURLMSG_DONE && message->easy_handle == curl) {
        done = true;
        result = message->data.result;
      }
    }
    if (failure) std::rethrow_exception(std::exchange(failure, nullptr));
    if (status == 0) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (done || !pending.empty()) return;
    curl_waitfd wake{cancel.fd(), CURL_WAIT_POLLIN, 0};
    curl_multi_poll(multi, &wake, 1, timeout_ms, nullptr);
    if (cancel.cancelled()) throw StreamCancelled();
  }
};

HttpStreamHandles::HttpStreamHandles(const RemoteOptions& options)
    : transfer_(std::make_unique<Transfer>()) {
  ensure_curl_initialised();
  Transfer& t = *transfer_;
  t.multi = curl_multi_init();
  t.curl = curl_easy_init();
  if (t.multi == nullptr || t.curl == nullptr) {
    throw std::runtime_error("tar_shards: libcurl handles could not be made");
  }
  CURL* c = t.curl;
  set_handle_options(c, options, false);  // a whole shard may take longer than any deadline
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, t.error);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Transfer::on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &Transfer::on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 256L * 1024);
}

HttpStreamHandles::~HttpStreamHandles() = default;

namespace {

class HttpStream final : public ByteStream {
 public:
  HttpStream(HttpStreamHandles::Transfer& transfer, std::string url, const RemoteOptions& options,
             const StreamCancel& cancel)
      : t_(transfer), url_(std::move(url)), options_(options), cancel_(cancel), budget_(options) {}
  ~HttpStream() override { stop(); }

  uint64_t start(uint64_t offset) override {
    // If-Range takes a strong ETag, else the date: a resource changed since gets a 200.
    const bool strong = !etag_.empty() && etag_.rfind("W/", 0) != 0;
    budget_.waiting();
    if (budget_.spent()) throw budget_.failure();
    t_.attach(url_, offset, strong ? etag_ : last_modified_);
    const auto deadline = Clock::now() + options_.request_timeout;
    while (t_.pending.empty() && !t_.done) {  // until the body starts, or the transfer ends
      if (budget_.spent()) throw budget_.failure();
      if (Clock::now() >= deadline) {
        throw StreamFailure("no answer within " + seconds_text(options_.request_timeout) +
                                " (ShardOptions::request_timeout)",
                            true);
      }
      t_.pump(milliseconds_until(std::min(deadline, budget_.end())), cancel_);
    }
    const long status = t_.status;
    if (t_.done && t_.result != CURLE_OK && t_.pending.empty() && !t_.error_status) {
      throw StreamFailure(curl_reason(t_.result, t_.error, status), transient_curl_code(t_.result));
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
      position_ = offset;
    } else if (status != 200) {
      throw StreamFailure("HTTP " + std::to_string(status) + " (neither 200 nor 206)", false);
    } else {
      position_ = 0;
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

  Bytes read() override {
    t_.handed.clear();
    budget_.waiting();
    const auto deadline = Clock::now() + options_.request_timeout;
    while (t_.pending.empty()) {
      if (t_.done) {
        if (t_.result == CURLE_OK) return {};
        throw StreamFailure(curl_reason(t_.result, t_.error, t_.status),
                            transient_curl_code(t_.result));
      }
      if (t_.paused) {
        t_.paused = false;
        curl_easy_pause(t_.curl, CURLPAUSE_CONT);  // may deliver the held bytes at once
        continue;
      }
      if (budget_.spent()) throw budget_.failure();
      if (Clock::now() >= deadline) {
        throw StreamFailure("no bytes for " + seconds_text(options_.request_timeout) +
                                " (ShardOptions::request_timeout)",
                            true);
      }
      t_.pump(milliseconds_until(std::min(deadline, budget_.end())), cancel_);
    }
    std::swap(t_.pending, t_.handed);
    position_ += t_.handed.size();
    budget_.handed(position_);
    return {t_.handed.data(), t_.handed.size()};
  }

  void stop() override { t_.detach(); }

 private:
  HttpStreamHandles::Transfer& t_;
  std::string url_;
  const RemoteOptions options_;
  const StreamCancel& cancel_;
  StreamBudget budget_;
  uint64_t position_ = 0;  // of the attempt: the offset of the next byte in the resource
  bool first_response_ = true;
  int64_t length_ = -1;  // of the whole resource, as the first response said; -1 unknown
  std::string etag_, last_modified_;
};

}  // namespace

std::unique_ptr<ByteStream> open_http_stream(HttpStreamHandles& handles, const std::string& url,
                                             const RemoteOptions& options,
                                             const StreamCancel& cancel) {
  return std::make_unique<HttpStream>(handles.transfer(), url, options, cancel);
}

}  // namespace conveyor::detail
