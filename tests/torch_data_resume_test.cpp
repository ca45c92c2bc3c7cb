// Checkpoints of the drop-in (issue 11): make_data_loader's loaders save their position and resume
// mid-epoch bit-exactly, whatever the workers: the collated path (a torch dataset + Stack<>()
// under torch's samplers, whose order the checkpoint carries) and SampleSources; a checkpoint that
// does not fit is refused, naming the field; the batched path refuses checkpoints.
#include <gtest/gtest.h>

#include <torch/serialize.h>
#include <torch/torch.h>

#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"
#include "torch_data_test_support.h"

namespace conveyor {
namespace {

using namespace torch_data_test;
using testing::TempDir;

template <typename Loader>
std::string save_to_string(const Loader& loader) {
  torch::serialize::OutputArchive archive;
  loader.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

template <typename Loader>
void load_from_string(Loader& loader, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  loader.load(archive);
}

// torch's global CPU generator, which torch's RandomSampler draws from.
at::Tensor rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state(const at::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// ---------------------------------------------------------------------------------------------
// The collated path: a torch dataset mapped with Stack<>() under torch's samplers.

using Example = td::Example<>;

Example copy_of(const Example& batch) { return {batch.data.clone(), batch.target.clone()}; }

void expect_identical(const Example& got, const Example& want, const std::string& where) {
  EXPECT_TRUE(got.data.equal(want.data)) << where << ": data differs";
  EXPECT_TRUE(got.target.equal(want.target))
      << where << ": target " << got.target << " instead of " << want.target;
}

constexpr size_t kSamples = 22;  // batches of 4: 6 per epoch, the last one of 2
constexpr size_t kPerEpoch = 6;
constexpr uint64_t kTorchSeed = 1234;

template <typename TorchSampler>
auto collated_loader(size_t workers, size_t max_jobs) {
  return make_data_loader<TorchSampler>(stacked(kSamples),
                                        DataLoaderOptions(4).workers(workers).max_jobs(max_jobs));
}

// Where a checkpoint is taken in epoch 0.
enum class SavePoint {
  kBeforeBegin,  // k = 0, nothing begun
  kAfterBegin,   // k = 0, the iterator not yet dereferenced
  kInBody,       // k >= 1, in the loop's body after receiving batch k
  kAfterEnd,     // k = all, the iterator at end()
};

// Runs epoch 0 of `loader` up to the save point and returns the checkpoint.
template <typename Loader>
std::string run_and_save(Loader& loader, SavePoint point, size_t k,
                         const std::vector<Example>& reference, const std::string& where) {
  if (point == SavePoint::kBeforeBegin) return save_to_string(loader);
  auto it = loader.begin();
  if (point == SavePoint::kAfterBegin) return save_to_string(loader);
  if (point == SavePoint::kAfterEnd) {
    for (; it != loader.end(); ++it) {
    }
    return save_to_string(loader);
  }
  for (size_t i = 0; i < k; ++i) {
    EXPECT_TRUE(it != loader.end()) << where;
    expect_identical(copy_of(*it), reference[i], where + ", batch " + std::to_string(i));
    if (i + 1 < k) ++it;
  }
  return save_to_string(loader);
}

// Every save point of epoch 0 under a torch sampler: a new loader (other workers, other max_jobs,
// torch seeded differently, so that only the checkpoint can tell the order) loads the checkpoint
// and yields the uninterrupted run's batches k+1 .. end of that epoch, byte for byte; with torch's
// generator state restored as well, the next epoch is the uninterrupted run's too. With
// `warm_up`, the new loader has iterated before the load (its engine built: the load goes to
// conveyor::DataLoader) instead of being fresh (the load waits for the engine).
template <typename TorchSampler>
void expect_resumes_bit_exact(bool warm_up) {
  torch::manual_seed(kTorchSeed);
  std::vector<Example> reference;  // epochs 0 and 1, uninterrupted
  {
    auto loader = collated_loader<TorchSampler>(2, 3);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (auto& batch : *loader) reference.push_back(copy_of(batch));
    }
  }
  ASSERT_EQ(reference.size(), 2 * kPerEpoch);
  struct Point {
    SavePoint point;
    size_t k;  // batches received at the save
  };
  const std::vector<Point> points{{SavePoint::kBeforeBegin, 0},     {SavePoint::kAfterBegin, 0},
                                  {SavePoint::kInBody, 1},          {SavePoint::kInBody, 3},
                                  {SavePoint::kInBody, 5},          {SavePoint::kInBody, kPerEpoch},
                                  {SavePoint::kAfterEnd, kPerEpoch}};
  for (const Point& p : points) {
    const std::string where = "saved after " + std::to_string(p.k) + " batches (point " +
                              std::to_string(static_cast<int>(p.point)) + ")";
    std::string checkpoint;
    at::Tensor rng;
    torch::manual_seed(kTorchSeed);  // the first epoch's permutation is the reference's
    {
      auto first = collated_loader<TorchSampler>(2, 3);
      checkpoint = run_and_save(*first, p.point, p.k, reference, where);
      rng = rng_state();
    }  // destroyed mid-epoch
    torch::manual_seed(kTorchSeed + 1);
    auto resumed = collated_loader<TorchSampler>(3, 5);
    if (warm_up) {
      auto it = resumed->begin();
      ++it;  // two batches of another epoch 0 received
    }
    load_from_string(*resumed, checkpoint);
    set_rng_state(rng);
    size_t next = p.k;
    for (int epoch = 0; epoch < 2 && next < reference.size(); ++epoch) {
      for (auto& batch : *resumed) {
        ASSERT_LT(next, reference.size()) << where;
        expect_identical(copy_of(batch), reference[next],
                         where + ", batch " + std::to_string(next));
        ++next;
      }
    }
    EXPECT_EQ(next, reference.size()) << where;
  }
}

TEST(TorchDataResume, CollatedRandomSamplerResumesEverySavePointBitExact) {
  expect_resumes_bit_exact<td::samplers::RandomSampler>(/*warm_up=*/false);
}

TEST(TorchDataResume, CollatedRandomSamplerResumesIntoALoaderThatAlreadyIterated) {
  expect_resumes_bit_exact<td::samplers::RandomSampler>(/*warm_up=*/true);
}

TEST(TorchDataResume, CollatedSequentialSamplerResumesEverySavePointBitExact) {
  expect_resumes_bit_exact<td::samplers::SequentialSampler>(/*warm_up=*/false);
  expect_resumes_bit_exact<td::samplers::SequentialSampler>(/*warm_up=*/true);
}

// The checkpoint carries the epoch's order: without torch's generator restored, the rest of the
// resumed epoch is still the saved run's, and the epoch after it is a fresh permutation of every
// sample (torch's generator decides it, as with torch::data).
TEST(TorchDataResume, CollatedLaterEpochsFollowTorchsGenerator) {
  torch::manual_seed(kTorchSeed);
  std::vector<Example> reference;
  std::string checkpoint;
  {
    auto first = collated_loader<td::samplers::RandomSampler>(2, 3);
    for (auto& batch : *first) {
      reference.push_back(copy_of(batch));
      if (reference.size() == 2) checkpoint = save_to_string(*first);
    }
  }
  torch::manual_seed(99);
  auto resumed = collated_loader<td::samplers::RandomSampler>(1, 2);
  load_from_string(*resumed, checkpoint);
  size_t next = 2;
  for (auto& batch : *resumed) {
    ASSERT_LT(next, reference.size());
    expect_identical(copy_of(batch), reference[next], "batch " + std::to_string(next));
    ++next;
  }
  EXPECT_EQ(next, reference.size());
  std::multiset<int64_t> seen;
  for (const auto& targets : epoch_targets(*resumed)) seen.insert(targets.begin(), targets.end());
  EXPECT_EQ(seen.size(), kSamples);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), kSamples);
}

// Resume is O(1): neither the shape probe nor the workers read a sample before the checkpoint
// (here every such sample would fail).
TEST(TorchDataResume, CollatedResumeReadsNoSampleBeforeTheCheckpoint) {
  std::string checkpoint;
  {
    auto first = collated_loader<td::samplers::SequentialSampler>(2, 3);
    auto it = first->begin();
    for (int i = 1; i < 3; ++i) ++it;  // 3 batches received: samples 0..11
    checkpoint = save_to_string(*first);
  }
  auto probe = std::make_shared<Probe>();
  for (size_t i = 0; i < 12; ++i) probe->fail_at.insert(i);
  auto resumed = make_data_loader<td::samplers::SequentialSampler>(stacked(kSamples, probe),
                                                                   DataLoaderOptions(4).workers(2));
  load_from_string(*resumed, checkpoint);
  EXPECT_EQ(epoch_targets(*resumed),
            (std::vector<std::vector<int64_t>>{{12, 13, 14, 15}, {16, 17, 18, 19}, {20, 21}}));
}

// A failed load changes nothing: the loader goes on with the batch after the one it held.
TEST(TorchDataResume, CheckpointWithAnotherBatchSizeIsRefusedNamingIt) {
  std::string checkpoint;
  {
    auto other = make_data_loader<td::samplers::SequentialSampler>(stacked(kSamples),
                                                                   DataLoaderOptions(5).workers(1));
    auto it = other->begin();
    ++it;
    checkpoint = save_to_string(*other);
  }
  // Before the engine exists (nothing iterated) ...
  auto fresh = collated_loader<td::samplers::SequentialSampler>(2, 3);
  std::string message = message_of([&] { load_from_string(*fresh, checkpoint); });
  EXPECT_NE(message.find("batch_size"), std::string::npos) << message;
  EXPECT_EQ(epoch_targets(*fresh).size(), kPerEpoch);  // epoch 0, from its first batch
  // ... and mid-epoch, once it does.
  auto loader = collated_loader<td::samplers::SequentialSampler>(2, 3);
  auto it = loader->begin();
  ++it;  // batch 1 received
  message = message_of([&] { load_from_string(*loader, checkpoint); });
  EXPECT_NE(message.find("batch_size"), std::string::npos) << message;
  EXPECT_THROW(load_from_string(*loader, checkpoint), std::invalid_argument);
  ++it;
  EXPECT_EQ(to_vector(it->target), (std::vector<int64_t>{8, 9, 10, 11}));
}

TEST(TorchDataResume, CheckpointOfAnotherSamplerKindIsRefusedNamingTheSampler) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b"}, 11, 32, 24);  // 22 images, as kSamples
  auto source_loader =
      make_data_loader(ImageSource::image_folder(dir.path(), ImageTransform::eval(16, 16)),
                       DataLoaderOptions(4).workers(1));
  const std::string checkpoint = save_to_string(*source_loader);
  auto loader = collated_loader<td::samplers::RandomSampler>(1, 2);
  const std::string message = message_of([&] { load_from_string(*loader, checkpoint); });
  EXPECT_NE(message.find("sampler"), std::string::npos) << message;
  EXPECT_NE(message.find("torch"), std::string::npos) << message;
}

TEST(TorchDataResume, IteratorFromBeforeALoadThrows) {
  std::string checkpoint;
  {
    auto first = collated_loader<td::samplers::SequentialSampler>(1, 2);
    auto it = first->begin();
    ++it;
    checkpoint = save_to_string(*first);
  }
  auto loader = collated_loader<td::samplers::SequentialSampler>(1, 2);
  auto old = loader->begin();
  ASSERT_EQ(to_vector(old->target), (std::vector<int64_t>{0, 1, 2, 3}));
  load_from_string(*loader, checkpoint);
  const std::string message = message_of([&] { ++old; });
  EXPECT_NE(message.find("load()"), std::string::npos) << message;
  auto it = loader->begin();
  EXPECT_EQ(to_vector(it->target), (std::vector<int64_t>{8, 9, 10, 11}));
}

// ---------------------------------------------------------------------------------------------
// The batched path: torch's workers own the order.

TEST(TorchDataResume, BatchedPathRefusesCheckpointsSayingWhatToUse) {
  auto loader = make_data_loader(Squares(10), DataLoaderOptions(3).workers(1));
  torch::serialize::OutputArchive out;
  EXPECT_THROW(loader->save(out), std::logic_error);
  const std::string message = message_of([&] { loader->save(out); });
  EXPECT_NE(message.find("Stack<>()"), std::string::npos) << message;
  EXPECT_NE(message.find("SampleSource"), std::string::npos) << message;
  torch::serialize::InputArchive in;
  EXPECT_THROW(loader->load(in), std::logic_error);
}

// ---------------------------------------------------------------------------------------------
// SampleSources (ImageSource): conveyor::DataLoader's checkpoints, through the drop-in.

struct Received {
  std::vector<size_t> indices;
  at::Tensor images, labels;
};

Received copy_of(const Batch& b) { return {b.indices, b.images().clone(), b.labels().clone()}; }

TEST(TorchDataResume, SampleSourceResumesBitExactThroughTheNextEpoch) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b", "c"}, 6, 48, 40);  // 18 images: 5 batches
  auto loader_with = [&](size_t workers) {
    // Random crops and flips: a pure function of (seed, epoch, index).
    return make_data_loader(ImageSource::image_folder(dir.path(), ImageTransform::train(24)),
                            DataLoaderOptions(4).workers(workers).seed(7));
  };
  std::vector<Received> reference;  // two uninterrupted epochs
  {
    auto loader = loader_with(2);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : *loader) reference.push_back(copy_of(b));
    }
  }
  const size_t per_epoch = reference.size() / 2;
  ASSERT_EQ(per_epoch, 5u);
  for (size_t k : {size_t{0}, size_t{1}, size_t{3}, per_epoch}) {
    const std::string where = "saved after " + std::to_string(k) + " batches";
    std::string checkpoint;
    {
      auto first = loader_with(1);
      if (k > 0) {
        auto it = first->begin();
        for (size_t i = 1; i < k; ++i) ++it;
        EXPECT_EQ(it->indices, reference[k - 1].indices) << where;
      }
      checkpoint = save_to_string(*first);
    }
    auto resumed = loader_with(3);
    load_from_string(*resumed, checkpoint);
    size_t next = k;
    for (int epoch = 0; epoch < 2 && next < reference.size(); ++epoch) {
      for (Batch& b : *resumed) {
        ASSERT_LT(next, reference.size()) << where;
        const Received got = copy_of(b);
        EXPECT_EQ(got.indices, reference[next].indices) << where << ", batch " << next;
        EXPECT_TRUE(got.images.equal(reference[next].images)) << where << ", batch " << next;
        EXPECT_TRUE(got.labels.equal(reference[next].labels)) << where << ", batch " << next;
        ++next;
      }
    }
    EXPECT_EQ(next, reference.size()) << where;
  }
}

TEST(TorchDataResume, SampleSourceRefusesAnotherBatchSizeNamingIt) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b"}, 4, 32, 24);
  auto source = [&] { return ImageSource::image_folder(dir.path(), ImageTransform::eval(16, 16)); };
  const std::string checkpoint =
      save_to_string(*make_data_loader(source(), DataLoaderOptions(2).workers(1)));
  auto loader = make_data_loader(source(), DataLoaderOptions(3).workers(1));
  const std::string message = message_of([&] { load_from_string(*loader, checkpoint); });
  EXPECT_NE(message.find("batch_size"), std::string::npos) << message;
  EXPECT_THROW(load_from_string(*loader, checkpoint), std::invalid_argument);
}

}  // namespace
}  // namespace conveyor
