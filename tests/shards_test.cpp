// Sharded datasets (issue 13, first slice): conveyor-prepare writes WebDataset tar shards and their
// index from an ImageFolder; ImageSource::tar_shards reads them back through the index, sample for
// sample and byte for byte what the folder gives, under the same samplers; undecodable inputs are
// skipped or stop the run; Python's tarfile reads the shards (shards_tarfile_check.py).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <torch/serialize.h>

#include "conveyor/loader.h"
#include "shards_test_support.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::make_small_folder;
using testing::TempDir;
using testing::write_bytes;
using namespace testing::shards;

TEST(ShardsTest, PreparedShardsReadBackAsTheFolder) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  EXPECT_NE(p.result.out.find("21 samples written, 0 skipped"), std::string::npos) << p.result.out;
  const auto shards = p.shard_paths();
  ASSERT_GE(shards.size(), 3u) << p.result.err;
  EXPECT_LE(shards.size(), 7u) << "most shards should hold several samples";
  EXPECT_TRUE(fs::exists(p.prefix.string() + ".index.json"));
  EXPECT_NE(p.result.err.find("wrote " + shards[0]), std::string::npos) << p.result.err;

  auto folder = std::shared_ptr<ImageSource>(ImageSource::image_folder(p.folder, small_train()));
  auto tars = std::shared_ptr<ImageSource>(ImageSource::tar_shards(shards, small_train()));
  ASSERT_EQ(tars->size(), folder->size());
  EXPECT_EQ(tars->classes(), folder->classes());
  for (size_t i = 0; i < folder->size(); ++i) {
    EXPECT_EQ(tars->items()[i].label, folder->items()[i].label) << i;
  }
  char member[32];
  std::snprintf(member, sizeof member, "%08d.jpg", 20);
  EXPECT_NE(tars->describe(20).find(".tar (member " + std::string(member) + ")"), std::string::npos)
      << tars->describe(20);
  EXPECT_EQ(tars->describe(20).rfind(p.prefix.string() + "-", 0), 0u) << tars->describe(20);

  // Same sampler, seed and transform: the same batches, byte for byte, in two epochs, with
  // another worker count, and through the distributed sampler on each of 2 ranks.
  for (uint64_t epoch : {0, 1}) {
    expect_same(read_epoch(folder, RandomSampler::make(3), epoch),
                read_epoch(tars, RandomSampler::make(3), epoch, 3));
  }
  for (size_t rank : {0, 1}) {
    expect_same(read_epoch(folder, DistributedSampler::make(rank, 2, true, 5)),
                read_epoch(tars, DistributedSampler::make(rank, 2, true, 5)));
  }
  // Evaluation transform, sequential order.
  auto folder_eval = std::shared_ptr<ImageSource>(
      ImageSource::image_folder(p.folder, ImageTransform::eval(24, 28)));
  auto tars_eval =
      std::shared_ptr<ImageSource>(ImageSource::tar_shards(shards, ImageTransform::eval(24, 28)));
  expect_same(read_epoch(folder_eval, nullptr), read_epoch(tars_eval, nullptr));
}

TEST(ShardsTest, ResumeMidEpochOverShards) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  auto tars = std::shared_ptr<ImageSource>(ImageSource::tar_shards(p.shard_paths(), small_train()));
  expect_resumes_exactly(
      [&] { return std::make_unique<DataLoader>(tars, small_batches(), RandomSampler::make(3)); },
      read_epoch(tars, RandomSampler::make(3), 1), 1);
}

TEST(ShardsTest, PythonTarfileReadsTheShards) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  TempDir scratch;
  const CommandResult check = run(std::string(CONVEYOR_PYTHON3) + " " + SHARDS_TARFILE_CHECK + " " +
                                      p.prefix.string() + ".index.json 21",
                                  scratch);
  EXPECT_EQ(check.status, 0) << check.err << check.out;
  EXPECT_NE(check.out.find("ok: 21 samples"), std::string::npos) << check.out;
}

TEST(ShardsTest, SameInputsSameBytesWhateverTheWorkers) {
  TempDir dir;
  make_small_folder(dir / "folder", kClasses, 5);
  for (const char* run_name : {"a", "b"}) {
    const std::string workers = std::string(run_name) == "a" ? "1" : "3";
    const CommandResult r =
        prepare((dir / "folder").string() + " " + (dir / run_name / "train").string() +
                    " --format wds --shard-size 24K --workers " + workers,
                dir);
    ASSERT_EQ(r.status, 0) << r.err;
  }
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir / "a")) {
    const auto name = entry.path().filename();
    EXPECT_EQ(slurp(entry.path()), slurp(dir / "b" / name)) << name;
    EXPECT_EQ(name.string().find(".tmp"), std::string::npos) << "temporary file left: " << name;
    ++files;
  }
  EXPECT_GE(files, 3u);  // shards and the index
}

TEST(ShardsTest, CorruptInputIsSkippedOrStopsTheRun) {
  TempDir dir;
  const fs::path folder = dir / "folder";
  make_small_folder(folder, kClasses, 4);
  // A truncated JPEG in the middle class: it reads, but does not decode.
  const fs::path bad = folder / "bee" / "img2.jpg";
  auto bytes = make_photo_jpeg(64, 48, 99);
  bytes.resize(bytes.size() / 3);
  write_bytes(bad, bytes);

  const CommandResult skip =
      prepare(folder.string() + " " + (dir / "s" / "train").string() +
                  " --format wds --shard-size 32K --workers 2 --on-error skip",
              dir);
  ASSERT_EQ(skip.status, 0) << skip.err;
  EXPECT_NE(skip.out.find("11 samples written, 1 skipped"), std::string::npos) << skip.out;
  EXPECT_NE(skip.err.find(bad.string()), std::string::npos) << skip.err;
  std::vector<std::string> all;
  for (const auto& entry : fs::directory_iterator(dir / "s")) {
    if (entry.path().extension() == ".tar") all.push_back(entry.path().string());
  }
  std::sort(all.begin(), all.end());
  auto source = ImageSource::tar_shards(all, small_train());
  ASSERT_EQ(source->size(), 11u);
  auto original = ImageSource::image_folder(folder, small_train());
  std::vector<int64_t> expected;
  for (const auto& item : original->items()) {
    if (item.path != bad.string()) expected.push_back(item.label);
  }
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(source->items()[i].label, expected[i]);
  for (size_t i = 0; i < source->size(); ++i) {
    EXPECT_EQ(source->describe(i).find("00000006.jpg"), std::string::npos)  // img2 of bee
        << "the skipped input is in the shards: " << source->describe(i);
  }

  const CommandResult stop =
      prepare(folder.string() + " " + (dir / "r" / "train").string() +
                  " --format wds --shard-size 32K --workers 2 --on-error raise",
              dir);
  EXPECT_EQ(stop.status, 1) << stop.out << stop.err;
  EXPECT_NE(stop.err.find(bad.string()), std::string::npos) << stop.err;
  EXPECT_NE(stop.out.find("1 failed"), std::string::npos) << stop.out;
  EXPECT_FALSE(fs::exists(dir / "r" / "train.index.json"));
  for (const auto& entry : fs::directory_iterator(dir / "r")) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

TEST(ShardsTest, BraceNotation) {
  EXPECT_EQ(expand_shard_braces("a-{000000..000002}.tar"),
            (std::vector<std::string>{"a-000000.tar", "a-000001.tar", "a-000002.tar"}));
  EXPECT_EQ(expand_shard_braces("{train,val}-{8..10}.tar"),
            (std::vector<std::string>{"train-8.tar", "train-9.tar", "train-10.tar", "val-8.tar",
                                      "val-9.tar", "val-10.tar"}));
  EXPECT_EQ(expand_shard_braces("x-{3..1}"), (std::vector<std::string>{"x-3", "x-2", "x-1"}));
  EXPECT_EQ(expand_shard_braces("{a,b{1,2}}"), (std::vector<std::string>{"a", "b1", "b2"}));
  EXPECT_EQ(expand_shard_braces("plain.tar"), (std::vector<std::string>{"plain.tar"}));
  EXPECT_EQ(expand_shard_braces("{x}.tar"), (std::vector<std::string>{"{x}.tar"}));
  EXPECT_THROW(expand_shard_braces("a-{000..001.tar"), std::invalid_argument);
  EXPECT_THROW(expand_shard_braces("a-}.tar"), std::invalid_argument);

  // Too much to expand is refused before it is built, by count or by text, and for several
  // patterns together (the shard fuzzer's out-of-memory: a million long names).
  EXPECT_EQ(expand_shard_braces("{0..999}{0..999}").size(), 1'000'000u);
  EXPECT_THROW(expand_shard_braces("{0..999}{0..1000}"), std::invalid_argument);
  const std::string long_name = "/data/" + std::string(100, 'x') + "-{0..999999}.tar";
  try {
    expand_shard_braces(long_name);
    ADD_FAILURE() << "64 MiB of names expanded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("64 MiB"), std::string::npos) << e.what();
  }
  EXPECT_THROW(expand_shard_locations({"a-{0..599999}", "b-{0..599999}"}), std::invalid_argument);

  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto shards = p.shard_paths();
  char last[16];
  std::snprintf(last, sizeof last, "%06zu", shards.size() - 1);
  auto listed = ImageSource::tar_shards(shards, small_train());
  auto braced =
      ImageSource::tar_shards({p.prefix.string() + "-{000000.." + last + "}.tar"}, small_train());
  auto url = ImageSource::tar_shards(
      {"file://" + p.prefix.string() + "-{000000.." + last + "}.tar"}, small_train());
  ASSERT_EQ(braced->size(), listed->size());
  ASSERT_EQ(url->size(), listed->size());
  for (size_t i = 0; i < listed->size(); ++i) {
    EXPECT_EQ(braced->describe(i), listed->describe(i));
    EXPECT_EQ(url->describe(i), listed->describe(i));
  }
  // A file:// URL whose path reads like a URL (a folder "x:" and in it "y", named as "x://y")
  // finds its index.
  const fs::path odd = p.dir / "x:" / "y";
  fs::create_directories(odd);
  fs::copy(p.prefix.parent_path(), odd, fs::copy_options::recursive);
  const std::string odd_url = "file://" + (p.dir / "x:").string() + "//y/train-";
  auto odd_shards =
      ImageSource::tar_shards({odd_url + "{000000.." + last + "}.tar"}, small_train());
  ASSERT_EQ(odd_shards->size(), listed->size());
  EXPECT_NE(odd_shards->describe(0).find("x://y/train-000000.tar"), std::string::npos)
      << odd_shards->describe(0);
  // A subset of the shards is a dataset of their samples.
  auto first = ImageSource::tar_shards({shards[0]}, small_train());
  EXPECT_GT(first->size(), 0u);
  EXPECT_LT(first->size(), listed->size());
}

TEST(ShardsTest, UnsupportedSourcesAreRefusedClearly) {
  for (const std::string url :
       {"ftp://example.com/train-000000.tar", "s3://bucket/train-{000000..000003}.tar"}) {
    try {
      ImageSource::tar_shards({url}, small_train());
      ADD_FAILURE() << "no exception for " << url;
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("unsupported URL scheme"), std::string::npos) << what;
      EXPECT_NE(what.find(url.substr(0, url.find(':'))), std::string::npos) << what;
    }
  }
  // Without an index a shard is streamed (shard_stream_test): one that holds no sample, or is
  // missing, is refused naming it.
  TempDir dir;
  write_bytes(dir / "orphan-000000.tar", std::vector<uint8_t>(1024, 0));
  try {
    ImageSource::tar_shards({(dir / "orphan-000000.tar").string()}, small_train());
    ADD_FAILURE() << "no exception for a shard without samples";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("hold no samples"), std::string::npos) << e.what();
  }
  try {
    ImageSource::tar_shards({(dir / "missing.tar").string()}, small_train());
    ADD_FAILURE() << "no exception for a missing shard";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.tar"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ImageSource::tar_shards({}, small_train()), std::invalid_argument);
}

// A shard cut short fails only the samples whose members it cuts: under kSkip every other
// sample arrives and the cut ones are counted; under kRaise the error names the shard, the
// member and the sample. A shard longer than its index says was rewritten: refused up front.
TEST(ShardsTest, ATruncatedShardFailsOnlyTheSamplesItCuts) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto shards = p.shard_paths();
  const auto members = indexed_members(p.prefix.string() + ".index.json");
  ASSERT_EQ(members.size(), 21u);
  const std::string cut_name = fs::path(shards[1]).filename().string();
  // Cut the shard in the middle of its second member.
  std::vector<size_t> in_shard;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].shard == cut_name) in_shard.push_back(i);
  }
  ASSERT_GE(in_shard.size(), 2u);
  const IndexedMember& second = members[in_shard[1]];
  fs::resize_file(shards[1], second.offset + second.size / 2);
  const std::vector<size_t> cut(in_shard.begin() + 1, in_shard.end());

  auto source = std::shared_ptr<ImageSource>(ImageSource::tar_shards(shards, small_train()));
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  options.on_error = ErrorPolicy::kSkip;
  {
    DataLoader loader(source, options);
    std::set<size_t> seen;
    for (Batch& batch : loader) seen.insert(batch.indices.begin(), batch.indices.end());
    std::set<size_t> spared;
    for (size_t i = 0; i < members.size(); ++i) {
      if (std::find(cut.begin(), cut.end(), i) == cut.end()) spared.insert(i);
    }
    EXPECT_EQ(seen, spared) << "every sample the cut spares arrives, and no cut one";
    std::vector<size_t> skipped;
    for (const auto& s : loader.stats().skipped_samples) skipped.push_back(s.index);
    std::sort(skipped.begin(), skipped.end());
    EXPECT_EQ(skipped, cut);
    EXPECT_EQ(loader.stats().skipped, cut.size());
  }
  options.on_error = ErrorPolicy::kRaise;
  {
    DataLoader loader(source, options);
    try {
      for (Batch& batch : loader) (void)batch;
      ADD_FAILURE() << "no error for the truncated shard";
    } catch (const SampleError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(shards[1] + " (member " + members[cut.front()].key + ".jpg)"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("truncated"), std::string::npos) << what;
      EXPECT_NE(what.find("sample " + std::to_string(cut.front())), std::string::npos) << what;
    }
  }
  // Longer than the index says: rewritten since, refused naming the shard.
  {
    std::ofstream grow(shards[2], std::ios::binary | std::ios::app);
    grow << std::string(512, '\0');
  }
  try {
    ImageSource::tar_shards(shards, small_train());
    ADD_FAILURE() << "no exception for a shard longer than its index says";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(shards[2]), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rewritten"), std::string::npos) << e.what();
  }
}

TEST(ShardsTest, CorruptMemberFailsItsSampleNamingShardAndMember) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const auto shards = p.shard_paths();
  auto probe = ImageSource::tar_shards(shards, small_train());
  // Overwrite sample 4's JPEG data in place (the shard keeps its size): its decode fails.
  uint64_t offset = 0;
  for (const IndexedMember& m : indexed_members(p.prefix.string() + ".index.json")) {
    if (m.key == "00000004") offset = m.offset;
  }
  ASSERT_NE(offset, 0u);
  const std::string shard = probe->describe(4).substr(0, probe->describe(4).find(" (member"));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    const std::string junk(64, 'x');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto source = std::shared_ptr<ImageSource>(ImageSource::tar_shards(shards, small_train()));
  LoaderOptions options;
  options.batch_size = 3;
  options.workers = 2;
  {
    DataLoader loader(source, options);
    try {
      for (Batch& batch : loader) (void)batch;
      ADD_FAILURE() << "no error for the corrupt member";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.index(), 4u);
      EXPECT_NE(e.path().find(shard), std::string::npos) << e.path();
      EXPECT_NE(e.path().find("00000004.jpg"), std::string::npos) << e.path();
    }
  }
  options.on_error = ErrorPolicy::kSkip;
  DataLoader loader(source, options);
  size_t samples = 0;
  for (Batch& batch : loader) {
    for (size_t i : batch.indices) EXPECT_NE(i, 4u);
    samples += batch.size();
  }
  EXPECT_EQ(samples, source->size());  // a substitute took its row
  EXPECT_EQ(loader.stats().skipped, 1u);
}

TEST(ShardsTest, FolderFormatWritesAnImageFolder) {
  TempDir dir;
  make_small_folder(dir / "folder", kClasses, 3);
  const CommandResult r = prepare(
      (dir / "folder").string() + " " + (dir / "copy").string() + " --format folder --workers 2",
      dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("9 samples written, 0 skipped"), std::string::npos) << r.out;
  auto original = ImageSource::image_folder(dir / "folder", small_train());
  auto copy = ImageSource::image_folder(dir / "copy", small_train());
  ASSERT_EQ(copy->size(), original->size());
  EXPECT_EQ(copy->classes(), original->classes());
  for (size_t i = 0; i < copy->size(); ++i) {
    EXPECT_EQ(copy->items()[i].label, original->items()[i].label);
    EXPECT_EQ(slurp(copy->items()[i].path), slurp(original->items()[i].path)) << i;
  }
  // A second run into the same, now full, folder is refused.
  const CommandResult again =
      prepare((dir / "folder").string() + " " + (dir / "copy").string() + " --format folder", dir);
  EXPECT_EQ(again.status, 1) << again.err;
}

TEST(ShardsTest, FileListKeepsItsLabels) {
  TempDir dir;
  make_small_folder(dir / "folder", kClasses, 2);
  const std::vector<int64_t> labels = {2, 0, 11, 2};
  {
    std::ofstream list(dir / "list.txt");
    list << "folder/ant/img0.jpg\t2\nfolder/ant/img1.jpg\t0\n"
         << (dir / "folder" / "bee" / "img0.jpg").string() << "\t11\nfolder/cow/img1.jpg\t2\n";
  }
  const CommandResult shards = prepare(
      (dir / "list.txt").string() + " " + (dir / "s" / "list").string() + " --format wds", dir);
  ASSERT_EQ(shards.status, 0) << shards.err;
  auto source = ImageSource::tar_shards({(dir / "s" / "list-000000.tar").string()}, small_train());
  ASSERT_EQ(source->size(), labels.size());
  EXPECT_TRUE(source->classes().empty());
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(source->items()[i].label, labels[i]);

  const CommandResult folder = prepare(
      (dir / "list.txt").string() + " " + (dir / "copy").string() + " --format folder", dir);
  ASSERT_EQ(folder.status, 0) << folder.err;
  auto copy = ImageSource::image_folder(dir / "copy", small_train());
  ASSERT_EQ(copy->classes().size(), 12u);  // 00 .. 11, empty ones included
  EXPECT_EQ(copy->classes()[11], "11");
  std::vector<int64_t> got;
  for (const auto& item : copy->items()) got.push_back(item.label);
  EXPECT_EQ(got, (std::vector<int64_t>{0, 2, 2, 11}));  // by label, then by key
}

// The JPEG's restart interval (DRI), its MCUs per row, and the RST markers in its scan; -1 where
// there is no DRI. Baseline files only (the rewrite's output).
struct RestartLayout {
  int interval = -1;
  int mcus_per_row = 0;
  int markers = 0;
  bool baseline = false;
};

RestartLayout restart_layout(const std::string& jpeg) {
  RestartLayout r;
  auto byte = [&](size_t i) { return static_cast<uint8_t>(jpeg[i]); };
  auto word = [&](size_t i) { return (byte(i) << 8) | byte(i + 1); };
  size_t i = 2;
  int width = 0, components = 0, max_h = 1;
  while (i + 4 <= jpeg.size()) {
    if (byte(i) != 0xFF) return r;
    const uint8_t marker = byte(i + 1);
    const size_t length = static_cast<size_t>(word(i + 2));
    if (marker == 0xDD) r.interval = word(i + 4);
    if (marker == 0xC0 || marker == 0xC1 || marker == 0xC2) {
      r.baseline = marker == 0xC0;
      width = word(i + 7);
      components = byte(i + 9);
      for (int c = 0; c < components; ++c) max_h = std::max(max_h, byte(i + 11 + 3 * c) >> 4);
    }
    if (marker == 0xDA) {
      for (size_t j = i + 2 + length; j + 1 < jpeg.size(); ++j) {
        if (byte(j) == 0xFF && byte(j + 1) >= 0xD0 && byte(j + 1) <= 0xD7) ++r.markers;
      }
      break;
    }
    i += 2 + length;
  }
  const int mcu = components == 1 ? 8 : 8 * max_h;
  r.mcus_per_row = (width + mcu - 1) / mcu;
  return r;
}

// --restart rewrites every kind of JPEG (gray, CMYK with and without the Adobe marker, YCCK,
// progressive, 4:4:4 and 4:2:0) losslessly: baseline, restart intervals that tile each MCU row,
// the same decoded pixels as the input, so the same batches; the summary gives the size change.
TEST(ShardsTest, RestartMarkersAreLosslessAndTileEveryRow) {
  TempDir dir;
  GeneratorOptions g;
  g.classes = 1;
  g.images_per_class = 25;  // one of each of the 25 kinds in the mixed cycle
  g.mixed = true;
  g.threads = 2;
  generate_image_folder(dir / "mixed", g);
  const CommandResult result =
      prepare((dir / "mixed").string() + " " + (dir / "restarted").string() +
                  " --format folder --restart 3 --workers 2",
              dir);
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.out.find("25 samples written, 0 skipped"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("restart markers every 3 MCUs"), std::string::npos) << result.out;

  auto original =
      std::shared_ptr<ImageSource>(ImageSource::image_folder(dir / "mixed", small_train()));
  auto restarted =
      std::shared_ptr<ImageSource>(ImageSource::image_folder(dir / "restarted", small_train()));
  ASSERT_EQ(restarted->size(), 25u);
  JpegDecoder a, b;
  std::vector<uint8_t> in, out;
  for (size_t i = 0; i < 25; ++i) {
    read_file(original->items()[i].path, in);
    read_file(restarted->items()[i].path, out);
    const RestartLayout layout = restart_layout(std::string(out.begin(), out.end()));
    EXPECT_TRUE(layout.baseline) << restarted->items()[i].path;
    ASSERT_GE(layout.interval, 1) << restarted->items()[i].path;
    EXPECT_LE(layout.interval, 3);
    EXPECT_EQ(layout.mcus_per_row % layout.interval, 0)
        << "interval " << layout.interval << " does not tile " << layout.mcus_per_row;
    EXPECT_GT(layout.markers, 0);
    const DecodedImage x = a.decode(in.data(), in.size());
    const DecodedImage y = b.decode(out.data(), out.size());
    ASSERT_EQ(x.width, y.width);
    ASSERT_EQ(x.height, y.height);
    ASSERT_EQ(x.channels, y.channels);
    for (int row = 0; row < x.height; ++row) {
      ASSERT_EQ(std::memcmp(x.pixels + x.stride * static_cast<size_t>(row),
                            y.pixels + y.stride * static_cast<size_t>(row),
                            static_cast<size_t>(x.width * x.channels)),
                0)
          << restarted->items()[i].path << " row " << row;
    }
  }
  expect_same(read_epoch(original, RandomSampler::make(2)),
              read_epoch(restarted, RandomSampler::make(2)));

  // The same into shards.
  const CommandResult shards =
      prepare((dir / "mixed").string() + " " + (dir / "shards" / "r").string() +
                  " --format wds --restart 2 --workers 2",
              dir);
  ASSERT_EQ(shards.status, 0) << shards.err;
  auto tars = std::shared_ptr<ImageSource>(
      ImageSource::tar_shards({(dir / "shards" / "r-000000.tar").string()}, small_train()));
  expect_same(read_epoch(original, RandomSampler::make(2)),
              read_epoch(tars, RandomSampler::make(2)));
}

TEST(ShardsTest, UsageErrors) {
  TempDir dir;
  EXPECT_EQ(prepare("", dir).status, 2);
  EXPECT_EQ(prepare("a b --format zip", dir).status, 2);
  for (const char* bad : {"0", "x", "70000"}) {
    const CommandResult restart = prepare(std::string("a b --format wds --restart ") + bad, dir);
    EXPECT_EQ(restart.status, 2) << bad;
    EXPECT_NE(restart.err.find("--restart"), std::string::npos) << restart.err;
  }
  const CommandResult help = prepare("--help", dir);
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("--shard-size"), std::string::npos);
}

}  // namespace
}  // namespace conveyor
