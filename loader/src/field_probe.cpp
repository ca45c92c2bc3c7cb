// The engine before build(), for a source that learns its fields by reading a sample
// (SampleSource::learns_fields: the drop-in's torch datasets): the probe that reads it on a
// thread of its own, and the consumer's wait for it (the rest of the engine: engine.cpp).
#include <algorithm>
#include <chrono>
#include <future>

#include "conveyor/internal/invariant.h"
#include "engine.h"

namespace conveyor {

void DataLoader::Impl::start_probe() {
  CONVEYOR_CHECK(!built() && !probe_.valid() && next_sequence_ < num_batches_,
                 "one probe at a time, before build(), for a batch of the epoch");
  // The first sample of the batch the consumer waits for; with kSkip the following ones of the
  // epoch's order too, as many as its substitutes may be. start_epoch() checked every index of
  // the order against the dataset's size.
  const size_t first = next_sequence_ * options_.batch_size;
  const size_t end = std::min(order_.size(), num_batches_ * options_.batch_size);
  const size_t tries = options_.on_error == ErrorPolicy::kSkip
                           ? std::min(end - first, 1 + options_.max_substitutes)
                           : 1;
  std::vector<size_t> candidates(order_.begin() + static_cast<std::ptrdiff_t>(first),
                                 order_.begin() + static_cast<std::ptrdiff_t>(first + tries));
  probing_ = ProbeOutcome{};
  probing_.index = candidates.front();
  probing_.batch = next_sequence_;
  probing_.epoch = epoch_;
  probing_.run = runs_;
  // The task owns what it touches (the source, shared, and its candidates), never this object;
  // probe_'s destructor waits for it.
  probe_ = std::async(std::launch::async, [source = source_, candidates = std::move(candidates),
                                           outcome = probing_]() mutable {
    for (size_t index : candidates) {
      try {
        outcome.fields = source->learn_fields(index);
        outcome.index = index;
        return outcome;
      } catch (...) {
        if (!outcome.error) {
          outcome.error = std::current_exception();
          outcome.index = index;
        }
      }
    }
    return outcome;
  });
}

bool DataLoader::Impl::learn_fields(Clock::time_point deadline) {
  // The loader's timeout runs from the first wait for the batch, across polls, as it does once
  // the engine is built (poll_until goes on counting from the same start).
  if (!waiting_since_) waiting_since_ = Clock::now();
  Clock::time_point until = deadline;
  bool timeout_rules = false;
  if (options_.timeout && *waiting_since_ + *options_.timeout <= until) {
    until = *waiting_since_ + *options_.timeout;
    timeout_rules = true;
  }
  for (;;) {
    if (!probe_.valid()) {
      if (next_sequence_ >= num_batches_) return false;  // no batch left in this epoch
      start_probe();
    }
    if (until == Clock::time_point::max()) {
      probe_.wait();  // (wait_until(max) may overflow inside the library)
    } else if (probe_.wait_until(until) != std::future_status::ready) {
      if (!timeout_rules) return false;
      waiting_since_.reset();  // the next call waits a whole timeout again
      throw TimeoutError("conveyor: sample " + std::to_string(probing_.index) + " (" +
                         source_->describe(probing_.index) + "), the first of batch " +
                         std::to_string(probing_.batch) + " of epoch " +
                         std::to_string(probing_.epoch) +
                         ", read to learn the shapes of the batch's tensors, did not load "
                         "within " +
                         std::to_string(options_.timeout->count()) + " ms");
    }
    ProbeOutcome outcome = probe_.get();  // probe_ is no longer valid
    if (outcome.fields.empty()) {
      if (outcome.run != runs_) continue;  // a replaced epoch's failure: probe this one
      pass_over(outcome.batch);
      waiting_since_.reset();
      detail::throw_sample_failure(outcome.index, source_->describe(outcome.index), outcome.batch,
                                   outcome.epoch, detail::exception_message(outcome.error),
                                   outcome.error);
    }
    build();  // reads the fields the source kept
    return true;
  }
}

void DataLoader::Impl::pass_over(size_t sequence) {
  CONVEYOR_CHECK(!built() && started_ && sequence == next_sequence_ && sequence < num_batches_,
                 "only the batch the consumer waits for is passed over, before build()");
  ++next_sequence_;  // nothing is dispatched before build()
  dispatched_ = collected_ = next_stage_ = next_sequence_;
}

}  // namespace conveyor
