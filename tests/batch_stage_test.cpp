// batch_stage_test: the loader's batch stage (LoaderOptions::batch_transform, issue 34): the
// ops run on each batch with the batch's own context (seed, epoch, sequence, indices), off the
// consumer's thread, on the CPU path and through the copy stage; the same batches for 1 and 4
// workers and after a resume with the pipeline on; an op that fails fails its batch (naming the
// op and the batch) and the epoch goes on; a pipeline that cannot take the fields is refused.
// The CUDA test runs where a GPU is usable (skipped otherwise): the stage's work is ordered
// before the batch's fence on the consumer's stream.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/augment.h"
#include "conveyor/fields.h"
#include "test_support.h"

namespace conveyor {
namespace {

using testing::IndexSource;
using testing::InstantCopyEngine;
using testing::TempDir;

struct Received {
  uint64_t epoch;
  size_t sequence;
  std::vector<size_t> indices;
  std::vector<at::Tensor> fields;  // cloned, on the CPU
};

Received copy_of(const Batch& b) {
  Received r{b.epoch, b.sequence, b.indices, {}};
  for (const auto& f : b.fields) r.fields.push_back(f.to(at::kCPU).clone());
  return r;
}

void expect_identical(const Received& got, const Received& want, const std::string& where) {
  EXPECT_EQ(got.epoch, want.epoch) << where;
  EXPECT_EQ(got.sequence, want.sequence) << where;
  EXPECT_EQ(got.indices, want.indices) << where;
  ASSERT_EQ(got.fields.size(), want.fields.size()) << where;
  for (size_t f = 0; f < got.fields.size(); ++f) {
    EXPECT_TRUE(got.fields[f].equal(want.fields[f])) << where << ": field " << f << " differs";
  }
}

// The recipe's ops that exist: erasing, normalize, MixUp/CutMix over the folder's 3 classes.
std::shared_ptr<const BatchOp> recipe() {
  RandomErasingOptions erasing;
  erasing.p = 0.5;
  MixUpCutMixOptions mix;
  mix.mixup_alpha = 0.2;
  mix.cutmix_alpha = 1.0;
  mix.num_classes = 3;
  return compose({random_erasing(erasing), normalize({}), mixup_cutmix(mix)});
}

LoaderOptions config(size_t workers, size_t chunk, std::shared_ptr<const BatchOp> transform) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = workers;
  o.chunk_size = chunk;
  o.seed = 11;
  o.batch_transform = std::move(transform);
  return o;
}

class BatchStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::make_small_folder(dir.path(), {"a", "b", "c"}, 6, 48, 40);  // 18 images: 5 batches
  }
  std::shared_ptr<SampleSource> source() const {
    return ImageSource::image_folder(dir.path(), ImageTransform::train(24));
  }
  // Two epochs, all batches.
  std::vector<Received> run(LoaderOptions o, bool copy_stage = false) const {
    DataLoader loader(source(), std::move(o), RandomSampler::make(7),
                      copy_stage ? std::make_unique<InstantCopyEngine>() : nullptr);
    std::vector<Received> got;
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : loader) got.push_back(copy_of(b));
    }
    return got;
  }
  TempDir dir;
};

// The folder's files in path order, as a source of views: "global" [2, 3, 24, 24] and "local"
// [3, 3, 12, 12], and "label" (the file's number).
class FolderFiles final : public MemberReader {
 public:
  explicit FolderFiles(const std::filesystem::path& root) {
    std::vector<std::filesystem::path> paths;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) paths.push_back(e.path());
    }
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      std::ifstream in(p, std::ios::binary);
      files_.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  size_t size() const override { return files_.size(); }
  void read(const SampleContext& ctx, MemberList& out) override {
    const std::vector<char>& f = files_.at(ctx.index);
    out.add_bytes("jpg", reinterpret_cast<const uint8_t*>(f.data()), f.size());
    out.add_integer("cls", static_cast<int64_t>(ctx.index));
  }

 private:
  std::vector<std::vector<char>> files_;
};

std::shared_ptr<SampleSource> views_source(const std::filesystem::path& root) {
  ImageTransform t = ImageTransform::train(24);
  t.views = {{"global", 2, ImageTransform::train(24)}, {"local", 3, ImageTransform::train(12)}};
  return FieldSource::from_reader(
      std::make_shared<FolderFiles>(root),
      {{"image", Field::image("jpg", t)}, {"label", Field::integer("cls")}});
}

// DINOv2's shape of pipeline: an op per global view, one for every local view, exact ops (so that
// the CPU and CUDA agree to the bit but for Normalize's float arithmetic).
std::shared_ptr<const BatchOp> per_view_recipe() {
  RandomErasingOptions erasing;
  erasing.p = 0.5;
  return per_field(
      {{"global",
        {compose({random_solarize(128, 1.0), normalize({})}),
         compose({random_erasing(erasing), random_solarize(100, 0.5), normalize({})})}},
       {"local", {compose({random_erasing(erasing), random_solarize(64, 0.5)})}}});
}

TEST_F(BatchStageTest, TheStageAppliesThePipelineWithTheBatchsOwnContext) {
  const std::vector<Received> plain = run(config(2, 2, nullptr));
  const std::vector<Received> staged = run(config(2, 2, recipe()));
  ASSERT_EQ(plain.size(), staged.size());
  const auto op = recipe();
  for (size_t i = 0; i < plain.size(); ++i) {
    const std::string where = "batch " + std::to_string(i);
    BatchFields fields;
    fields.specs = source()->fields();
    fields.tensors = {plain[i].fields[0].clone(), plain[i].fields[1].clone()};
    BatchContext ctx;
    ctx.seed = 11;
    ctx.epoch = plain[i].epoch;
    ctx.sequence = plain[i].sequence;
    ctx.indices = plain[i].indices;
    apply_op(*op, fields, ctx);
    EXPECT_EQ(staged[i].fields[0].scalar_type(), at::kFloat) << where;
    EXPECT_EQ(staged[i].fields[1].sizes().vec(),
              (std::vector<int64_t>{static_cast<int64_t>(plain[i].indices.size()), 3}))
        << where;
    EXPECT_TRUE(
        staged[i].fields[1].sum(1).allclose(at::ones({staged[i].fields[1].size(0)}), 0, 1e-6))
        << where << ": soft targets sum to 1";
    expect_identical(staged[i], {ctx.epoch, ctx.sequence, ctx.indices, fields.tensors}, where);
  }
}

TEST_F(BatchStageTest, SameBatchesForOneAndFourWorkersAndThroughTheCopyStage) {
  const std::vector<Received> reference = run(config(1, 0, recipe()));
  const std::vector<Received> four = run(config(4, 1, recipe()));
  const std::vector<Received> copied = run(config(3, 2, recipe()), /*copy_stage=*/true);
  ASSERT_EQ(reference.size(), 10u);
  ASSERT_EQ(four.size(), reference.size());
  ASSERT_EQ(copied.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    expect_identical(four[i], reference[i], "4 workers, batch " + std::to_string(i));
    expect_identical(copied[i], reference[i], "copy stage, batch " + std::to_string(i));
  }
}

TEST_F(BatchStageTest, AResumeAtEverySavePointGivesTheSameBatches) {
  const std::vector<Received> reference = run(config(2, 0, recipe()));
  const size_t per_epoch = reference.size() / 2;
  for (size_t k = 0; k <= per_epoch; ++k) {
    const std::string where = "saved after " + std::to_string(k) + " batches";
    LoaderState state;
    {
      DataLoader first(source(), config(2, 1, recipe()), RandomSampler::make(7));
      if (k > 0) {
        auto it = first.begin();
        for (size_t i = 1; i < k; ++i) ++it;
      }
      state = first.state();
    }
    DataLoader resumed(source(), config(4, 1, recipe()), RandomSampler::make(7));
    resumed.load_state(LoaderState::parse(state.serialize()));
    size_t next = k;
    for (int epoch = 0; epoch < 2 && next < reference.size(); ++epoch) {
      for (Batch& b : resumed) {
        ASSERT_LT(next, reference.size()) << where;
        expect_identical(copy_of(b), reference[next], where + ", batch " + std::to_string(next));
        ++next;
      }
    }
    EXPECT_EQ(next, reference.size()) << where;
  }
}

TEST_F(BatchStageTest, PerViewPipelinesGiveTheSameBatchesForAnyWorkersAndAfterAResume) {
  const auto run_views = [&](LoaderOptions o, bool copy_stage, size_t skip) {
    DataLoader loader(views_source(dir.path()), std::move(o), RandomSampler::make(7),
                      copy_stage ? std::make_unique<InstantCopyEngine>() : nullptr);
    if (skip > 0) {  // a resume after `skip` batches of a 2-worker loader
      LoaderState state;
      {
        DataLoader first(views_source(dir.path()), config(2, 1, per_view_recipe()),
                         RandomSampler::make(7));
        auto it = first.begin();
        for (size_t i = 1; i < skip; ++i) ++it;
        state = first.state();
      }
      loader.load_state(LoaderState::parse(state.serialize()));
    }
    std::vector<Received> got;
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : loader) got.push_back(copy_of(b));
    }
    return got;
  };
  const std::vector<Received> reference = run_views(config(1, 0, per_view_recipe()), false, 0);
  ASSERT_EQ(reference.size(), 10u);
  const Received& first = reference[0];
  ASSERT_EQ(first.fields.size(), 3u);
  EXPECT_EQ(first.fields[0].scalar_type(), at::kFloat);
  EXPECT_EQ(first.fields[0].sizes().vec(), (std::vector<int64_t>{4, 2, 3, 24, 24}));
  EXPECT_EQ(first.fields[1].scalar_type(), at::kByte);
  EXPECT_EQ(first.fields[1].sizes().vec(), (std::vector<int64_t>{4, 3, 3, 12, 12}));
  // Global view 0 is solarized at 128 whole: nothing of it lies above 127 after Normalize.
  const double top = (127.0 / 255.0 - 0.406) / 0.225;  // the highest channel's bound
  EXPECT_LE(first.fields[0].select(1, 0).max().item<double>(), top + 1e-4);
  const std::vector<Received> four = run_views(config(4, 1, per_view_recipe()), false, 0);
  const std::vector<Received> copied = run_views(config(3, 2, per_view_recipe()), true, 0);
  const std::vector<Received> resumed = run_views(config(4, 1, per_view_recipe()), false, 2);
  ASSERT_EQ(four.size(), reference.size());
  ASSERT_EQ(copied.size(), reference.size());
  ASSERT_EQ(resumed.size(), reference.size() - 2);
  for (size_t i = 0; i < reference.size(); ++i) {
    expect_identical(four[i], reference[i], "4 workers, batch " + std::to_string(i));
    expect_identical(copied[i], reference[i], "copy stage, batch " + std::to_string(i));
    if (i >= 2)
      expect_identical(resumed[i - 2], reference[i], "resumed, batch " + std::to_string(i));
  }
}

// Records the threads it ran on, fails on one chosen batch, and may take its time (a sleep).
class Probe final : public BatchOp {
 public:
  explicit Probe(std::optional<size_t> fail_on = std::nullopt,
                 std::chrono::milliseconds delay = std::chrono::milliseconds(0))
      : fail_on_(fail_on), delay_(delay) {}
  std::string name() const override { return "Probe()"; }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override { return in; }
  void apply(BatchFields& batch, const BatchContext& ctx) const override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads_.insert(std::this_thread::get_id());
    }
    if (fail_on_ && ctx.sequence == *fail_on_) throw std::runtime_error("synthetic op failure");
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    batch["label"].add_(100);
  }
  std::set<std::thread::id> threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }

 private:
  std::optional<size_t> fail_on_;
  std::chrono::milliseconds delay_;
  mutable std::mutex mutex_;
  mutable std::set<std::thread::id> threads_;
};

TEST(BatchStage, RunsOffTheConsumersThreadOnACpuLoader) {
  auto probe = std::make_shared<Probe>(std::nullopt, std::chrono::milliseconds(2));
  DataLoader loader(std::make_shared<IndexSource>(64), config(3, 2, probe));
  size_t rows = 0;
  for (Batch& b : loader) {
    for (size_t r = 0; r < b.size(); ++r) {
      ASSERT_EQ(b.labels()[static_cast<int64_t>(r)].item<int64_t>(),
                static_cast<int64_t>(b.indices[r]) + 100);
      ++rows;
    }
  }
  EXPECT_EQ(rows, 64u);
  EXPECT_FALSE(probe->threads().empty());
  EXPECT_EQ(probe->threads().count(std::this_thread::get_id()), 0u);
  // The workers' time in the stage is counted: at least the 2 ms each of the 16 batches slept.
  EXPECT_GE(loader.stats().transform_seconds, 0.032);
  DataLoader plain(std::make_shared<IndexSource>(8), config(1, 0, nullptr));
  for (Batch& b : plain) (void)b;
  EXPECT_EQ(plain.stats().transform_seconds, 0.0);
}

TEST(BatchStage, AFailingOpFailsItsBatchNamingTheOpAndTheEpochGoesOn) {
  for (const bool copy_stage : {false, true}) {
    const std::string where = copy_stage ? "copy stage" : "CPU";
    DataLoader loader(std::make_shared<IndexSource>(40), config(2, 1, std::make_shared<Probe>(3)),
                      nullptr, copy_stage ? std::make_unique<InstantCopyEngine>() : nullptr);
    std::vector<size_t> sequences;
    size_t failures = 0;
    for (;;) {
      try {
        std::optional<Batch> b = loader.next();
        if (!b) break;
        sequences.push_back(b->sequence);
      } catch (const BatchTransformError& e) {
        ++failures;
        EXPECT_EQ(e.op(), "Probe()") << where;
        EXPECT_EQ(e.sequence(), 3u) << where;
        const std::string what = e.what();
        EXPECT_NE(what.find("Probe() failed on batch 3 of epoch 0: synthetic op failure"),
                  std::string::npos)
            << where << ": " << what;
      }
    }
    EXPECT_EQ(failures, 1u) << where;
    EXPECT_EQ(sequences, (std::vector<size_t>{0, 1, 2, 4, 5, 6, 7, 8, 9})) << where;
  }
}

TEST(BatchStage, APipelineThatCannotTakeTheFieldsIsRefusedNamingTheOp) {
  try {  // IndexSource has no image field
    DataLoader loader(std::make_shared<IndexSource>(8), config(1, 0, recipe()));
    FAIL() << "a pipeline without its image field was taken";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("batch_transform Compose([RandomErasing"), std::string::npos) << what;
    EXPECT_NE(what.find("no field \"image\""), std::string::npos) << what;
  }
}

// Fixed fields (value, label) and a ragged one (items: index % 5 bytes, each the index's low
// byte), so that a test sees the stage leave ragged fields as they were.
class RaggedSource final : public SampleSource {
 public:
  size_t size() const override { return 30; }
  std::vector<FieldSpec> fields() const override {
    return {{"value", c10::ScalarType::Long, {}},
            {"label", c10::ScalarType::Long, {}},
            {"items", c10::ScalarType::Byte, {}, 8}};
  }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    const auto v = static_cast<int64_t>(ctx.index);
    std::memcpy(fields[0], &v, sizeof v);
    std::memcpy(fields[1], &v, sizeof v);
    RaggedRow row(fields[2]);
    const auto count = static_cast<int64_t>(ctx.index % 5);
    std::memset(row.items(), static_cast<int>(ctx.index & 0xff), static_cast<size_t>(count));
    row.set_count(count);
  }
};

TEST(BatchStage, RaggedFieldsPassUntouchedOnBothPaths) {
  for (const bool copy_stage : {false, true}) {
    const std::string where = copy_stage ? "copy stage" : "CPU";
    const auto batches = [&](std::shared_ptr<const BatchOp> op) {
      DataLoader loader(std::make_shared<RaggedSource>(), config(3, 1, std::move(op)), nullptr,
                        copy_stage ? std::make_unique<InstantCopyEngine>() : nullptr);
      std::vector<Batch> got;
      for (Batch& b : loader) {
        Batch kept = b;
        for (auto* of : {&kept.fields, &kept.offsets}) {
          for (at::Tensor& t : *of) {
            if (t.defined()) t = t.clone();
          }
        }
        got.push_back(std::move(kept));
      }
      return got;
    };
    const std::vector<Batch> plain = batches(nullptr);
    const std::vector<Batch> staged = batches(std::make_shared<Probe>());
    ASSERT_EQ(plain.size(), staged.size()) << where;
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(staged[i].fields[0].equal(plain[i].fields[0])) << where << " " << i;
      EXPECT_TRUE(staged[i].fields[1].equal(plain[i].fields[1] + 100)) << where << " " << i;
      EXPECT_TRUE(staged[i].fields[2].equal(plain[i].fields[2])) << where << " " << i;
      EXPECT_TRUE(staged[i].offsets[2].equal(plain[i].offsets[2])) << where << " " << i;
      EXPECT_GT(staged[i].fields[2].numel(), 0) << where << " " << i;
    }
  }
}

// Waits on the current (side) stream, then adds 1000 to the values: read too early, a value is
// still its index.
class SlowAdd final : public BatchOp {
 public:
  std::string name() const override { return "SlowAdd()"; }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override { return in; }
  void apply(BatchFields& batch, const BatchContext&) const override {
    at::cuda::sleep(200'000'000);  // about 0.1 s of GPU cycles on the current stream
    batch["value"].add_(1000);
  }
};

TEST(BatchStageGpu, TheStageRunsOnTheSideStreamBeforeTheFence) {
  const CudaStatus cuda = cuda_status();
  if (!cuda.usable()) GTEST_SKIP() << "no usable CUDA device: " << cuda.reason;
  LoaderOptions o = config(2, 0, std::make_shared<SlowAdd>());
  o.device = c10::Device(c10::DeviceType::CUDA, 0);
  DataLoader loader(std::make_shared<IndexSource>(32), o);
  // The consumer's own stream: nothing orders it after the loader's but the fence.
  const c10::cuda::CUDAStream consumer = c10::cuda::getStreamFromPool(false, 0);
  const c10::cuda::CUDAStreamGuard guard(consumer);
  size_t rows = 0;
  for (Batch& b : loader) {
    ASSERT_TRUE(b.fields[0].is_cuda());
    const at::Tensor values = b.fields[0].to(at::kCPU);  // on the consumer's stream
    for (size_t r = 0; r < b.size(); ++r, ++rows) {
      ASSERT_EQ(values[static_cast<int64_t>(r)].item<int64_t>(),
                static_cast<int64_t>(b.indices[r]) + 1000)
          << "batch " << b.sequence << " row " << r;
    }
  }
  EXPECT_EQ(rows, 32u);
}

TEST(BatchStageGpu, PerViewPipelinesOnTheDeviceGiveTheCpuLoadersBatches) {
  const CudaStatus cuda = cuda_status();
  if (!cuda.usable()) GTEST_SKIP() << "no usable CUDA device: " << cuda.reason;
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b", "c"}, 6, 48, 40);
  LoaderOptions cpu = config(2, 0, per_view_recipe());
  LoaderOptions gpu = cpu;
  gpu.device = c10::Device(c10::DeviceType::CUDA, 0);
  DataLoader on_cpu(views_source(dir.path()), cpu, RandomSampler::make(7));
  DataLoader on_gpu(views_source(dir.path()), gpu, RandomSampler::make(7));
  std::vector<Received> want;
  for (Batch& b : on_cpu) want.push_back(copy_of(b));
  size_t i = 0;
  for (Batch& b : on_gpu) {
    ASSERT_LT(i, want.size());
    ASSERT_TRUE(b.fields[0].is_cuda());
    const Received got = copy_of(b);  // on the current stream, after the fence
    EXPECT_EQ(got.indices, want[i].indices);
    // Normalize's float arithmetic may round apart by an ulp; the uint8 ops are exact.
    EXPECT_TRUE(at::allclose(got.fields[0], want[i].fields[0], 0, 1e-5)) << "batch " << i;
    EXPECT_TRUE(got.fields[1].equal(want[i].fields[1])) << "batch " << i;
    EXPECT_TRUE(got.fields[2].equal(want[i].fields[2])) << "batch " << i;
    ++i;
  }
  EXPECT_EQ(i, want.size());
}

}  // namespace
}  // namespace conveyor
