// Checkpoints (issue 11): DataLoader::save/load resumes mid-epoch bit-exactly whatever the workers,
// chunk size or prefetch depth; refuses a checkpoint that does not fit, naming the field; and
// shares the rest of an epoch out over another number of ranks (elastic resume). Issue 29: the
// same through DataLoader::state()/load_state() and LoaderState's byte form, which execute
// nothing; malformed bytes and numbers out of range are refused naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
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

// Iterates `resumed` (restored after `k` batches) for up to two epochs and expects the batches
// reference[k..] in order, and no more.
void expect_rest_of_run(DataLoader& resumed, const std::vector<Received>& reference, size_t k,
                        const std::string& where) {
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
      expect_rest_of_run(resumed, reference, k, where);
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

// --- The plain state (issue 29): DataLoader::state()/load_state() and LoaderState's byte form.

// A message that names `field` and is short (a state's data is quoted bounded).
void expect_refused(const std::function<void()>& body, const std::vector<std::string>& names,
                    const std::string& where) {
  try {
    body();
    ADD_FAILURE() << where << ": accepted";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    for (const std::string& name : names) {
      EXPECT_NE(message.find(name), std::string::npos) << where << ": " << message;
    }
    EXPECT_LT(message.size(), 600u) << where << ": " << message.substr(0, 600);
  }
}

// Every save point of two epochs of augmented JPEGs, through state().serialize() and parse():
// byte-identical to an uninterrupted run, with other workers and chunks; and the archive carries
// the same values.
TEST(ResumeState, TheByteFormResumesBitExactlyAtEverySavePoint) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b", "c"}, 6, 48, 40);  // 18 images: 5 batches
  auto source = [&] { return ImageSource::image_folder(dir.path(), ImageTransform::train(24)); };
  std::vector<Received> reference;
  {
    DataLoader loader(source(), config(2, 0), RandomSampler::make(7));
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : loader) reference.push_back(copy_of(b));
    }
  }
  const size_t per_epoch = reference.size() / 2;
  for (size_t k = 0; k <= per_epoch; ++k) {
    const std::string where = "saved after " + std::to_string(k) + " batches";
    std::string bytes;
    {
      DataLoader first(source(), config(2, 8), RandomSampler::make(7));
      if (k > 0) {
        auto it = first.begin();
        for (size_t i = 1; i < k; ++i) ++it;
      }
      const LoaderState state = first.state();
      bytes = state.serialize();
      EXPECT_EQ(LoaderState::parse(bytes), state) << where;
      // The archive is another carrier of the same values.
      DataLoader other(source(), config(1, 1), RandomSampler::make(7));
      load_from_string(other, save_to_string(first));
      EXPECT_EQ(other.state(), state) << where;
    }
    DataLoader resumed(source(), config(4, 1), RandomSampler::make(7));
    resumed.load_state(LoaderState::parse(bytes));
    expect_rest_of_run(resumed, reference, k, where);
  }
}

TEST(ResumeState, MalformedBytesAreAClearErrorNamingWhatIsWrong) {
  const std::string header = "conveyor-loader-state 1\n";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"", {"start"}},
      {"conveyor-loader-state 2\nepoch i 1\n", {"start"}},
      {header + "epoch x 1\n", {"epoch", "unknown type"}},
      {header + "epoch i 9223372036854775808\n", {"epoch", "range"}},
      {header + "epoch i -9223372036854775809\n", {"epoch", "range"}},
      {header + "epoch i 99999999999999999999999\n", {"epoch", "range"}},
      {header + "epoch i 12a\n", {"epoch"}},
      {header + "epoch i 012\n", {"epoch", "leading zeros"}},
      {header + "epoch i\n", {"epoch"}},
      {header + "epoch i 1\nepoch i 2\n", {"epoch", "twice"}},
      {header + "ep\x1boch i 1\n", {"key"}},
      {header + std::string(65, 'k') + " i 1\n", {"key"}},
      {header + "sampler s 99999999999:x\n", {"sampler", "4096"}},
      {header + "sampler s 100:random\n", {"sampler", "claims 100 bytes"}},
      {header + "sampler s 6:random", {"sampler", "end"}},
      {header + "order l 1000000000000 1\n", {"order", "claims 1000000000000 integers"}},
      {header + "order l 2 1\n", {"order"}},
      {header + "epoch i 1\ntrailing", {"key"}},
  };
  for (const auto& [bytes, names] : cases) {
    expect_refused([&] { (void)LoaderState::parse(bytes); }, names,
                   "'" + bytes.substr(0, 60) + "'");
  }
  // Keys and strings set directly are held to the same limits.
  LoaderState state;
  expect_refused([&] { state.set_string("sampler", std::string(size_t{64} << 20, 'x')); },
                 {"sampler", "4096"}, "a 64 MB string");
  expect_refused([&] { state.set_int(std::string(size_t{1} << 20, '\n'), 1); }, {"key"},
                 "a 1 MB key");
  for (size_t i = 0; i < LoaderState::kMaxEntries; ++i) state.set_int("k" + std::to_string(i), 1);
  expect_refused([&] { state.set_int("one_more", 1); }, {"one_more"}, "too many entries");
}

// A loader's state cut short anywhere is refused by parse() or by load_state() (a cut at the end
// of a line is a state without the keys after it), never accepted whole, never a crash.
TEST(ResumeState, EveryTruncationOfAStateIsRefused) {
  const LoaderOptions o = config(2, 0);
  std::string bytes;
  {
    DataLoader first(std::make_shared<IndexSource>(40), o, DistributedSampler::make(1, 2, true, 7));
    (void)first.next();
    bytes = first.state().serialize();
  }
  DataLoader loader(std::make_shared<IndexSource>(40), o, DistributedSampler::make(1, 2, true, 7));
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(loader.load_state(LoaderState::parse(bytes.substr(0, cut))), std::invalid_argument)
        << "cut at byte " << cut;
  }
  loader.load_state(LoaderState::parse(bytes));
  EXPECT_EQ(loader.next()->sequence, 1u);
}

// Every number of a state is checked against what it can mean before it is used: a world size
// of 2^62 used to overflow the elastic resume's product and replay the whole epoch.
TEST(ResumeState, NumbersOutOfRangeAreRefusedNamingTheFieldAndValue) {
  const LoaderOptions o = config(2, 0);
  LoaderState saved;
  {
    DataLoader first(std::make_shared<IndexSource>(40), o, RandomSampler::make(7));
    (void)first.next();
    (void)first.next();
    saved = first.state();
  }
  auto with = [&](const std::string& key, int64_t value) {
    LoaderState state = saved;
    state.set_int(key, value);
    return state;
  };
  const int64_t max = std::numeric_limits<int64_t>::max();
  const std::vector<std::tuple<std::string, int64_t, std::string>> cases{
      {"order_world_size", int64_t{1} << 62, "4611686018427387904"},
      {"order_world_size", 0, "0"},
      {"order_world_size", (int64_t{1} << 24) + 1, "16777217"},
      {"epoch", -1, "-1"},
      {"order_base", -1, "-1"},
      {"order_base", 41, "41"},
      {"batches_received", -1, "-1"},
      {"epoch_complete", 2, "2"},
  };
  for (const auto& [key, value, shown] : cases) {
    DataLoader loader(std::make_shared<IndexSource>(40), o, RandomSampler::make(7));
    expect_refused([&] { loader.load_state(with(key, value)); }, {key, shown},
                   key + " = " + std::to_string(value));
    EXPECT_EQ(loader.next()->sequence, 0u) << key << ": the loader is unchanged";
  }
  {  // a complete epoch at the last epoch has no next one
    LoaderState state = with("epoch", max);
    state.set_int("epoch_complete", 1);
    DataLoader loader(std::make_shared<IndexSource>(40), o, RandomSampler::make(7));
    expect_refused([&] { loader.load_state(state); }, {"epoch", std::to_string(max)},
                   "a complete last epoch");
  }
  {  // more batches than this loader's own order holds: refused when the epoch would start
    DataLoader loader(std::make_shared<IndexSource>(40), o, RandomSampler::make(7));
    loader.load_state(with("batches_received", max));
    expect_refused([&] { loader.start_epoch(); }, {"batches_received", std::to_string(max), "10"},
                   "batches_received past the order");
  }
}

TEST(ResumeState, AnElasticStateIsCheckedAgainstTheSavedRanksShares) {
  const LoaderOptions o = config(2, 0);
  LoaderState saved;  // rank 1 of 3, 2 batches of 4 received: 8 of 60 consumed per rank
  {
    DataLoader first(std::make_shared<IndexSource>(60), o, DistributedSampler::make(1, 3, true, 7));
    (void)first.next();
    (void)first.next();
    saved = first.state();
  }
  // Each of 3 ranks had 20 samples: 5 batches at most.
  LoaderState state = saved;
  state.set_int("batches_received", 6);
  DataLoader two_ranks(std::make_shared<IndexSource>(60), o,
                       DistributedSampler::make(0, 2, true, 7));
  expect_refused([&] { two_ranks.load_state(state); }, {"batches_received", "6", "5"},
                 "6 batches of 3 ranks' shares");
  state.set_int("batches_received", 5);  // every rank done: nothing left to share out
  two_ranks.load_state(state);
  EXPECT_FALSE(two_ranks.next().has_value());
  // The sampler's own world and rank are a world and a rank.
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, int64_t>>{{"sampler_world_size", 0},
                                                    {"sampler_world_size", int64_t{1} << 62},
                                                    {"sampler_rank", 3},
                                                    {"sampler_rank", -1}}) {
    LoaderState bad = saved;
    bad.set_int(key, value);
    expect_refused([&] { two_ranks.load_state(bad); }, {key, std::to_string(value)},
                   key + " = " + std::to_string(value));
  }
  EXPECT_THROW(DistributedSampler(0, DistributedSampler::kMaxWorldSize + 1), std::invalid_argument);
}

// The archive carrier reads every attribute through the same checks: one of another kind is
// refused naming it.
TEST(ResumeState, AnArchiveAttributeOfAnotherKindIsRefusedNamingIt) {
  DataLoader first(std::make_shared<IndexSource>(40), config(2, 0), RandomSampler::make(7));
  torch::serialize::OutputArchive archive;
  first.save(archive);
  archive.write("unexpected", c10::IValue(1.5));
  std::ostringstream bytes;
  archive.save_to(bytes);
  DataLoader loader(std::make_shared<IndexSource>(40), config(2, 0), RandomSampler::make(7));
  expect_refused([&] { load_from_string(loader, bytes.str()); }, {"unexpected", "Double"},
                 "a double attribute");
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

// --- Repeated augmentation (RASampler, issue 34): each sample drawn num_repeats times per epoch,
// each draw its own crop; the draws spread over the ranks; resumable, elastically too.

using Draw = std::pair<size_t, uint32_t>;  // (index, repeat)

std::vector<Draw> draws_of(const Sampler& s, size_t n, uint64_t epoch, size_t consumed) {
  std::vector<size_t> indices;
  std::vector<uint32_t> repeats;
  s.remaining_draws(n, epoch, consumed, indices, repeats);
  EXPECT_EQ(indices.size(), repeats.size());
  std::vector<Draw> out;
  for (size_t i = 0; i < indices.size(); ++i) out.emplace_back(indices[i], repeats[i]);
  return out;
}

TEST(RASampler, EachSampleIsDrawnKTimesSpreadOverTheRanksWithEqualShares) {
  for (const auto& [n, world, k, round] : std::vector<std::tuple<size_t, size_t, uint32_t, size_t>>{
           {40, 3, 3, 0}, {40, 1, 3, 0}, {100, 4, 4, 0}, {600, 2, 3, 256}, {37, 5, 2, 0}}) {
    const std::string where = "n " + std::to_string(n) + ", world " + std::to_string(world) +
                              ", k " + std::to_string(k) + ", round " + std::to_string(round);
    const size_t selected = round == 0 ? n : n / round * round;
    std::map<size_t, std::set<uint32_t>> repeats_of;
    std::vector<std::vector<Draw>> ranks;
    for (size_t r = 0; r < world; ++r) {
      const RASampler s(r, world, k, true, 7, round);
      ranks.push_back(draws_of(s, n, 2, 0));
      EXPECT_EQ(ranks.back().size(), selected / world) << where << ": equal shares";
      std::vector<size_t> plain;
      s.indices(n, 2, plain);
      EXPECT_EQ(plain.size(), ranks.back().size()) << where;
      for (const auto& [index, repeat] : ranks.back()) {
        EXPECT_LT(repeat, k) << where;
        EXPECT_TRUE(repeats_of[index].insert(repeat).second)
            << where << ": sample " << index << " repeat " << repeat << " drawn twice";
      }
    }
    // The global order: entry p (rank p % world) is draw p % k of the permutation's p / k-th
    // sample, so every sample but the last one taken has all k repeats.
    size_t whole = 0;
    for (const auto& [index, repeats] : repeats_of) whole += repeats.size() == k;
    EXPECT_GE(whole + 1, repeats_of.size()) << where;
    EXPECT_EQ(ranks[0][0].second, 0u) << where;
    if (world > 1 && k > 1) {
      EXPECT_EQ(ranks[1][0].first, ranks[0][0].first) << where << ": repeats on the next rank";
      EXPECT_EQ(ranks[1][0].second, 1u) << where;
    }
  }
  EXPECT_THROW(RASampler(0, 1, 0), std::invalid_argument);
  EXPECT_THROW(RASampler(2, 2, 3), std::invalid_argument);
}

TEST(RASampler, EachRepeatOfAnImageGetsItsOwnCropAndRepeatZeroIsTheUnrepeatedDraw) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b"}, 6, 48, 40);  // 12 images
  auto source = [&] { return ImageSource::image_folder(dir.path(), ImageTransform::train(24)); };
  LoaderOptions o = config(2, 0);
  o.batch_size = 6;
  std::map<size_t, at::Tensor> unrepeated;  // the crop each index gets without repeats, epoch 0
  {
    DataLoader plain(source(), o, SequentialSampler::make());
    for (Batch& b : plain) {
      EXPECT_TRUE(b.repeats.empty());
      for (size_t r = 0; r < b.size(); ++r) unrepeated[b.indices[r]] = b.images()[r].clone();
    }
  }
  DataLoader repeated(source(), o, RASampler::make(0, 1, 3, true, 7, 0));
  std::map<size_t, std::map<uint32_t, at::Tensor>> crops;
  for (Batch& b : repeated) {
    ASSERT_EQ(b.repeats.size(), b.size());
    for (size_t r = 0; r < b.size(); ++r) crops[b.indices[r]][b.repeats[r]] = b.images()[r].clone();
  }
  ASSERT_EQ(crops.size(), 4u) << "12 draws: 4 samples, 3 repeats each";
  for (const auto& [index, by_repeat] : crops) {
    ASSERT_EQ(by_repeat.size(), 3u);
    EXPECT_TRUE(by_repeat.at(0).equal(unrepeated.at(index)))
        << "sample " << index << ": repeat 0 is the crop it gets unrepeated, bit for bit";
    EXPECT_FALSE(by_repeat.at(0).equal(by_repeat.at(1))) << "sample " << index;
    EXPECT_FALSE(by_repeat.at(1).equal(by_repeat.at(2))) << "sample " << index;
    EXPECT_FALSE(by_repeat.at(0).equal(by_repeat.at(2))) << "sample " << index;
  }
}

TEST(RASampler, EverySavePointResumesBitExactly) {
  TempDir dir;
  testing::make_small_folder(dir.path(), {"a", "b"}, 6, 48, 40);
  auto source = [&] { return ImageSource::image_folder(dir.path(), ImageTransform::train(24)); };
  auto sampler = [] { return RASampler::make(0, 1, 3, true, 7, 0); };
  std::vector<Received> reference;
  {
    DataLoader loader(source(), config(2, 0), sampler());
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (Batch& b : loader) reference.push_back(copy_of(b));
    }
  }
  const size_t per_epoch = reference.size() / 2;
  ASSERT_EQ(per_epoch, 3u);
  for (size_t k = 0; k <= per_epoch; ++k) {
    std::string checkpoint;
    {
      DataLoader first(source(), config(1, 1), sampler());
      if (k > 0) {
        auto it = first.begin();
        for (size_t i = 0; i + 1 < k; ++i) ++it;
      }
      checkpoint = save_to_string(first);
    }
    DataLoader resumed(source(), config(4, 1), sampler());
    load_from_string(resumed, checkpoint);
    expect_rest_of_run(resumed, reference, k, "saved after " + std::to_string(k) + " batches");
  }
  DataLoader three(source(), config(2, 0), sampler());
  DataLoader four(source(), config(2, 0), RASampler::make(0, 1, 4, true, 7, 0));
  EXPECT_THROW(load_from_string(four, save_to_string(three)), std::invalid_argument)
      << "another num_repeats is refused";
}

TEST(RASampler, ThreeRanksSavedResumeOnTwoDrawingTheRestOfTheGlobalOrderOnce) {
  const size_t n = 60;  // 20 draws per rank on 3 ranks: 5 batches of 4
  std::vector<std::vector<Draw>> before(3), after(2);
  std::vector<std::string> saved;
  for (size_t r = 0; r < 3; ++r) {
    DataLoader loader(std::make_shared<IndexSource>(n), config(2, 0),
                      RASampler::make(r, 3, 3, true, 7, 0));
    size_t received = 0;
    for (Batch& b : loader) {
      for (size_t i = 0; i < b.size(); ++i) before[r].emplace_back(b.indices[i], b.repeats[i]);
      if (++received == 2) break;
    }
    saved.push_back(save_to_string(loader));
  }
  for (size_t r = 0; r < 2; ++r) {
    DataLoader loader(std::make_shared<IndexSource>(n), config(2, 0),
                      RASampler::make(r, 2, 3, true, 7, 0));
    load_from_string(loader, saved[2]);
    for (Batch& b : loader) {
      for (size_t i = 0; i < b.size(); ++i) after[r].emplace_back(b.indices[i], b.repeats[i]);
    }
  }
  EXPECT_EQ(after[0].size(), 18u);  // (60 - 24) / 2
  EXPECT_EQ(after[1].size(), 18u);
  // Together: the global order's first 60 draws (20 samples x 3 repeats), each exactly once.
  std::vector<Draw> all;
  for (const auto* side : {&before, &after})
    for (const auto& rank : *side) all.insert(all.end(), rank.begin(), rank.end());
  std::vector<Draw> want;
  for (size_t r = 0; r < 3; ++r) {
    const auto d = draws_of(RASampler(r, 3, 3, true, 7, 0), n, 0, 0);
    want.insert(want.end(), d.begin(), d.end());
  }
  std::sort(all.begin(), all.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(all, want);
}

}  // namespace
}  // namespace conveyor
