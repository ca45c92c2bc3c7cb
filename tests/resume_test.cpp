// Checkpoints (issue 11): DataLoader::save/load resumes mid-epoch bit-exactly whatever the workers,
// chunk size or prefetch depth; refuses a checkpoint that does not fit, naming the field; and
// shares the rest of an epoch out over another number of ranks (elastic resume).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <torch/serialize.h>

#include "conveyor/loader.h"
#include "test_support.h"

namespace conveyor {
namespace {

using testing::IndexSource;
using testing::load_from_string;
using testing::save_to_string;
using testing::TempDir;

struct Received {
  uint64_t epoch;
  size_t sequence;
  std::vector<size_t> indices;
  std::vector<at::Tensor> fields;  // cloned: the loader's slots are reused
};

Received copy_of(const Batch& b) {
  Received r{b.epoch, b.sequence, b.indices, {}};
  for (const auto& f : b.fields) r.fields.push_back(f.clone());
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

LoaderOptions config(size_t workers, size_t chunk) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = workers;
  o.chunk_size = chunk;
  o.seed = 7;
  return o;
}

// Every early save point of a small epoch of augmented JPEGs (random crops and flips, a pure
// function of seed, epoch and index), for 1, 2 and 4 workers and chunk sizes 1 and 8: the resumed
// loader (built with another worker count and chunk size) yields byte-identical batches to an
// uninterrupted run, to the end of the epoch and through the next one.
TEST(Resume, EverySavePointIsBitExactWhateverTheWorkersAndChunks) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b", "c"}, 6, 48, 40);  // 18 images: 5 batches
  auto source = [&] { return ImageSource::image_folder(dir.path(), ImageTransform::train(24)); };
  std::vector<Received> reference;  // two uninterrupted epochs
  {
    DataLoader loader(source(), config(2, 0), RandomSampler::make(7));
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : loader) reference.push_back(copy_of(b));
    }
  }
  const size_t per_epoch = reference.size() / 2;
  ASSERT_EQ(per_epoch, 5u);
  const std::vector<std::pair<size_t, size_t>> configs{{1, 1}, {1, 8}, {2, 1},
                                                       {2, 8}, {4, 1}, {4, 8}};
  for (size_t c = 0; c < configs.size(); ++c) {
    const auto [workers, chunk] = configs[c];
    const auto [other_workers, other_chunk] = configs[(c + 3) % configs.size()];
    for (size_t k = 0; k <= per_epoch; ++k) {
      const std::string where = "saved after " + std::to_string(k) + " batches with " +
                                std::to_string(workers) + " workers, chunk " +
                                std::to_string(chunk);
      std::string checkpoint;
      {
        DataLoader first(source(), config(workers, chunk), RandomSampler::make(7));
        // The iterator holds the batch it points at: received, as in a training loop's body.
        if (k > 0) {
          auto it = first.begin();
          for (size_t i = 0; i < k; ++i) {
            ASSERT_TRUE(it != first.end()) << where;
            expect_identical(copy_of(*it), reference[i], where);
            if (i + 1 < k) ++it;
          }
        }
        checkpoint = save_to_string(first);
      }  // destroyed mid-epoch
      LoaderOptions o = config(other_workers, other_chunk);
      o.prefetch_factor = 1 + k % 3;
      DataLoader resumed(source(), o, RandomSampler::make(7));
      load_from_string(resumed, checkpoint);
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
}

// Resume is O(1): the resumed loader reads only the samples of the batches it still has to
// deliver, none of those before the checkpoint.
TEST(Resume, ReadsNoSampleBeforeTheCheckpoint) {
  LoaderOptions o = config(2, 0);
  std::string checkpoint;
  {
    DataLoader first(std::make_shared<IndexSource>(40), o, RandomSampler::make(7));
    auto it = first.begin();
    for (int i = 0; i < 6; ++i) ++it;  // 7 batches received
    checkpoint = save_to_string(first);
  }
  auto source = std::make_shared<IndexSource>(40);
  DataLoader resumed(source, o, RandomSampler::make(7));
  load_from_string(resumed, checkpoint);
  std::vector<size_t> sequences;
  for (Batch& b : resumed) sequences.push_back(b.sequence);
  EXPECT_EQ(sequences, (std::vector<size_t>{7, 8, 9}));
  EXPECT_EQ(source->calls.load(), 12u);  // the last 3 batches' samples, nothing else
}

TEST(Resume, ACompleteEpochResumesAtTheNextOne) {
  LoaderOptions o = config(2, 0);
  std::string checkpoint;
  {
    DataLoader first(std::make_shared<IndexSource>(10), o, RandomSampler::make(7));
    for (Batch& b : first) (void)b;
    checkpoint = save_to_string(first);
  }
  DataLoader resumed(std::make_shared<IndexSource>(10), o, RandomSampler::make(7));
  load_from_string(resumed, checkpoint);
  auto it = resumed.begin();
  EXPECT_EQ(resumed.epoch(), 1u);
  EXPECT_EQ(it->sequence, 0u);
}

TEST(Resume, ACheckpointThatDoesNotFitIsRefusedNamingTheField) {
  std::string checkpoint;
  {
    DataLoader first(std::make_shared<IndexSource>(40), config(2, 0), RandomSampler::make(7));
    (void)first.next();
    checkpoint = save_to_string(first);
  }
  auto refused = [&](DataLoader& loader, const std::string& field) {
    try {
      load_from_string(loader, checkpoint);
      ADD_FAILURE() << "a checkpoint with another " << field << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  LoaderOptions batch = config(2, 0);
  batch.batch_size = 8;
  DataLoader other_batch(std::make_shared<IndexSource>(40), batch, RandomSampler::make(7));
  refused(other_batch, "batch_size");
  DataLoader other_size(std::make_shared<IndexSource>(41), config(2, 0), RandomSampler::make(7));
  refused(other_size, "dataset size");
  LoaderOptions seed = config(2, 0);
  seed.seed = 8;
  DataLoader other_seed(std::make_shared<IndexSource>(40), seed, RandomSampler::make(7));
  refused(other_seed, "seed");
  DataLoader other_sampler(std::make_shared<IndexSource>(40), config(2, 0), RandomSampler::make(8));
  refused(other_sampler, "sampler seed");
  DataLoader sequential(std::make_shared<IndexSource>(40), config(2, 0));
  refused(sequential, "sampler");
  // A refused checkpoint changes nothing: the loader starts epoch 0 from its first batch.
  EXPECT_EQ(other_batch.begin()->sequence, 0u);
  EXPECT_EQ(other_batch.epoch(), 0u);
}

TEST(Resume, SavingMidEpochWithoutOrderingIsRefused) {
  LoaderOptions o = config(2, 0);
  o.enforce_ordering = false;
  DataLoader loader(std::make_shared<IndexSource>(40), o);
  (void)loader.next();
  torch::serialize::OutputArchive archive;
  EXPECT_THROW(loader.save(archive), std::logic_error);
}

// --- Distributed: the same world resumes bit-exactly; another world shares out the rest.

std::vector<std::vector<size_t>> run_ranks(size_t world, size_t n, size_t batches,
                                           const std::string& checkpoint,
                                           std::vector<std::string>* saved, bool drop_last) {
  std::vector<std::vector<size_t>> seen(world);
  for (size_t r = 0; r < world; ++r) {
    DataLoader loader(std::make_shared<IndexSource>(n), config(2, 0),
                      DistributedSampler::make(r, world, true, 7, drop_last));
    if (!checkpoint.empty()) load_from_string(loader, checkpoint);
    size_t received = 0;
    for (Batch& b : loader) {
      seen[r].insert(seen[r].end(), b.indices.begin(), b.indices.end());
      if (++received == batches) break;
    }
    if (saved) saved->push_back(save_to_string(loader));
  }
  return seen;
}

TEST(ResumeDistributed, ThreeRanksSavedResumeOnTwoCoveringTheRestExactlyOnce) {
  const size_t n = 60;  // 20 per rank on 3 ranks: 5 batches of 4
  std::vector<std::string> saved;
  const auto before = run_ranks(3, n, 2, "", &saved, false);               // 2 batches each
  const auto after = run_ranks(2, n, SIZE_MAX, saved[1], nullptr, false);  // any rank's state
  std::map<size_t, int> count;
  for (const auto& rank : before) {
    EXPECT_EQ(rank.size(), 8u);
    for (size_t i : rank) ++count[i];
  }
  EXPECT_EQ(after[0].size(), after[1].size()) << "equal counts per rank";
  EXPECT_EQ(after[0].size(), 18u);  // (60 - 24) / 2
  for (const auto& rank : after)
    for (size_t i : rank) ++count[i];
  ASSERT_EQ(count.size(), n);
  for (const auto& [index, c] : count) EXPECT_EQ(c, 1) << "sample " << index;
}

TEST(ResumeDistributed, AnUnevenRestIsPaddedWithItsHeadAsPyTorchDoes) {
  const size_t n = 61;  // 3 ranks: 21 each (2 padded); after 2 batches each, 37 left for 2 ranks
  std::vector<std::string> saved;
  const auto before = run_ranks(3, n, 2, "", &saved, false);
  const auto after = run_ranks(2, n, SIZE_MAX, saved[0], nullptr, false);
  EXPECT_EQ(after[0].size(), 19u);
  EXPECT_EQ(after[1].size(), 19u);
  std::map<size_t, int> count;
  for (const auto& rank : before)
    for (size_t i : rank) ++count[i];
  for (const auto& rank : after)
    for (size_t i : rank) ++count[i];
  ASSERT_EQ(count.size(), n) << "every sample seen";
  std::vector<size_t> twice;
  for (const auto& [index, c] : count)
    if (c == 2) twice.push_back(index);
  ASSERT_EQ(twice.size(), 1u) << "one padding sample";
  // The padding repeats the head of the rest: the first sample rank 0 gets after the resume.
  EXPECT_EQ(twice[0], after[0][0]);
}

TEST(ResumeDistributed, WithDropLastTheUnevenTailOfTheRestIsDropped) {
  const size_t n = 61;  // 3 ranks: 20 each, one dropped; after 2 batches each, 37 left
  std::vector<std::string> saved;
  const auto before = run_ranks(3, n, 2, "", &saved, true);
  const auto after = run_ranks(2, n, SIZE_MAX, saved[0], nullptr, true);
  EXPECT_EQ(after[0].size(), 18u);
  EXPECT_EQ(after[1].size(), 18u);
  std::map<size_t, int> count;
  for (const auto& rank : before)
    for (size_t i : rank) ++count[i];
  for (const auto& rank : after)
    for (size_t i : rank) ++count[i];
  EXPECT_EQ(count.size(), 60u) << "24 before and 36 after, the last of the rest dropped";
  for (const auto& [index, c] : count) EXPECT_EQ(c, 1) << "sample " << index;
}

TEST(ResumeDistributed, TheSameWorldResumesEachRankBitExactly) {
  const size_t n = 50;
  const auto whole = run_ranks(2, n, SIZE_MAX, "", nullptr, false);
  std::vector<std::string> saved;
  const auto before = run_ranks(2, n, 3, "", &saved, false);
  for (size_t r = 0; r < 2; ++r) {
    DataLoader loader(std::make_shared<IndexSource>(n), config(3, 1),
                      DistributedSampler::make(r, 2, true, 7));
    load_from_string(loader, saved[r]);
    std::vector<size_t> seen = before[r];
    for (Batch& b : loader) seen.insert(seen.end(), b.indices.begin(), b.indices.end());
    EXPECT_EQ(seen, whole[r]) << "rank " << r;
  }
}

}  // namespace
}  // namespace conveyor
