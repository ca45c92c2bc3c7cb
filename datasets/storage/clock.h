// datasets/storage/clock.h (build-only): the deadlines of remote reads, and how messages give a
// duration; shared by the HTTP client, the streams and the commands.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

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

}  // namespace conveyor::detail
