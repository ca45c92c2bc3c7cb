// datasets/storage/clock.h (build-only): the deadlines of remote reads, the bound of a whole
// stream (StreamBudget), and how messages give a duration; shared by the HTTP client, the streams
// and the commands.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "conveyor/storage.h"

namespace conveyor::detail {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline`, for one wait: 0 .. 1000 (a wait of at most a second, so a
// loop around it checks its other conditions at least that often).
inline int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
}

// "1.5 s"
inline std::string seconds_text(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

// backoff_initial * 2^(retry - 1), at most backoff_max: the wait before retry `retry` (1, 2, ...).
inline std::chrono::milliseconds backoff_before(int retry, std::chrono::milliseconds initial,
                                                std::chrono::milliseconds most) {
  auto wait = initial;
  for (int k = 1; k < retry && wait < most; ++k) wait *= 2;
  return std::min(wait, most);
}

// RemoteOptions::min_bytes_per_second over one stream, across its attempts (one per ByteStream):
// once the stream has reached byte N of its resource, the time it has waited for its source may
// be at most (retries + 1) x request_timeout + retries x backoff_max + N / min_bytes_per_second,
// so a silent source still gets each of its attempts. The clock runs from the first start()
// on, through the waits of start() and read() and the backoff between attempts, and stops while
// the consumer holds bytes handed to it (from a read() that returned bytes to the next call).
class StreamBudget {
 public:
  explicit StreamBudget(const RemoteOptions& options)
      : grace_(options.request_timeout * (options.retries + 1) +
               options.backoff_max * options.retries),
        floor_(options.min_bytes_per_second) {}

  // The stream waits for its source from now on (the clock runs, if it did not already).
  void waiting() {
    if (running_) return;
    running_ = true;
    since_ = Clock::now();
  }
  // Bytes up to `position` of the resource were handed to the consumer: the clock stops.
  void handed(uint64_t position) {
    reached_ = std::max(reached_, position);
    if (!running_) return;
    waited_ += Clock::now() - since_;
    running_ = false;
  }
  // The latest time the wait in progress may end; Clock::time_point::max() without a floor.
  Clock::time_point end() const {
    if (floor_ == 0) return Clock::time_point::max();
    const double left = allowed_seconds() - waited_seconds();
    if (left > kForever) return Clock::time_point::max();
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(std::max(left, 0.0)));
  }
  // True once the budget is spent.
  bool spent() const { return floor_ != 0 && waited_seconds() > allowed_seconds(); }
  // What a spent budget fails the stream with: not transient (no attempt can mend it); `more`
  // is added to the reason (a command's stderr).
  StreamFailure failure(const std::string& more = std::string()) const {
    char text[256];
    std::snprintf(text, sizeof text,
                  "too slow: %llu bytes after %.1f s of waiting, when %.1f s ((retries + 1) x "
                  "request_timeout + retries x backoff_max) plus 1 s per %llu bytes is allowed "
                  "(ShardOptions::min_bytes_per_second)",
                  static_cast<unsigned long long>(reached_), waited_seconds(),
                  std::chrono::duration<double>(grace_).count(),
                  static_cast<unsigned long long>(floor_));
    return StreamFailure(text + more, false);
  }

 private:
  static constexpr double kForever = 1e9;  // seconds: no deadline within reach
  double allowed_seconds() const {
    return std::chrono::duration<double>(grace_).count() +
           static_cast<double>(reached_) / static_cast<double>(floor_);
  }
  double waited_seconds() const {
    const Clock::duration now_waiting = running_ ? Clock::now() - since_ : Clock::duration{};
    return std::chrono::duration<double>(waited_ + now_waiting).count();
  }

  const std::chrono::milliseconds grace_;
  const uint64_t floor_;  // bytes per second; 0: none
  uint64_t reached_ = 0;  // the furthest byte of the resource handed out
  Clock::duration waited_{};
  bool running_ = false;
  Clock::time_point since_;
};

}  // namespace conveyor::detail
