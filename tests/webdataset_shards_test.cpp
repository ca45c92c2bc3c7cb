// Shards written by WebDataset's own ShardWriter (issue 20; PyPI webdataset in the project's
// venv, tests/webdataset_write.py): keys with folders, .jpg and .jpeg, .cls labels and an extra
// .json member, pax headers, no index. Read in both modes: streamed as they are (local paths,
// counted by a pass over their headers; over HTTP from `python3 -m http.server`; through
// pipe:cat), and at random once conveyor-prepare has read them (SRC in the same URL forms) and
// written them with an index. Each gives the ImageFolder's samples, every one once.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "conveyor/loader.h"
#include "python_http_server.h"
#include "shards_test_support.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::make_small_folder;
using testing::PythonHttpServer;
using testing::TempDir;
using namespace testing::shards;

// The small folder (3 classes x 7 images) as WebDataset shards of 4 samples: wds-000000.tar ..
struct WebDatasetShards {
  TempDir dir;
  fs::path folder = dir / "folder";
  fs::path out = dir / "wds";
  CommandResult result;
  size_t shards = 0;
  WebDatasetShards() {
    make_small_folder(folder, kClasses, 7);
    fs::create_directories(out);
    result = run(std::string(CONVEYOR_VENV_PYTHON) + " " + WEBDATASET_WRITE + " " +
                     folder.string() + " " + (out / "wds").string() + " 4",
                 dir);
    if (result.status == 0) shards = std::stoul(result.out);
  }
  // The shards in brace notation, after `prefix` (a folder, a URL's start, "pipe:cat DIR/").
  std::string pattern(const std::string& prefix) const {
    char last[16];
    std::snprintf(last, sizeof last, "%06zu", shards - 1);
    return prefix + "wds-{000000.." + last + "}.tar";
  }
};

#define ASSERT_WRITTEN(w)                                                                         \
  ASSERT_EQ((w).result.status, 0)                                                                 \
      << "webdataset's ShardWriter failed (scripts/setup installs webdataset==1.0.2 in the venv " \
      << CONVEYOR_VENV_PYTHON << "): " << (w).result.err;                                         \
  ASSERT_EQ((w).shards, 6u)

TEST(WebDatasetShards, StreamedLocallyOverHttpAndThroughAPipe) {
  WebDatasetShards w;
  ASSERT_WRITTEN(w);
  const auto everything = folder_samples(w.folder);
  ASSERT_EQ(everything.size(), 21u);

  auto local = shards_source({w.pattern(w.out.string() + "/")}, streamed());
  ASSERT_EQ(local->size(), 21u) << "counted by a pass over the tar headers";
  const auto from_disk = samples_of(read_stream(local, 1));
  EXPECT_EQ(as_set(from_disk), everything);

  ShardOptions counted = streamed();
  counted.epoch_samples = 21;  // no index beside them
  auto server = PythonHttpServer::standard_library(w.out);
  EXPECT_EQ(samples_of(read_stream(shards_source({w.pattern(server.url(""))}, counted), 1)),
            from_disk);
  EXPECT_EQ(samples_of(read_stream(
                shards_source({w.pattern("pipe:cat " + w.out.string() + "/")}, counted), 1)),
            from_disk);
  EXPECT_NE(local->describe(0).find("wds-0000"), std::string::npos) << local->describe(0);
}

TEST(WebDatasetShards, ReadAtRandomOnceConveyorPrepareIndexedThem) {
  WebDatasetShards w;
  ASSERT_WRITTEN(w);
  const auto everything = folder_samples(w.folder);

  // SRC as pipe: commands, DST indexed shards read at random.
  const fs::path prefix = w.dir / "indexed" / "train";
  const CommandResult prepared =
      prepare("'" + w.pattern("pipe:cat " + w.out.string() + "/") + "' " + prefix.string() +
                  " --format wds --shard-size 32K --workers 2",
              w.dir);
  ASSERT_EQ(prepared.status, 0) << prepared.err;
  EXPECT_NE(prepared.out.find("21 samples written, 0 skipped"), std::string::npos) << prepared.out;
  std::vector<std::string> indexed;
  for (size_t i = 0; fs::exists(prefix.string() + "-00000" + std::to_string(i) + ".tar"); ++i) {
    indexed.push_back(prefix.string() + "-00000" + std::to_string(i) + ".tar");
  }
  ASSERT_GE(indexed.size(), 2u);
  auto at_random = std::shared_ptr<ImageSource>(ImageSource::tar_shards(indexed, fixed()));
  ASSERT_EQ(at_random->size(), 21u);
  EXPECT_FALSE(at_random->items().empty()) << "random access, through the index";
  for (uint64_t epoch : {0, 1}) {
    EXPECT_EQ(as_set(samples_of(read_epoch(at_random, RandomSampler::make(3), epoch))), everything)
        << "epoch " << epoch;
  }

  // SRC as local paths, DST an ImageFolder: without an index the class folders are the labels.
  const fs::path again = w.dir / "folder-again";
  const CommandResult foldered = prepare(
      "'" + w.pattern(w.out.string() + "/") + "' " + again.string() + " --format folder", w.dir);
  ASSERT_EQ(foldered.status, 0) << foldered.err;
  EXPECT_TRUE(fs::is_directory(again / "000000") && fs::is_directory(again / "000002"));
  EXPECT_EQ(folder_samples(again), everything);
}

}  // namespace
}  // namespace conveyor
