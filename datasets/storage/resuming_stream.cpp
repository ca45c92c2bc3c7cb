// ResumingStream (resuming_stream.h): a resource read in one pass over failing attempts.
#include "storage/resuming_stream.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "storage/clock.h"

namespace conveyor::detail {

ResumingStream::ResumingStream(std::string name, std::unique_ptr<ByteStream> source,
                               const RemoteOptions& options, const StreamCancel& cancel)
    : name_(std::move(name)), source_(std::move(source)), options_(options), cancel_(cancel) {}

ResumingStream::~ResumingStream() {
  if (source_) source_->stop();
}

std::span<const uint8_t> ResumingStream::next() {
  if (ended_) return {};
  int failures = 0;  // attempts in a row that brought no new byte
  Clock::time_point first_failure;
  while (true) {
    if (cancel_.cancelled()) throw StreamCancelled();
    try {
      if (!running_) {
        running_ = true;
        position_ = source_->start(delivered_);
        if (position_ > delivered_) {
          throw StreamFailure("the source started at byte " + std::to_string(position_) +
                                  ", past the " + std::to_string(delivered_) + " bytes read",
                              false);
        }
      }
      while (true) {
        const ByteStream::Bytes got = source_->read();
        std::span<const uint8_t> bytes(got.data, got.size);
        if (bytes.empty()) {
          if (position_ < delivered_) {
            throw StreamFailure("it ended at byte " + std::to_string(position_) +
                                    " when read again, before the " + std::to_string(delivered_) +
                                    " bytes read before: the shard changed while being read",
                                false);
          }
          source_->stop();
          running_ = false;
          ended_ = true;
          return {};
        }
        const uint64_t at = position_;
        position_ += bytes.size();
        if (at < delivered_) {  // read again after a restart from the beginning: dropped
          const auto again = static_cast<size_t>(std::min<uint64_t>(bytes.size(), delivered_ - at));
          check_again(at, bytes.first(again));
          bytes = bytes.subspan(again);
          if (bytes.empty()) continue;
        }
        remember(bytes);
        delivered_ += bytes.size();
        return bytes;
      }
    } catch (const StreamFailure& failure) {
      source_->stop();
      running_ = false;
      if (failures == 0) first_failure = Clock::now();
      ++failures;
      const std::string attempts = failures > 1
                                       ? ", after " + std::to_string(failures) + " attempts over " +
                                             seconds_text(Clock::now() - first_failure)
                                       : std::string();
      if (!failure.transient || failures > options_.retries) {
        throw std::runtime_error(name_ + ": " + failure.what() + attempts);
      }
      if (!cancel_.sleep_for(
              backoff_before(failures, options_.backoff_initial, options_.backoff_max))) {
        throw StreamCancelled();
      }
    }
  }
}

void ResumingStream::finish() {
  while (!next().empty()) {
  }
}

void ResumingStream::remember(std::span<const uint8_t> bytes) {
  if (tail_.empty()) tail_.resize(kCheckedTail);
  const size_t keep = std::min(bytes.size(), kCheckedTail);
  uint64_t at = delivered_ + bytes.size() - keep;
  const uint8_t* from = bytes.data() + bytes.size() - keep;
  for (size_t left = keep; left > 0;) {
    const size_t ring = static_cast<size_t>(at % kCheckedTail);
    const size_t run = std::min(left, kCheckedTail - ring);
    std::memcpy(tail_.data() + ring, from, run);
    from += run;
    at += run;
    left -= run;
  }
}

void ResumingStream::check_again(uint64_t at, std::span<const uint8_t> bytes) const {
  const uint64_t kept_from = delivered_ - std::min<uint64_t>(delivered_, kCheckedTail);
  for (uint64_t p = std::max(at, kept_from); p < at + bytes.size();) {
    const size_t ring = static_cast<size_t>(p % kCheckedTail);
    const size_t run =
        static_cast<size_t>(std::min<uint64_t>(kCheckedTail - ring, at + bytes.size() - p));
    if (std::memcmp(tail_.data() + ring, bytes.data() + (p - at), run) != 0) {
      throw StreamFailure("read again from its beginning, its bytes before byte " +
                              std::to_string(delivered_) +
                              " differ from the first read: the shard changed while being read",
                          false);
    }
    p += run;
  }
}

}  // namespace conveyor::detail
