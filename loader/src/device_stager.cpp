#include "device_stager.h"

#include <utility>

#include "invariant.h"

namespace conveyor::detail {

DeviceStager::DeviceStager(std::unique_ptr<CopyEngine> engine, size_t depth)
    : engine_(std::move(engine)), depth_(depth) {
  CONVEYOR_CHECK(engine_ != nullptr && depth_ >= 1, "a stager has an engine and a depth");
}

DeviceStager::~DeviceStager() {
  staged_.clear();
  engine_.reset();  // waits for outstanding copies and their callbacks
}

void DeviceStager::stage(Batch batch, const std::vector<at::Tensor>& host, SlotEvent event,
                         std::function<void()> on_finished) {
  CONVEYOR_DEBUG_CHECK(!full(), "the consumer stages at most prefetch_factor batches");
  Staged staged{std::move(batch), event, nullptr};
  try {
    staged.batch.fields = engine_->start(host, event, std::move(on_finished));
  } catch (...) {  // the engine has handed the slot back through on_finished
    staged.failure = std::current_exception();
    staged.batch.fields.clear();
  }
  staged_.push_back(std::move(staged));
}

void DeviceStager::stage_failure(std::exception_ptr failure) {
  Staged staged;
  staged.failure = std::move(failure);
  staged_.push_back(std::move(staged));
}

Batch DeviceStager::deliver() {
  CONVEYOR_CHECK(!staged_.empty(), "deliver() follows a stage()");
  Staged staged = std::move(staged_.front());
  staged_.pop_front();
  if (staged.failure) std::rethrow_exception(staged.failure);
  // Order the caller after this batch's copy before the slot's event can be re-recorded.
  engine_->make_visible(staged.batch.fields, staged.event);
  return std::move(staged.batch);
}

}  // namespace conveyor::detail
