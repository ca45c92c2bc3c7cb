#include "batch_stage.h"

#include <utility>

#include <c10/core/Event.h>

namespace conveyor::detail {

BatchStage::BatchStage(std::shared_ptr<const BatchOp> op, const std::vector<FieldSpec>& fields,
                       uint64_t seed, bool record)
    : op_(std::move(op)), seed_(seed), record_(record) {
  for (const FieldSpec& f : fields) {
    sees_.push_back(!f.ragged() && !f.host_only);
    if (sees_.back()) in_.push_back(f);
  }
  try {
    const std::vector<FieldSpec> out = op_->out_fields(in_);
    if (out.size() != in_.size()) throw std::invalid_argument("it adds or removes fields");
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].name != in_[i].name || out[i].ragged() || out[i].host_only) {
        throw std::invalid_argument("it renames field \"" + in_[i].name +
                                    "\" or makes it ragged or host_only");
      }
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument("conveyor: batch_transform " + op_->name() +
                                " cannot take this source's fields: " + e.what());
  }
}

std::shared_ptr<const AugmentRecord> BatchStage::run(std::vector<at::Tensor>& tensors,
                                                     const std::vector<size_t>& indices,
                                                     const std::vector<uint32_t>& repeats,
                                                     uint64_t epoch, size_t sequence) const {
  BatchFields batch;
  batch.specs = in_;
  for (size_t f = 0; f < tensors.size(); ++f) {
    if (sees_[f]) batch.tensors.push_back(tensors[f]);
  }
  BatchContext ctx;
  ctx.seed = seed_;
  ctx.epoch = epoch;
  ctx.sequence = sequence;
  ctx.indices = indices;
  ctx.repeats = repeats;
  std::shared_ptr<AugmentRecord> record;
  if (record_) {
    record = std::make_shared<AugmentRecord>();
    record->rows.resize(indices.size());
    ctx.record = record.get();
  }
  apply_op(*op_, batch, ctx);
  size_t i = 0;
  for (size_t f = 0; f < tensors.size(); ++f) {
    if (sees_[f]) tensors[f] = std::move(batch.tensors[i++]);
  }
  return record;
}

namespace {

class StagedFence final : public CopyFence {
 public:
  StagedFence(std::shared_ptr<const CopyFence> copy, const c10::Stream& stream)
      : copy_(std::move(copy)), after_ops_(stream.device_type()) {
    after_ops_.record(stream);
  }
  void use_on(c10::Stream stream, const std::vector<at::Tensor>& tensors) const override {
    copy_->use_on(stream, tensors);  // records the tensors for the caching allocator
    after_ops_.block(stream);
  }
  c10::Stream current_stream() const override { return copy_->current_stream(); }
  bool done() const override { return copy_->done() && after_ops_.query(); }

 private:
  std::shared_ptr<const CopyFence> copy_;
  c10::Event after_ops_;
};

}  // namespace

std::shared_ptr<const CopyFence> fence_after_stage(std::shared_ptr<const CopyFence> copy,
                                                   const c10::Stream& stream) {
  return std::make_shared<const StagedFence>(std::move(copy), stream);
}

}  // namespace conveyor::detail
