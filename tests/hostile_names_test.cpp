// Names that come from data are never trusted (issue 29, findings 1 and 2, and a run of zero
// samples): a shard file whose name holds commas, braces or "pipe:" is read as the file it is and
// runs nothing, through ImageSource::tar_shards, conveyor-prepare and its index beside it; class
// names from an index never lead conveyor-prepare --format folder outside DST; and a SRC of no
// samples is an error. Each command here would create a file named PWNED in the test's folder.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "conveyor/datasets.h"
#include "shards/names.h"
#include "shards_test_support.h"

namespace conveyor {
namespace {

using namespace testing::shards;
using testing::TempDir;
namespace fs = std::filesystem;

// File names a downloaded dataset may hold, each of which ran "touch PWNED" (in the current
// folder) when read as a pattern. The first and third fit PREFIX-NNNNNN.tar, so their index is
// looked for beside them (once a command too: "touch PWNED;x.index.json").
const std::vector<std::string> kHostileNames = {
    "a.tar,pipe:touch PWNED;x-000000.tar",
    "{pipe:touch PWNED;y-000000,z}.tar",
    "pipe:touch PWNED;w-000000.tar",
    "b.tar,{pipe:touch PWNED,q}-{0..1}.tar",
    "'pipe:touch PWNED',\"pipe:touch PWNED\"-000000.tar",
    "file:,pipe:touch PWNED-000000.tar",
};

// Runs the body with `dir` as the current folder, and goes back.
class InFolder {
 public:
  explicit InFolder(const fs::path& dir) : back_(fs::current_path()) { fs::current_path(dir); }
  ~InFolder() { fs::current_path(back_); }
  InFolder(const InFolder&) = delete;
  InFolder& operator=(const InFolder&) = delete;

 private:
  fs::path back_;
};

// Files below `dir` whose name starts with PWNED: what a command that ran left.
std::vector<std::string> pwned(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().rfind("PWNED", 0) == 0) found.push_back(e.path().string());
  }
  return found;
}

// `text` quoted for /bin/sh.
std::string sh(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The samples of the first shard of `p`.
size_t first_shard_samples(const Prepared& p) {
  size_t n = 0;
  for (const auto& m : indexed_members(p.prefix.string() + ".index.json")) {
    n += m.shard == "train-000000.tar" ? 1 : 0;
  }
  return n;
}

// The index of `p`'s first shard alone, rewritten to name it `shard`.
nlohmann::json index_for(const Prepared& p, const std::string& shard) {
  nlohmann::json doc = nlohmann::json::parse(slurp(p.prefix.string() + ".index.json"));
  nlohmann::json shards = nlohmann::json::array();
  nlohmann::json samples = nlohmann::json::array();
  for (auto s : doc.at("shards")) {
    if (s.at("file") != "train-000000.tar") continue;
    s["file"] = shard;
    shards.push_back(s);
  }
  for (auto s : doc.at("samples")) {
    if (s.at("shard") != "train-000000.tar") continue;
    s["shard"] = shard;
    samples.push_back(s);
  }
  doc["shards"] = shards;
  doc["samples"] = samples;
  return doc;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The samples one epoch of `made` gives.
size_t samples_read(std::unique_ptr<ImageSource> made) {
  return samples_of(read_stream(std::shared_ptr<ImageSource>(std::move(made)))).size();
}

TEST(HostileNamesTest, PathSegmentsFromDataAreOneNameEach) {
  using detail::check_path_segment;
  using detail::path_under;
  const std::vector<std::string> refused = {
      "", ".", "..", "../../x", "/tmp/y", "a/b", "a\\b", "..\\x", std::string("a\0b", 3), "x/"};
  for (const std::string& bad : refused) {
    try {
      check_path_segment(bad, "class name");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("class name '", 0), 0u) << what;
      if (bad == "../../x" || bad == "/tmp/y") {
        EXPECT_NE(what.find(bad), std::string::npos) << what;
      }
    }
    EXPECT_THROW(path_under("dst", bad, "class name"), std::invalid_argument) << bad;
  }
  for (const std::string& good :
       std::vector<std::string>{"ant", "n01440764", "..x", "x..", "a b", "pipe:x", "{a,b}", "-"}) {
    EXPECT_NO_THROW(check_path_segment(good, "class name")) << good;
    EXPECT_EQ(path_under("dst", good, "class name"), fs::path("dst") / good);
    EXPECT_EQ(path_under("dst/", good, "class name"), fs::path("dst/") / good);
    EXPECT_EQ(path_under("/abs/./dst", good, "class name"), fs::path("/abs/./dst") / good);
  }
  // A NUL or control byte is shown, not printed raw.
  try {
    check_path_segment(std::string("a\0\x1b[2J", 6), "sample key");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a\\x00\\x1b[2J"), std::string::npos) << e.what();
  }
}

// A literal name is a local path (or a URL), never a pattern or a command; the index beside a
// local shard is a local path too.
TEST(HostileNamesTest, LiteralNamesAreLocalPathsAndSoAreTheirIndexes) {
  for (const std::string& name : kHostileNames) {
    const ShardLocation shard = literal_shard_location(name);
    EXPECT_EQ(shard.kind, ShardLocation::Kind::kLocal) << name;
    EXPECT_EQ(shard.location, name);
    if (detail::has_index_name(shard)) {
      EXPECT_EQ(detail::index_location_for(shard).kind, ShardLocation::Kind::kLocal) << name;
    }
  }
  EXPECT_EQ(literal_shard_location("HTTPS://h/a-{0..3}.tar").kind, ShardLocation::Kind::kHttp);
  EXPECT_EQ(literal_shard_location("HTTPS://h/a-{0..3}.tar").location, "HTTPS://h/a-{0..3}.tar");
  EXPECT_EQ(literal_shard_location("file:///x.tar").kind, ShardLocation::Kind::kLocal);
  // The index beside "pipe:touch PWNED;w-000000.tar" (relative: in the current folder).
  const ShardLocation index = detail::index_location_for(literal_shard_location(kHostileNames[2]));
  EXPECT_EQ(index.location, "pipe:touch PWNED;w.index.json");
}

// Every hostile name, as a real shard, relative and absolute, streamed (no index beside it) and,
// where its name fits PREFIX-NNNNNN.tar, at random through an index beside it that lists it: its
// samples are read, and nothing runs.
TEST(HostileNamesTest, ShardsNamedLikeCommandsAreReadAsTheFilesTheyAre) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const size_t expected = first_shard_samples(p);
  ASSERT_GT(expected, 0u);
  const fs::path hostile = p.dir / "hostile";
  fs::create_directories(hostile);
  InFolder here(hostile);
  for (const std::string& name : kHostileNames) {
    SCOPED_TRACE(name);
    fs::copy_file(p.shard_paths()[0], hostile / name);
    for (const std::string& path : {name, (hostile / name).string()}) {
      EXPECT_EQ(samples_read(ImageSource::tar_shards({literal_shard_location(path)}, fixed())),
                expected);
    }
    const ShardLocation shard = literal_shard_location(name);
    if (detail::has_index_name(shard)) {
      write_text(detail::index_location_for(shard).location, index_for(p, name).dump());
      auto source = ImageSource::tar_shards({shard}, fixed());
      ASSERT_EQ(source->size(), expected);  // random access: the index lists it
      EXPECT_EQ(source->items()[0].path.rfind(name + " (member ", 0), 0u)
          << source->items()[0].path;
      EXPECT_EQ(samples_read(std::move(source)), expected);
    }
    EXPECT_EQ(pwned(p.dir.path()), std::vector<std::string>{});
  }
}

// conveyor-prepare SRC: an argument that names an existing file is that file, literally (it ran
// the command, with 5 retries), relative or absolute, with or without an index beside it.
TEST(HostileNamesTest, PrepareReadsAnExistingFileLiterally) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const size_t expected = first_shard_samples(p);
  const fs::path hostile = p.dir / "hostile";
  fs::create_directories(hostile);
  int run_number = 0;
  for (const std::string& name : kHostileNames) {
    SCOPED_TRACE(name);
    fs::copy_file(p.shard_paths()[0], hostile / name);
    for (const std::string& src : {name, (hostile / name).string()}) {
      const fs::path dst = p.dir / ("out" + std::to_string(run_number++)) / "t";
      const CommandResult r = run("cd " + sh(hostile.string()) + " && " + CONVEYOR_PREPARE + " " +
                                      sh(src) + " " + sh(dst.string()) + " --format wds",
                                  p.dir);
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_NE(r.out.find(std::to_string(expected) + " samples written, 0 skipped"),
                std::string::npos)
          << r.out << r.err;
      EXPECT_TRUE(fs::exists(dst.string() + "-000000.tar"));
    }
    EXPECT_EQ(pwned(p.dir.path()), std::vector<std::string>{});
  }
  // A pattern the user typed is still a pattern: braces and a comma list.
  const CommandResult typed =
      prepare(sh(p.prefix.string() + "-{000000..000001}.tar," + p.shard_paths()[2]) + " " +
                  sh((p.dir / "typed" / "t").string()) + " --format wds",
              p.dir);
  EXPECT_EQ(typed.status, 0) << typed.err;
  EXPECT_NE(typed.err.find("3 shards from"), std::string::npos) << typed.err;
}

// --format folder with class names from a shard index that lead outside DST (the index can come
// from anywhere): refused with an error naming the class, before anything is written, and
// nothing appears outside DST.
TEST(HostileNamesTest, PrepareFolderRefusesClassNamesThatLeaveDst) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  const fs::path index = p.prefix.string() + ".index.json";
  const std::string original = slurp(index);
  const fs::path outside = p.dir / "outside";
  int run_number = 0;
  const std::vector<std::string> refused = {
      "../../x", (outside / "y").string(), "..", ".", "", "a/b", "a\\b", std::string("a\0b", 3)};
  for (const std::string& bad : refused) {
    nlohmann::json doc = nlohmann::json::parse(original);
    doc["classes"] = {"ant", bad, "cow"};
    write_text(index, doc.dump());
    const fs::path dst = p.dir / "work" / ("out" + std::to_string(run_number++));
    const CommandResult r =
        prepare(sh(p.shard_paths()[0]) + " " + sh(dst.string()) + " --format folder", p.dir);
    EXPECT_EQ(r.status, 1) << bad << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("class name '"), std::string::npos) << r.err;
    if (bad == "../../x" || bad.find('/') == 0) {
      EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
    }
    EXPECT_FALSE(fs::exists(p.dir / "x"));
    EXPECT_FALSE(fs::exists(outside));
    EXPECT_FALSE(fs::exists(dst / "ant")) << "written before the check";
  }
  write_text(index, original);
}

// A SRC that holds no samples is an error (it wrote an empty index and exited 0), and so is one
// whose every shard fails; the index is not written.
TEST(HostileNamesTest, PrepareOfZeroSamplesFails) {
  TempDir dir;
  write_text(dir / "empty-000000.tar", std::string(1024, '\0'));  // a tar's end, nothing else
  for (const std::string format : {"wds", "folder"}) {
    const fs::path dst = dir / format / "t";
    const CommandResult r = prepare(
        sh((dir / "empty-000000.tar").string()) + " " + sh(dst.string()) + " --format " + format,
        dir);
    EXPECT_EQ(r.status, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("no samples were read from " + (dir / "empty-000000.tar").string()),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(dst.string() + ".index.json"));
  }
}

}  // namespace
}  // namespace conveyor
