// HttpReadAhead (http.h): a worker's next ranged GETs, in flight on a libcurl multi handle while it
// decodes.
#include <curl/curl.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "storage/http.h"

namespace conveyor::detail {

struct HttpReadAhead::Transfers {
  struct Transfer {
    CURL* curl = nullptr;
    Range range;
    std::string range_text;
    std::vector<uint8_t> body;
    bool active = false;         // added to the multi handle, not finished
    bool done = false;           // finished (ok or not)
    bool ok = false;             // finished whole with 206 (or 200 for offset 0 and the whole size)
    bool stopped = false;        // the body was refused: past the range's size, or an error status
    std::exception_ptr failure;  // what the body callback caught; rethrown by take()
  };
  CURLM* multi = nullptr;
  std::vector<Transfer> slots;  // in_flight easy handles, each reused
  std::vector<Range> pending;   // not started yet, in order
  size_t next_pending = 0;

  Transfers() = default;
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;
  // Also when the constructor of HttpReadAhead throws half-way.
  ~Transfers() {
    for (auto& t : slots) {
      if (t.active) curl_multi_remove_handle(multi, t.curl);
      if (t.curl != nullptr) curl_easy_cleanup(t.curl);
    }
    if (multi != nullptr) curl_multi_cleanup(multi);
  }

  // libcurl's C callback: no exception leaves it (caught into `failure`); returning fewer bytes
  // than given stops the transfer. An error page is not read: the range is then read again by
  // HttpClient, which reports its status.
  static size_t on_body(char* data, size_t one, size_t n, void* self_ptr) {
    auto* t = static_cast<Transfer*>(self_ptr);
    const size_t bytes = one * n;
    try {
      long status = 0;
      curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
      if (status < 200 || status >= 300 || t->body.size() + bytes > t->range.size) {
        t->stopped = true;
        return 0;
      }
      t->body.insert(t->body.end(), reinterpret_cast<const uint8_t*>(data),
                     reinterpret_cast<const uint8_t*>(data) + bytes);
      return bytes;
    } catch (...) {
      t->failure = std::current_exception();
      return 0;
    }
  }

  void launch(Transfer& t, const Range& r) {
    t.range = r;
    t.range_text = std::to_string(r.offset) + "-" + std::to_string(r.offset + r.size - 1);
    t.body.clear();
    if (t.body.capacity() < r.size) t.body.reserve(r.size);
    t.done = t.ok = t.stopped = false;
    t.failure = nullptr;
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
    t.ok = code == CURLE_OK && !t.stopped && !t.failure && t.body.size() == t.range.size &&
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

HttpReadAhead::HttpReadAhead(const RemoteOptions& options, size_t in_flight)
    : transfers_(std::make_unique<Transfers>()) {
  ensure_curl_initialised();
  transfers_->multi = curl_multi_init();
  if (transfers_->multi == nullptr) throw std::runtime_error("tar_shards: curl_multi_init failed");
  transfers_->slots.resize(std::max<size_t>(1, in_flight));
  for (auto& t : transfers_->slots) {
    t.curl = curl_easy_init();
    if (t.curl == nullptr) throw std::runtime_error("tar_shards: curl_easy_init failed");
    set_handle_options(t.curl, options, true);
    curl_easy_setopt(t.curl, CURLOPT_WRITEFUNCTION, &Transfers::on_body);
    curl_easy_setopt(t.curl, CURLOPT_WRITEDATA, &t);
  }
}

HttpReadAhead::~HttpReadAhead() = default;

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
  if (mine->failure) std::rethrow_exception(std::exchange(mine->failure, nullptr));
  // The freed handle starts the next range asked for.
  if (x.next_pending < x.pending.size()) {
    x.launch(*mine, x.pending[x.next_pending++]);
    x.pump();
  }
  return ok;
}

}  // namespace conveyor::detail
