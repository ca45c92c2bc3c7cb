#include "batch_filler.h"

#include <algorithm>
#include <array>
#include <chrono>

#include "conveyor/internal/invariant.h"

namespace conveyor::detail {

void SlotMeta::reset(size_t seq, uint64_t gen, uint64_t ep, size_t rows, size_t jobs,
                     const uint32_t* row_repeats) {
  CONVEYOR_DEBUG_CHECK(rows <= indices.capacity() && rows <= repeats.capacity(),
                       "a batch fits the reserved rows");
  sequence = seq;
  generation = gen;
  epoch = ep;
  indices.resize(rows);  // within the reserved capacity: no allocation
  repeated = row_repeats != nullptr;
  if (repeated) {
    repeats.assign(row_repeats, row_repeats + rows);
  } else {
    repeats.assign(rows, 0);
  }
  cancelled.store(false, std::memory_order_relaxed);
  failed_row.store(kNoFailure, std::memory_order_relaxed);
  error = nullptr;
  stage_error = nullptr;
  transformed.clear();
  augment_params.reset();
  // Release: a worker that sees the job (queued after this) sees all of the above.
  remaining.store(jobs, std::memory_order_release);
}

void SkipLog::add(SkippedSample record) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++count_;
  if (records_.size() < kMaxRecords) {
    try {
      records_.push_back(std::move(record));
    } catch (...) {  // out of memory for the record: the count above still holds
    }
  }
}

uint64_t SkipLog::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

std::vector<SkippedSample> SkipLog::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_;
}

BatchFiller::BatchFiller(SampleSource& source, SlotRing& ring, const ResolvedOptions& options,
                         const std::vector<size_t>& order, const std::atomic<uint64_t>& generation)
    : source_(source), ring_(ring), options_(options), order_(order), generation_(generation) {
  for (const FieldSpec& f : source_.fields()) field_bytes_.push_back(f.sample_bytes());
  CONVEYOR_CHECK(!field_bytes_.empty() && field_bytes_.size() <= kMaxFields,
                 "the engine checked the source's number of fields");
}

bool BatchFiller::abandon(SlotMeta& meta) {
  meta.cancelled.store(true);
  return meta.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

bool BatchFiller::fill(size_t worker, uint32_t slot, size_t chunk, SlotMeta& meta) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const size_t first = chunk * options_.chunk_size;
  const size_t last = std::min(meta.indices.size(), first + options_.chunk_size);
  const size_t base = meta.sequence * options_.batch_size;  // the batch's first place in order_
  CONVEYOR_DEBUG_CHECK(first < last && base + last <= order_.size(), "a job is a real chunk");
  std::array<std::byte*, kMaxFields> rows{};
  // With GPU decode (kAuto: whole chunks; kShare: per sample), the rows routed to the GPU are the
  // decode thread's.
  const bool hybrid = meta.hybrid;
  const bool whole_chunk =
      !hybrid || std::all_of(meta.route.begin() + static_cast<std::ptrdiff_t>(first),
                             meta.route.begin() + static_cast<std::ptrdiff_t>(last),
                             [](Decoder d) { return d == Decoder::kCpu; });
  if (whole_chunk) {
    try {  // a hint: the source may start reading the chunk's samples at once
      source_.will_write(worker, &order_[base + first], last - first);
    } catch (...) {  // a failed hint costs nothing; each sample's own read reports its errors
    }
  }
  size_t written = 0;
  for (size_t r = first; r < last; ++r) {
    if (hybrid && meta.route[r] != Decoder::kCpu) continue;
    if (outdated(meta)) {
      meta.cancelled.store(true);
      break;
    }
    // Rows after a known failure cannot change the batch's error; rows before it still can.
    if (meta.failed_row.load(std::memory_order_relaxed) < r) break;
    row_pointers(slot, r, rows.data());
    if (!write_with_policy(worker, r, order_[base + r], rows.data(), meta)) break;
    ++written;
  }
  const auto busy = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0);
  fill_ns_.fetch_add(static_cast<uint64_t>(busy.count()));
  if (hybrid) {
    hybrid_cpu_rows_.fetch_add(written, std::memory_order_relaxed);
    // kAuto's chunks are whole: a chunk cut short (cancelled, failed) measures nothing.
    if (balancer_ != nullptr && written == last - first) {
      balancer_->finished(Decoder::kCpu, last - first, busy);
    } else if (balancer_ != nullptr) {
      balancer_->abandoned(Decoder::kCpu, last - first);
    }
  }
  return finish_job(slot, meta);
}

bool BatchFiller::finish_job(uint32_t slot, SlotMeta& meta) {
  if (meta.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  // The batch's last job: every other job's rows and flags are visible here.
  if (!meta.failed() && !meta.cancelled.load()) ring_.mark_ready(slot);
  return true;
}

void BatchFiller::row_pointers(uint32_t slot, size_t row, std::byte** rows) const {
  for (size_t f = 0; f < field_bytes_.size(); ++f) {
    rows[f] = ring_.field(slot, f) + row * field_bytes_[f];
  }
}

std::string BatchFiller::describe(size_t index) const {
  try {
    return source_.describe(index);
  } catch (...) {
    return "sample " + std::to_string(index);
  }
}

void BatchFiller::record_failure(SlotMeta& meta, size_t row, size_t index,
                                 std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(meta.error_mutex);
  if (row >= meta.failed_row.load()) return;  // a chunk failed at an earlier row: its error wins
  meta.failed_row.store(row);
  meta.error = error;
  meta.error_index = index;
  try {
    meta.error_path = describe(index);
    meta.error_message = exception_message(error);
  } catch (...) {
    meta.error_message = "(the error could not be described)";
  }
}

bool BatchFiller::write_with_policy(size_t worker, size_t row, size_t index, std::byte* const* rows,
                                    SlotMeta& meta) {
  SampleContext ctx{worker, index, options_.seed, meta.epoch, meta.repeats[row]};
  try {
    source_.write_sample(ctx, rows);
    meta.indices[row] = index;
    return true;
  } catch (const LoadingInterrupted&) {  // the user's code asked to stop: never skipped
    errors_.fetch_add(1);
    record_failure(meta, row, index, std::current_exception());
    return false;
  } catch (...) {
    errors_.fetch_add(1);
    std::exception_ptr error = std::current_exception();
    if (options_.on_error == ErrorPolicy::kSkip) {
      try {
        skipped_.add({index, describe(index), exception_message(error), meta.epoch});
      } catch (...) {  // out of memory for the record's strings
      }
      const size_t n = source_.size();
      for (size_t k = 1; k <= options_.max_substitutes && k < n; ++k) {
        ctx.index = (index + k) % n;
        try {
          source_.write_sample(ctx, rows);
          meta.indices[row] = ctx.index;
          return true;
        } catch (const LoadingInterrupted&) {
          errors_.fetch_add(1);
          record_failure(meta, row, ctx.index, std::current_exception());
          return false;
        } catch (...) {
          errors_.fetch_add(1);
        }
      }
      error = std::make_exception_ptr(std::runtime_error(
          exception_message(error) + "; and none of the next " +
          std::to_string(options_.max_substitutes) + " samples loaded as a substitute"));
    }
    record_failure(meta, row, index, error);
    return false;
  }
}

}  // namespace conveyor::detail
