// Ragged fields (FieldSpec::max_items, issue 31) through the loader: each batch holds a ragged
// field in the jagged layout (values [total, ...sample_shape], offsets int64 [B + 1]), equal to
// the one built plainly from the batch's indices, on the CPU path (zero-copy leases, batches held
// by the user, pinned copies, skip substitutes) and on the copy stage (host-side copy engines, and
// a real GPU where there is one); and the loader refuses a ragged field the slot cannot hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_support.h"

namespace conveyor {
namespace {

using namespace std::chrono_literals;
using testing::InstantCopyEngine;
using testing::LateCopyEngine;

constexpr size_t kMaxText = 7;
constexpr size_t kMaxBoxes = 5;

// Sample i's content, a pure function of i: counts run through 0 .. max_items.
int64_t text_count(size_t i) { return static_cast<int64_t>(i % (kMaxText + 1)); }
int64_t box_count(size_t i) { return static_cast<int64_t>((i * 3 + 1) % (kMaxBoxes + 1)); }
uint8_t text_byte(size_t i, int64_t j) { return static_cast<uint8_t>(i * 31 + j * 7 + 1); }
float box_value(size_t i, int64_t k, int64_t c) {
  return static_cast<float>(i) * 100.0f + static_cast<float>(k * 10 + c) + 0.5f;
}

// A fixed "id" (int64), a host_only ragged "text" (uint8 items of shape []) and a ragged "boxes"
// (float items of shape [4]); failing at `fail_at`.
class RaggedSource : public SampleSource {
 public:
  explicit RaggedSource(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  std::vector<FieldSpec> fields() const override {
    FieldSpec id{"id", c10::ScalarType::Long, {}};
    FieldSpec text{"text", c10::ScalarType::Byte, {}};
    text.max_items = kMaxText;
    text.host_only = true;
    FieldSpec boxes{"boxes", c10::ScalarType::Float, {4}};
    boxes.max_items = kMaxBoxes;
    return {id, text, boxes};
  }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    const size_t i = ctx.index;
    if (fail_at.count(i)) throw std::runtime_error("synthetic failure");
    const auto id = static_cast<int64_t>(i);
    std::memcpy(fields[0], &id, sizeof id);
    RaggedRow text(fields[1]);
    for (int64_t j = 0; j < text_count(i); ++j) {
      text.items()[j] = static_cast<std::byte>(text_byte(i, j));
    }
    text.set_count(text_count(i));
    RaggedRow boxes(fields[2]);
    auto* out = reinterpret_cast<float*>(boxes.items());
    for (int64_t k = 0; k < box_count(i); ++k) {
      for (int64_t c = 0; c < 4; ++c) {
        const float v = box_value(i, k, c);
        std::memcpy(out + k * 4 + c, &v, sizeof v);
      }
    }
    boxes.set_count(box_count(i));
  }
  std::set<size_t> fail_at;

 private:
  size_t n_;
};

// The reference, built plainly from the batch's indices.
struct Expected {
  at::Tensor text, text_offsets, boxes, boxes_offsets;
};
Expected expected(const std::vector<size_t>& indices) {
  std::vector<uint8_t> text;
  std::vector<float> boxes;
  std::vector<int64_t> text_offsets{0}, boxes_offsets{0};
  for (size_t i : indices) {
    for (int64_t j = 0; j < text_count(i); ++j) text.push_back(text_byte(i, j));
    for (int64_t k = 0; k < box_count(i); ++k) {
      for (int64_t c = 0; c < 4; ++c) boxes.push_back(box_value(i, k, c));
    }
    text_offsets.push_back(text_offsets.back() + text_count(i));
    boxes_offsets.push_back(boxes_offsets.back() + box_count(i));
  }
  const auto n = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  Expected e;
  e.text = at::tensor(at::ArrayRef<uint8_t>(text), at::kByte).reshape({n(text)});
  e.boxes = at::tensor(at::ArrayRef<float>(boxes), at::kFloat).reshape({n(boxes) / 4, 4});
  e.text_offsets = at::tensor(at::ArrayRef<int64_t>(text_offsets), at::kLong);
  e.boxes_offsets = at::tensor(at::ArrayRef<int64_t>(boxes_offsets), at::kLong);
  return e;
}

// Checks every field of `batch` against the reference; `device` is where the non-host_only
// fields must be.
void expect_batch(const Batch& batch, c10::DeviceType device = c10::DeviceType::CPU) {
  SCOPED_TRACE("batch " + std::to_string(batch.sequence));
  ASSERT_EQ(batch.fields.size(), 3u);
  ASSERT_EQ(batch.offsets.size(), 3u);
  EXPECT_FALSE(batch.offsets[0].defined());  // a fixed field has none
  EXPECT_THROW(batch.field_offsets("id"), std::out_of_range);
  const Expected e = expected(batch.indices);
  std::vector<int64_t> ids;
  for (size_t i : batch.indices) ids.push_back(static_cast<int64_t>(i));
  EXPECT_EQ(batch.field("id").device().type(), device);
  EXPECT_TRUE(batch.field("id").cpu().equal(at::tensor(at::ArrayRef<int64_t>(ids), at::kLong)));
  // host_only: on the CPU whatever the device.
  EXPECT_TRUE(batch.field("text").device().is_cpu());
  EXPECT_TRUE(batch.field_offsets("text").device().is_cpu());
  EXPECT_TRUE(batch.field("text").equal(e.text)) << batch.field("text") << e.text;
  EXPECT_TRUE(batch.field_offsets("text").equal(e.text_offsets));
  EXPECT_EQ(batch.field("boxes").device().type(), device);
  EXPECT_EQ(batch.field_offsets("boxes").device().type(), device);
  EXPECT_TRUE(batch.field("boxes").cpu().equal(e.boxes));
  EXPECT_TRUE(batch.field_offsets("boxes").cpu().equal(e.boxes_offsets));
}

struct LoaderRun {
  size_t size = 0, batch_size = 1, workers = 1, chunk_size = 0;
  bool pin_memory = false, hold = false, skip = false;
  std::string str() const {
    return "size " + std::to_string(size) + ", batch_size " + std::to_string(batch_size) +
           ", workers " + std::to_string(workers) + ", chunk_size " + std::to_string(chunk_size) +
           (pin_memory ? ", pin_memory" : "") + (hold ? ", held" : "") + (skip ? ", skip" : "");
  }
};

// One epoch of `run` (two with hold: the user keeps every batch of the first), every batch
// checked; returns the batches handed out.
size_t check_epochs(const LoaderRun& run, std::unique_ptr<CopyEngine> engine = nullptr) {
  SCOPED_TRACE(run.str());
  auto source = std::make_shared<RaggedSource>(run.size);
  if (run.skip) source->fail_at = {0, 3, run.size / 2, run.size - 1};
  LoaderOptions o;
  o.batch_size = run.batch_size;
  o.workers = run.workers;
  o.chunk_size = run.chunk_size;
  o.pin_memory = run.pin_memory;
  o.slots = 3;
  o.timeout = 60s;
  if (run.skip) o.on_error = ErrorPolicy::kSkip;
  const bool to_device = engine != nullptr;
  DataLoader loader(source, o, RandomSampler::make(run.size), std::move(engine));
  size_t batches = 0;
  for (int epoch = 0; epoch < (run.hold ? 2 : 1); ++epoch) {
    std::vector<Batch> held;
    std::set<size_t> seen;
    for (Batch& batch : loader) {
      expect_batch(batch);
      for (size_t i : batch.indices) {
        if (!source->fail_at.count(i)) seen.insert(i);
      }
      if (run.hold) held.push_back(batch);
      ++batches;
    }
    for (const Batch& batch : held) expect_batch(batch);  // still right while held
    EXPECT_EQ(seen.size(), run.size - (run.skip ? source->fail_at.size() : 0));
  }
  if (run.hold && !to_device && !run.pin_memory && loader.batches_per_epoch() >= 2) {
    EXPECT_GT(loader.stats().copies_to_host, 0u);  // the held batches took the slots
  }
  return batches;
}

TEST(RaggedFields, EveryBatchIsTheJaggedLayoutOfItsSamplesOnTheCpuPath) {
  std::mt19937 rng(31);
  size_t runs = 0;
  for (size_t workers : {1u, 4u}) {
    for (size_t chunk : {0u, 1u, 3u}) {
      for (int mode = 0; mode < 4; ++mode) {
        LoaderRun run;
        run.size = 5 + rng() % 60;
        run.batch_size = 1 + rng() % 12;
        run.workers = workers;
        run.chunk_size = chunk;
        run.hold = mode == 1;
        run.pin_memory = mode == 2;
        run.skip = mode == 3;
        EXPECT_GT(check_epochs(run), 0u);
        ++runs;
      }
    }
  }
  EXPECT_EQ(runs, 24u);
}

TEST(RaggedFields, EveryBatchIsTheJaggedLayoutOfItsSamplesThroughTheCopyStage) {
  std::mt19937 rng(32);
  for (size_t workers : {1u, 4u}) {
    for (size_t chunk : {0u, 2u}) {
      for (bool late : {false, true}) {
        LoaderRun run;
        run.size = 5 + rng() % 60;
        run.batch_size = 1 + rng() % 12;
        run.workers = workers;
        run.chunk_size = chunk;
        run.hold = rng() % 2 == 0;
        run.skip = rng() % 2 == 0;
        std::unique_ptr<CopyEngine> engine;
        if (late) {
          engine = std::make_unique<LateCopyEngine>(1ms);
        } else {
          engine = std::make_unique<InstantCopyEngine>();
        }
        EXPECT_GT(check_epochs(run, std::move(engine)), 0u);
      }
    }
  }
}

// A copy engine that records what it was asked to copy and what its fences were asked to order.
struct Recorded {
  std::mutex mutex;
  std::vector<std::vector<at::Tensor>> copied;  // per start(): the host tensors
  std::vector<std::vector<void*>> fenced;       // per use_on(): the tensors' data
};
class RecordingCopyEngine : public CopyEngine {
 public:
  explicit RecordingCopyEngine(std::shared_ptr<Recorded> recorded)
      : recorded_(std::move(recorded)) {}
  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent*, std::function<void()> on_finished) override {
    DeviceCopy copy;
    copy.tensors = testing::empty_like_all(host);
    testing::copy_rows(host, on_device, copy.tensors, nullptr);
    {
      std::lock_guard<std::mutex> lock(recorded_->mutex);
      recorded_->copied.push_back(host);
    }
    copy.fence = std::make_shared<Fence>(recorded_);
    on_finished();
    return copy;
  }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }

 private:
  class Fence : public CopyFence {
   public:
    explicit Fence(std::shared_ptr<Recorded> recorded) : recorded_(std::move(recorded)) {}
    void use_on(c10::Stream, const std::vector<at::Tensor>& tensors) const override {
      std::vector<void*> data;
      for (const auto& t : tensors) data.push_back(t.data_ptr());
      std::lock_guard<std::mutex> lock(recorded_->mutex);
      recorded_->fenced.push_back(std::move(data));
    }
    c10::Stream current_stream() const override {
      return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
    }
    bool done() const override { return true; }

   private:
    std::shared_ptr<Recorded> recorded_;
  };
  std::shared_ptr<Recorded> recorded_;
};

// The copy stage copies only what the device needs (no host_only field; a ragged field's used
// items and its offsets), and the batch's fence orders every tensor it copied, offsets included.
TEST(RaggedFields, TheCopyStageCopiesTheUsedItemsAndOffsetsAndFencesThemButNoHostOnlyField) {
  auto recorded = std::make_shared<Recorded>();
  auto source = std::make_shared<RaggedSource>(40);
  LoaderOptions o;
  o.batch_size = 6;
  o.workers = 2;
  o.timeout = 60s;
  DataLoader loader(source, o, SequentialSampler::make(),
                    std::make_unique<RecordingCopyEngine>(recorded));
  size_t batches = 0;
  for (Batch& batch : loader) {
    expect_batch(batch);
    const Expected e = expected(batch.indices);
    std::lock_guard<std::mutex> lock(recorded->mutex);
    ASSERT_EQ(recorded->fenced.size(), batches + 1);
    const std::vector<void*>& fenced = recorded->fenced.back();
    for (const at::Tensor* t : {&batch.fields[0], &batch.fields[2], &batch.offsets[2]}) {
      EXPECT_NE(std::find(fenced.begin(), fenced.end(), t->data_ptr()), fenced.end());
    }
    ++batches;
  }
  std::lock_guard<std::mutex> lock(recorded->mutex);
  ASSERT_EQ(recorded->copied.size(), batches);
  for (size_t b = 0; b < batches; ++b) {
    std::vector<size_t> indices;
    for (size_t i = b * 6; i < std::min<size_t>(40, b * 6 + 6); ++i) indices.push_back(i);
    const Expected e = expected(indices);
    const std::vector<at::Tensor>& host = recorded->copied[b];
    ASSERT_EQ(host.size(), 3u);
    EXPECT_EQ(host[0].size(0), static_cast<int64_t>(indices.size()));
    EXPECT_EQ(host[1].sizes(), e.boxes.sizes());  // only the used items cross
    EXPECT_EQ(host[2].size(0), static_cast<int64_t>(indices.size()) + 1);
  }
}

// Batch::record_stream orders the same tensors as the hand-out: the copied fields and offsets.
TEST(RaggedFields, RecordStreamOrdersEveryCopiedTensorOffsetsIncluded) {
  auto recorded = std::make_shared<Recorded>();
  LoaderOptions o;
  o.batch_size = 6;
  o.workers = 2;
  o.timeout = 60s;
  DataLoader loader(std::make_shared<RaggedSource>(40), o, SequentialSampler::make(),
                    std::make_unique<RecordingCopyEngine>(recorded));
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  {
    std::lock_guard<std::mutex> lock(recorded->mutex);
    recorded->fenced.clear();
  }
  batch->record_stream(c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU)));
  std::lock_guard<std::mutex> lock(recorded->mutex);
  ASSERT_EQ(recorded->fenced.size(), 1u);
  const std::vector<void*>& fenced = recorded->fenced[0];
  for (const at::Tensor* t : {&batch->fields[0], &batch->fields[2], &batch->offsets[2]}) {
    EXPECT_NE(std::find(fenced.begin(), fenced.end(), t->data_ptr()), fenced.end());
  }
}

// A source of one field, as given.
class OneFieldSource : public SampleSource {
 public:
  explicit OneFieldSource(FieldSpec field) : field_(std::move(field)) {}
  size_t size() const override { return 4; }
  std::vector<FieldSpec> fields() const override { return {field_}; }
  void write_sample(const SampleContext&, std::byte* const* fields) override {
    RaggedRow(fields[0]).set_count(0);
  }

 private:
  FieldSpec field_;
};

TEST(RaggedFields, TheLoaderRefusesARaggedFieldTheSlotCannotHoldNamingIt) {
  const auto refused = [](std::vector<int64_t> shape, size_t max_items, const std::string& why) {
    FieldSpec f{"boxes", c10::ScalarType::Float, std::move(shape)};
    f.max_items = max_items;
    LoaderOptions o;
    o.batch_size = 8;
    o.workers = 1;
    try {
      DataLoader loader(std::make_shared<OneFieldSource>(f), o);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'boxes'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused({0, 4}, 3, "positive");
  refused({-1}, 3, "positive");
  refused({4}, std::numeric_limits<size_t>::max() / 8, "overflow");
  refused({1 << 30, 1 << 30, 1 << 30}, 2, "overflow");
  // A fitting one is taken, and its empty rows make empty values.
  FieldSpec ok{"boxes", c10::ScalarType::Float, {4}};
  ok.max_items = 3;
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 1;
  DataLoader loader(std::make_shared<OneFieldSource>(ok), o);
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->field("boxes").sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(batch->field_offsets("boxes").equal(at::zeros({5}, at::kLong)));
}

// A source writing `count` items' worth of count into every row of a ragged field (max_items 3).
class BadCountSource : public SampleSource {
 public:
  explicit BadCountSource(int64_t count) : count_(count) {}
  size_t size() const override { return 4; }
  std::vector<FieldSpec> fields() const override {
    FieldSpec f{"boxes", c10::ScalarType::Float, {4}};
    f.max_items = 3;
    return {f};
  }
  void write_sample(const SampleContext&, std::byte* const* fields) override {
    RaggedRow(fields[0]).set_count(count_);
  }

 private:
  int64_t count_;
};

// A count outside 0 .. max_items is a broken invariant (sources never write one): the loader stops
// naming it, before it moves or hands out anything.
TEST(RaggedFieldsDeathTest, ACountOutsideItsBoundStopsTheLoaderBeforeAnythingMoves) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int64_t count : {int64_t{4}, int64_t{-1}}) {
    EXPECT_DEATH(
        {
          LoaderOptions o;
          o.batch_size = 4;
          o.workers = 1;
          DataLoader loader(std::make_shared<BadCountSource>(count), o);
          (void)loader.next();
        },
        "0 \\.\\. max_items");
  }
}

// The real copy stage: ragged values and offsets on the device, host_only fields on the CPU.
TEST(RaggedFields, OnAGpuRaggedFieldsAreOnTheDeviceAndHostOnlyFieldsOnTheCpu) {
  const CudaStatus cuda = cuda_status();
  if (!cuda.usable()) GTEST_SKIP() << "no usable CUDA device: " << cuda.reason;
  auto source = std::make_shared<RaggedSource>(100);
  LoaderOptions o;
  o.batch_size = 7;
  o.workers = 4;
  o.device = c10::Device(c10::DeviceType::CUDA, 0);
  o.timeout = 60s;
  for (int hold = 0; hold < 2; ++hold) {
    DataLoader loader(source, o, RandomSampler::make(3));
    std::vector<Batch> held;
    size_t samples = 0;
    for (Batch& batch : loader) {
      expect_batch(batch, c10::DeviceType::CUDA);
      samples += batch.size();
      if (hold) held.push_back(batch);
    }
    for (const Batch& batch : held) expect_batch(batch, c10::DeviceType::CUDA);
    EXPECT_EQ(samples, 100u);
  }
}

}  // namespace
}  // namespace conveyor
