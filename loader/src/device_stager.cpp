#include "device_stager.h"

#include <chrono>
#include <utility>

#include <c10/core/StreamGuard.h>

#include "conveyor/internal/invariant.h"

namespace conveyor::detail {
namespace {

// Adds the time from its making to its destruction to `total` (seconds), however the scope ends.
class TimeSpent {
 public:
  explicit TimeSpent(double& total) : total_(total) {}
  TimeSpent(const TimeSpent&) = delete;
  TimeSpent& operator=(const TimeSpent&) = delete;
  ~TimeSpent() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double& total_;
};

}  // namespace

std::vector<at::Tensor> fenced_tensors(const Batch& batch, const c10::Stream& stream) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(batch.fields.size() + batch.offsets.size());
  for (const auto* of : {&batch.fields, &batch.offsets}) {
    for (const at::Tensor& t : *of) {
      if (t.defined() && t.device().type() == stream.device_type()) tensors.push_back(t);
    }
  }
  return tensors;
}

DeviceStager::DeviceStager(std::unique_ptr<CopyEngine> engine, size_t depth,
                           std::shared_ptr<const BatchStage> stage)
    : engine_(std::move(engine)), batch_stage_(std::move(stage)), ring_(depth) {
  CONVEYOR_CHECK(engine_ != nullptr && depth >= 1, "a stager has an engine and a depth");
}

DeviceStager::~DeviceStager() {
  clear();
  engine_.reset();  // waits for outstanding copies and their callbacks
}

DeviceStager::Staged& DeviceStager::push_slot() {
  CONVEYOR_CHECK(!full(), "the consumer stages at most prefetch_factor batches");
  Staged& staged = ring_[(head_ + count_) % ring_.size()];
  ++count_;
  return staged;
}

void DeviceStager::stage(Batch batch, const std::vector<at::Tensor>& host,
                         const std::vector<CopyTarget>& targets,
                         const std::vector<DeviceRows>& on_device, CudaEvent* slot_event,
                         std::function<void()> on_finished) noexcept {
  Staged& staged = push_slot();
  staged.batch = std::move(batch);
  try {
    DeviceCopy copy = engine_->start(host, on_device, slot_event, std::move(on_finished));
    CONVEYOR_CHECK(copy.fence != nullptr, "a copy engine gives every copy a fence");
    CONVEYOR_CHECK(copy.tensors.size() == targets.size(), "each copied tensor has its place");
    for (size_t i = 0; i < targets.size(); ++i) {
      std::vector<at::Tensor>& to = targets[i].offsets ? staged.batch.offsets : staged.batch.fields;
      CONVEYOR_CHECK(targets[i].field < to.size(), "a copied tensor's place is in its batch");
      to[targets[i].field] = std::move(copy.tensors[i]);
    }
    staged.batch.copy_fence = std::move(copy.fence);
    if (batch_stage_) {
      const TimeSpent spent(transform_seconds_);
      Batch& b = staged.batch;
      const std::optional<c10::Stream> side = engine_->stream();
      if (side) {
        const c10::StreamGuard on_side(*side);  // the ops queue after the copy
        b.augment_params = batch_stage_->run(b.fields, b.indices, b.repeats, b.epoch, b.sequence);
        b.copy_fence = fence_after_stage(std::move(b.copy_fence), *side);
      } else {
        const CopyFence& fence = *b.copy_fence;
        fence.use_on(fence.current_stream(), fenced_tensors(b, fence.current_stream()));
        b.augment_params = batch_stage_->run(b.fields, b.indices, b.repeats, b.epoch, b.sequence);
      }
    }
  } catch (...) {  // the engine hands the slot back through on_finished
    staged.failure = std::current_exception();
    staged.batch.fields.clear();
    staged.batch.offsets.clear();
  }
}

void DeviceStager::stage_failure(std::exception_ptr failure) noexcept {
  Staged& staged = push_slot();
  staged.failure = std::move(failure);
}

DeviceStager::Delivered DeviceStager::deliver() {
  CONVEYOR_CHECK(!empty(), "deliver() follows a stage()");
  Staged& front = ring_[head_];
  Delivered delivered;
  if (front.failure) {
    delivered.failure = std::exchange(front.failure, nullptr);
  } else {
    // The consumer's current stream waits for this batch's own copy (may throw: it stays first).
    const CopyFence& fence = *front.batch.copy_fence;
    const c10::Stream stream = fence.current_stream();
    fence.use_on(stream, fenced_tensors(front.batch, stream));
    delivered.batch.emplace(std::move(front.batch));
  }
  front = Staged{};
  head_ = (head_ + 1) % ring_.size();
  --count_;
  return delivered;
}

void DeviceStager::clear() {
  for (Staged& staged : ring_) staged = Staged{};
  head_ = 0;
  count_ = 0;
}

}  // namespace conveyor::detail
