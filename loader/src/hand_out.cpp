// The engine's consumer, handing out: failures and timeouts as exceptions, the copy stage's
// staging, and next()/poll() (the rest of the engine: engine.cpp).
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "conveyor/internal/invariant.h"
#include "conveyor/internal/trace.h"

namespace conveyor {

void DataLoader::Impl::throw_timeout() const {
  const std::string ms = std::to_string(options_.timeout->count()) + " ms";
  if (awaited_ == Awaited::kSlot) {
    throw TimeoutError("conveyor: no batch slot came free within " + ms + " (batch " +
                       std::to_string(dispatched_) + " of epoch " + std::to_string(epoch_) + ")");
  }
  throw TimeoutError("conveyor: no batch arrived within " + ms + " (waiting for batch " +
                     std::to_string(wanted()) + " of epoch " + std::to_string(epoch_) + ", " +
                     std::to_string(workers_.size()) + " workers)");
}

void DataLoader::Impl::raise_failure(const detail::SlotMeta& meta) const {
  if (meta.cancelled) {
    throw std::logic_error("conveyor: internal error: a cancelled batch reached the consumer");
  }
  if (meta.stage_error) std::rethrow_exception(meta.stage_error);
  detail::throw_sample_failure(meta.error_index, meta.error_path, meta.sequence, meta.epoch,
                               meta.error_message, meta.error);
}

std::exception_ptr DataLoader::Impl::take_failure(uint32_t slot) {
  std::exception_ptr failure;
  try {
    raise_failure(*meta_[slot]);
  } catch (...) {
    failure = std::current_exception();
  }
  shared_->ring.release(slot);
  return failure;
}

detail::BatchHeader DataLoader::Impl::header(uint32_t slot) const {
  const detail::SlotMeta& meta = *meta_[slot];
  return {meta.indices, meta.epoch, meta.sequence,
          meta.repeated ? meta.repeats : std::vector<uint32_t>{}, meta.augment_params};
}

// ---------------------------------------------------------------------------------------------
// Consumer: hand out

void DataLoader::Impl::stage_copies(Clock::time_point deadline) {
  while (!stager_->full() && next_stage_ < num_batches_) {
    std::optional<uint32_t> slot =
        take_next(stager_->empty() ? deadline : Clock::time_point::min());
    if (!slot) return;
    const auto t0 = Clock::now();
    const detail::SlotMeta& meta = *meta_[*slot];
    const trace::Range issuing(trace::Name::kIssueCopy, meta.sequence);
    if (meta.failed() || meta.cancelled) {
      std::exception_ptr failure = take_failure(*slot);  // releases the slot
      ++next_stage_;
      stager_->stage_failure(std::move(failure));
    } else {
      // Everything that allocates comes before begin_copy(): if it throws, the slot is held back
      // (kReady) for the next call, and no batch is lost or stranded in kCopying. The slot's
      // ragged fields are compacted last, when nothing can fail any more.
      const size_t rows = meta.indices.size();
      Batch batch;
      std::vector<at::Tensor> host;        // what goes to the device
      std::vector<detail::CopyTarget> to;  // and where each goes in the batch
      std::vector<DeviceRows> on_device;   // the rows GPU decode wrote on the device
      std::function<void()> hand_back;
      try {
        batch = detail::empty_batch(header(*slot), fields_);
        batch.fields.resize(fields_.size());
        batch.offsets.resize(fields_.size());
        detail::SlotTensors views =
            detail::slot_views(shared_->ring, *slot, fields_, rows, options_.batch_size);
        std::vector<size_t> host_index(fields_.size(), SIZE_MAX);  // a field's entry in `host`
        for (size_t f = 0; f < fields_.size(); ++f) {
          if (fields_[f].host_only) {  // stays on the CPU: copied out, as the slot goes back
            detail::copy_field(shared_->ring, *slot, fields_, f, views, options_.batch_size,
                               /*pinned=*/false, batch.fields[f], batch.offsets[f]);
            continue;
          }
          host_index[f] = host.size();
          host.push_back(views.fields[f]);
          to.push_back({f, false});
        }
        for (size_t f = 0; f < fields_.size(); ++f) {
          if (fields_[f].host_only || !fields_[f].ragged()) continue;
          host.push_back(views.offsets[f]);
          to.push_back({f, true});
        }
        if (gpu_) on_device = gpu_->device_rows(*slot, meta);
        for (DeviceRows& d : on_device) {  // GPU decode names the batch's (fixed) fields
          CONVEYOR_CHECK(d.field < fields_.size() && host_index[d.field] != SIZE_MAX &&
                             !fields_[d.field].ragged(),
                         "GPU decode's device rows name a fixed field that goes to the device");
          d.field = host_index[d.field];
        }
        hand_back = [shared = shared_, s = *slot] { shared->ring.copy_finished(s); };
      } catch (...) {
        held_back_ = *slot;
        throw;
      }
      detail::compact_slot(shared_->ring, *slot, fields_, rows, options_.batch_size,
                           /*skip_host_only=*/true);
      ++next_stage_;
      CudaEvent* slot_event = shared_->ring.begin_copy(*slot);
      stager_->stage(std::move(batch), host, to, on_device, slot_event, std::move(hand_back));
    }
    copy_issue_seconds_ += detail::seconds_since(t0);
  }
}

DataLoader::Poll DataLoader::Impl::poll(std::chrono::milliseconds wait) {
  return poll_until(Clock::now() + std::clamp(wait, std::chrono::milliseconds::zero(),
                                              std::chrono::milliseconds(std::chrono::hours(24))));
}

std::optional<Batch> DataLoader::Impl::next() {
  DataLoader::Poll p = poll_until(Clock::time_point::max());
  CONVEYOR_CHECK(p.batch || p.end, "a wait without a deadline ends with a batch or the end");
  return std::move(p.batch);
}

DataLoader::Poll DataLoader::Impl::poll_until(Clock::time_point deadline) {
  if (joined_) detail::throw_joined();
  ensure_started();
  DataLoader::Poll result;
  if (next_sequence_ >= num_batches_) {
    result.end = true;
    return result;
  }
  if (!built() && !learn_fields(deadline)) {
    result.end = next_sequence_ >= num_batches_;  // every batch left failed its probe
    return result;
  }
  // The loader's timeout runs from the first wait for this batch, across polls.
  const auto now = Clock::now();
  if (!waiting_since_) waiting_since_ = now;
  Clock::time_point until = deadline;
  bool timeout_rules = false;
  if (options_.timeout && *waiting_since_ + *options_.timeout <= until) {
    until = *waiting_since_ + *options_.timeout;
    timeout_rules = true;
  }
  const auto nothing_yet = [&] {
    if (timeout_rules && Clock::now() >= until) {
      waiting_since_.reset();  // the next call waits a whole timeout again
      throw_timeout();
    }
    return result;
  };
  if (stager_) {
    try {
      if (gpu_) gpu_->check();  // GPU decode lost the device: no copy can succeed either
      if (deferred_failure_) std::rethrow_exception(std::exchange(deferred_failure_, nullptr));
      stager_->engine().check();  // a lost slot or a sticky CUDA error shows at the next batch
      stage_copies(until);
      if (stager_->empty()) return nothing_yet();
      detail::DeviceStager::Delivered delivered = stager_->deliver();
      ++next_sequence_;
      waiting_since_.reset();
      if (delivered.failure) std::rethrow_exception(delivered.failure);
      try {
        stage_copies(Clock::time_point::min());  // keep the device prefetch_factor batches ahead
      } catch (...) {
        deferred_failure_ = std::current_exception();  // this batch is good: report it next time
      }
      ++batches_;
      samples_ += delivered.batch->size();
      tune();
      result.batch = std::move(delivered.batch);
      return result;
    } catch (const SampleError&) {  // a sample's own failure: GPU decode has nothing to add
      throw;
    } catch (const GpuDecodeError&) {  // GPU decode's own (check()): it says it all
      throw;
    } catch (...) {
      // A copy stage that fails after GPU decode lost the device (a sticky CUDA error) fails with
      // its error: the user learns of GPU decode's, naming both.
      if (gpu_) std::rethrow_exception(gpu_->explain(std::current_exception()));
      throw;
    }
  }
  const std::optional<uint32_t> slot = take_next(until);
  if (!slot) return nothing_yet();
  const detail::SlotMeta& meta = *meta_[*slot];
  if (meta.failed() || meta.cancelled || meta.stage_error) {
    ++next_sequence_;
    waiting_since_.reset();
    std::rethrow_exception(take_failure(*slot));
  }
  // The fields the batch stage replaced (the slot's views of them are stale), pinned as the
  // rest of the batch is with pin_memory; made before the batch, as it may throw.
  std::vector<at::Tensor> replaced = std::move(meta_[*slot]->transformed);
  try {
    for (at::Tensor& t : replaced) {
      if (t.defined() && options_.pin_memory && cuda_available()) t = t.pin_memory();
    }
    result.batch = host_->make(*slot, header(*slot));
  } catch (...) {  // the slot is still ours (kReady): hand it out next time
    meta_[*slot]->transformed = std::move(replaced);
    held_back_ = *slot;
    throw;
  }
  for (size_t f = 0; f < replaced.size(); ++f) {
    if (replaced[f].defined()) result.batch->fields[f] = std::move(replaced[f]);
  }
  ++next_sequence_;
  waiting_since_.reset();
  ++batches_;
  samples_ += result.batch->size();
  tune();
  return result;
}

}  // namespace conveyor
