// Every member of a WebDataset sample (issue 31), beneath the sources: the shard reader under
// SampleRule::kMembers, index format version 2, conveyor-prepare --index-only and --format wds
// carrying every member. The shards are written by WebDataset's own writers
// (tests/webdataset_members_write.py, in the project's venv): CLIP-style samples with jpg, txt,
// json, cls, npy and boxes.npy members (one without a label, one without npy, an empty caption, a
// key long enough for a pax header), and an img2dataset-style shard (keys "%09d"; jpg, txt,
// json). Every member must come back byte for byte: from the reader, from the ranges an index
// lists, and from the shards conveyor-prepare writes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/storage.h"
#include "shards/index.h"
#include "shards/tar_reader.h"
#include "shards/tar_writer.h"
#include "shards_test_support.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::shards::CommandResult;
using testing::shards::run;
using testing::shards::slurp;

// A sample as a shard holds it: its key and its members (extension, bytes) in tar order.
struct Sample {
  std::string key;
  std::vector<std::pair<std::string, std::string>> members;
  std::map<std::string, std::string> by_extension() const {
    return {members.begin(), members.end()};
  }
};

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// The shards of webdataset_members_write.py, written once for the whole suite.
class ShardMembers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    written_ = run(std::string(CONVEYOR_VENV_PYTHON) + " " + WEBDATASET_MEMBERS_WRITE + " " +
                       dir_->path().string(),
                   *dir_);
    std::istringstream lines(slurp(*dir_ / "expected.tsv"));
    std::string line;
    while (std::getline(lines, line)) {
      std::vector<std::string> f;
      std::istringstream fields(line);
      for (std::string s; std::getline(fields, s, '\t');) f.push_back(s);
      if (f.size() == 3) f.emplace_back();  // an empty member
      ASSERT_EQ(f.size(), 4u) << line;
      std::vector<Sample>& shard = expected_[f[0]];
      if (shard.empty() || shard.back().key != f[1]) shard.push_back({f[1], {}});
      shard.back().members.emplace_back(f[2], from_hex(f[3]));
    }
  }
  static void TearDownTestSuite() {
    dir_.reset();
    expected_.clear();
  }
  void SetUp() override {
    ASSERT_EQ(written_.status, 0) << "webdataset_members_write.py failed (scripts/setup installs "
                                     "webdataset in the venv): "
                                  << written_.err;
    ASSERT_EQ(expected_.size(), 3u);
  }

  static fs::path path(const std::string& shard) { return *dir_ / shard; }
  static const std::vector<Sample>& expected(const std::string& shard) {
    return expected_.at(shard);
  }
  static std::vector<Sample> expected_clip() {
    std::vector<Sample> all = expected("clip-000000.tar");
    for (const Sample& s : expected("clip-000001.tar")) all.push_back(s);
    return all;
  }

  static std::unique_ptr<TempDir> dir_;
  static CommandResult written_;
  static std::map<std::string, std::vector<Sample>> expected_;
};
std::unique_ptr<TempDir> ShardMembers::dir_;
CommandResult ShardMembers::written_;
std::map<std::string, std::vector<Sample>> ShardMembers::expected_;

// Reads every position of the local shard `file` with the reader under `rule`.
std::vector<detail::TarSample> read_shard(const fs::path& file,
                                          detail::SampleRule rule = detail::SampleRule::kMembers) {
  const std::unique_ptr<StorageReader> reader = system_storage()->reader(RemoteOptions());
  const StreamCancel never;
  detail::TarSampleReader samples({ShardLocation::Kind::kLocal, file.string()}, *reader,
                                  RemoteOptions(), never, rule);
  std::vector<detail::TarSample> out;
  detail::TarSample s;
  while (samples.next(s)) out.push_back(s);
  return out;
}

Sample as_sample(const detail::TarSample& s) {
  Sample out{s.key, {}};
  for (const detail::TarMember& m : s.members) {
    const auto* p = reinterpret_cast<const char*>(s.bytes_of(m));
    out.members.emplace_back(m.extension, std::string(p, m.size));
  }
  return out;
}

std::string range_of(const std::string& file_bytes, uint64_t offset, uint64_t size) {
  if (offset > file_bytes.size() || size > file_bytes.size() - offset) return "<outside>";
  return file_bytes.substr(offset, size);
}

size_t count(const fs::path& file, detail::SampleRule rule) {
  const std::unique_ptr<StorageReader> reader = system_storage()->reader(RemoteOptions());
  return detail::count_tar_samples(*system_storage(), *reader, file.string(), rule);
}

TEST_F(ShardMembers, TheReaderGivesEveryMemberOfEverySampleByteForByte) {
  for (const char* shard : {"clip-000000.tar", "clip-000001.tar", "i2d-000000.tar"}) {
    SCOPED_TRACE(shard);
    const std::string file_bytes = slurp(path(shard));
    const std::vector<detail::TarSample> read = read_shard(path(shard));
    const std::vector<Sample>& want = expected(shard);
    ASSERT_EQ(read.size(), want.size());
    EXPECT_EQ(count(path(shard), detail::SampleRule::kMembers), want.size());
    for (size_t i = 0; i < read.size(); ++i) {
      const detail::TarSample& s = read[i];
      ASSERT_EQ(s.error, "") << s.name;
      EXPECT_EQ(s.key, want[i].key);
      EXPECT_EQ(as_sample(s).by_extension(), want[i].by_extension()) << s.name;
      EXPECT_EQ(s.members.size(), want[i].members.size()) << s.name;
      for (const detail::TarMember& m : s.members) {
        EXPECT_EQ(range_of(file_bytes, m.shard_offset, m.size),
                  std::string(reinterpret_cast<const char*>(s.bytes_of(m)), m.size))
            << s.name << " member " << m.extension << ": its data's place in the shard";
      }
      // The image sources' fields, filled as before.
      const auto by_extension = want[i].by_extension();
      EXPECT_EQ(std::string(s.bytes.begin(), s.bytes.end()), by_extension.at("jpg"));
      EXPECT_EQ(s.has_label, by_extension.count("cls") == 1) << s.name;
      if (s.has_label) {
        EXPECT_EQ(std::to_string(s.label), by_extension.at("cls"));
      }
    }
  }
  // Under the image rule nothing changes: the image and its label, no members.
  const std::vector<detail::TarSample> images =
      read_shard(path("clip-000000.tar"), detail::SampleRule::kImages);
  ASSERT_EQ(images.size(), 4u);
  EXPECT_TRUE(images[0].members.empty());
  EXPECT_EQ(std::string(images[0].bytes.begin(), images[0].bytes.end()),
            expected("clip-000000.tar")[0].by_extension().at("jpg"));
  EXPECT_EQ(images[0].name, path("clip-000000.tar").string() + " (member sample000.jpg)");
}

// A tar of `members` (name, data) in order, written by the project's own writer.
fs::path write_tar(const fs::path& file,
                   const std::vector<std::pair<std::string, std::string>>& m) {
  std::ofstream out(file, std::ios::binary);
  detail::TarWriter tar([&](const void* data, size_t size) {
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  });
  for (const auto& [name, data] : m) tar.add(name, data.data(), data.size());
  tar.finish();
  return file;
}

TEST(ShardMembersRules, AKeyWithoutAnImageIsASampleAndARepeatedExtensionKeepsTheFirst) {
  TempDir dir;
  const fs::path shard = write_tar(dir / "s.tar", {{"a.txt", "caption a"},
                                                   {"a.json", "{}"},
                                                   {"b.jpg", "not decoded here"},
                                                   {"b.cls", "7"},
                                                   {"c.txt", "first"},
                                                   {"c.TXT", "second"},
                                                   {"d/e.f.Boxes.NPY", "boxes"}});
  const std::vector<detail::TarSample> read = read_shard(shard);
  ASSERT_EQ(read.size(), 4u);
  EXPECT_EQ(count(shard, detail::SampleRule::kMembers), 4u);
  EXPECT_EQ(as_sample(read[0]).members, (std::vector<std::pair<std::string, std::string>>{
                                            {"txt", "caption a"}, {"json", "{}"}}));
  EXPECT_TRUE(read[0].bytes.empty());
  EXPECT_FALSE(read[0].has_label);
  EXPECT_EQ(read[0].name, shard.string() + " (sample a)");
  EXPECT_EQ(read[1].label, 7);
  EXPECT_EQ(read[1].name, shard.string() + " (member b.jpg)");
  EXPECT_EQ(as_sample(read[2]).members,
            (std::vector<std::pair<std::string, std::string>>{{"txt", "first"}}));
  EXPECT_EQ(read[3].key, "d/e");
  EXPECT_EQ(as_sample(read[3]).members,
            (std::vector<std::pair<std::string, std::string>>{{"f.boxes.npy", "boxes"}}));
  // The image sources' rule: only b.
  EXPECT_EQ(read_shard(shard, detail::SampleRule::kImages).size(), 1u);
  EXPECT_EQ(count(shard, detail::SampleRule::kImages), 1u);
}

TEST(ShardMembersRules, AKeyOverTheBoundsIsOneFailedPositionNamingTheShardAndKey) {
  TempDir dir;
  std::vector<std::pair<std::string, std::string>> members;
  for (size_t i = 0; i <= detail::kMaxSampleMembers; ++i) {
    members.emplace_back("many.e" + std::to_string(i), "x");
  }
  members.emplace_back("fine.txt", "read");
  const fs::path shard = write_tar(dir / "s.tar", members);
  const std::vector<detail::TarSample> read = read_shard(shard);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(count(shard, detail::SampleRule::kMembers), 2u);
  EXPECT_EQ(read[0].name, shard.string() + " (sample many)");
  EXPECT_NE(read[0].error.find("more than 64 members"), std::string::npos) << read[0].error;
  EXPECT_TRUE(read[0].members.empty());
  EXPECT_TRUE(read[0].data.empty());
  EXPECT_EQ(read[1].error, "");
  EXPECT_EQ(as_sample(read[1]).members,
            (std::vector<std::pair<std::string, std::string>>{{"txt", "read"}}));

  // A path over kMaxMemberPathBytes (a pax header holds it; ustar cannot): Python's tarfile.
  const fs::path script = dir / "long.py";
  std::ofstream(script)
      << "import io, sys, tarfile\n"
         "with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as t:\n"
         "    for name, data in [('k' * 1024 + '.txt', b'x'), ('ok.txt', b'y')]:\n"
         "        info = tarfile.TarInfo(name)\n"
         "        info.size = len(data)\n"
         "        t.addfile(info, io.BytesIO(data))\n";
  const fs::path pax = dir / "pax.tar";
  const CommandResult r =
      run(std::string(CONVEYOR_VENV_PYTHON) + " " + script.string() + " " + pax.string(), dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<detail::TarSample> long_read = read_shard(pax);
  ASSERT_EQ(long_read.size(), 2u);
  EXPECT_NE(long_read[0].name.find(std::string(100, 'k')), std::string::npos);
  EXPECT_NE(long_read[0].error.find("a member path of 1028 bytes (at most 1024)"),
            std::string::npos)
      << long_read[0].error;
  EXPECT_EQ(long_read[1].key, "ok");
  EXPECT_EQ(long_read[1].error, "");
}

// The members the index lists for each sample, as bytes read from the shard at their ranges.
std::vector<Sample> indexed_samples(const detail::ShardIndex& index, const fs::path& folder) {
  std::vector<Sample> out;
  for (const detail::IndexedShard& shard : index.shards) {
    const std::string file_bytes = slurp(folder / shard.file);
    EXPECT_EQ(shard.bytes, file_bytes.size()) << shard.file;
    for (const detail::IndexedSample& s : shard.samples) {
      Sample sample{s.key, {}};
      for (const detail::IndexedMember& m : shard.members_of(s)) {
        sample.members.emplace_back(index.member_names.at(m.name),
                                    range_of(file_bytes, m.offset, m.size));
      }
      out.push_back(std::move(sample));
    }
  }
  return out;
}

detail::ShardIndex read_index(const fs::path& file) {
  return detail::parse_index(slurp(file), file.string());
}

void expect_same_samples(const std::vector<Sample>& got, const std::vector<Sample>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].key, want[i].key);
    EXPECT_EQ(got[i].by_extension(), want[i].by_extension()) << want[i].key;
    EXPECT_EQ(got[i].members.size(), want[i].members.size()) << want[i].key;
  }
}

TEST_F(ShardMembers, IndexOnlyWritesAnIndexWhoseRangesHoldEveryMember) {
  TempDir scratch;
  const std::string prepare = CONVEYOR_PREPARE;
  const fs::path index = *dir_ / "clip.index.json";
  fs::remove(index);
  const std::string shards = (*dir_ / "clip-{000000..000001}.tar").string();
  CommandResult r = run(prepare + " --index-only '" + shards + "'", scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("indexed 7 samples"), std::string::npos) << r.out;
  const detail::ShardIndex parsed = read_index(index);
  expect_same_samples(indexed_samples(parsed, dir_->path()), expected_clip());
  std::vector<bool> labelled;
  for (const auto& shard : parsed.shards) {
    for (const auto& s : shard.samples) labelled.push_back(s.has_label);
  }
  EXPECT_EQ(labelled, (std::vector<bool>{true, true, true, false, true, true, true}));
  EXPECT_EQ(parsed.shards[0].samples[2].label, 2);
  // The image member's range for the image sources.
  const auto& first = parsed.shards[0].samples[0];
  EXPECT_EQ(range_of(slurp(path("clip-000000.tar")), first.offset, first.size),
            expected("clip-000000.tar")[0].by_extension().at("jpg"));

  // An index that exists is kept without --force, replaced with it.
  const std::string before = slurp(index);
  std::ofstream(index, std::ios::app) << " ";
  r = run(prepare + " --index-only '" + shards + "'", scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(index), before + " ");
  r = run(prepare + " --index-only '" + shards + "' --force", scratch);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(index), before) << "the same shards, the same index";
  EXPECT_TRUE(fs::exists(path("clip-000000.tar")));

  // img2dataset's shard: keys %09d, no labels.
  r = run(prepare + " --index-only " + path("i2d-000000.tar").string() + " --force", scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  const detail::ShardIndex i2d = read_index(*dir_ / "i2d.index.json");
  expect_same_samples(indexed_samples(i2d, dir_->path()), expected("i2d-000000.tar"));
  EXPECT_EQ(i2d.shards[0].samples[3].key, "000000003");
  EXPECT_FALSE(i2d.shards[0].samples[3].has_label);

  // Shards of two prefixes: --output is needed, and names where the index goes.
  r = run(prepare + " --index-only " + path("clip-000000.tar").string() + " " +
              path("i2d-000000.tar").string(),
          scratch);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--output"), std::string::npos) << r.err;
  const fs::path mixed = scratch / "mixed.json";
  r = run(prepare + " --index-only " + path("clip-000000.tar").string() + " " +
              path("i2d-000000.tar").string() + " --output " + mixed.string(),
          scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<Sample> both = expected("clip-000000.tar");
  for (const Sample& s : expected("i2d-000000.tar")) both.push_back(s);
  expect_same_samples(indexed_samples(read_index(mixed), dir_->path()), both);
}

TEST_F(ShardMembers, PrepareFormatWdsCarriesEveryMemberThrough) {
  TempDir out;
  const std::string prepare = CONVEYOR_PREPARE;
  CommandResult r = run(prepare + " '" + (*dir_ / "clip-{000000..000001}.tar").string() + "," +
                            path("i2d-000000.tar").string() + "' " + (out / "re").string() +
                            " --format wds --workers 2",
                        out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("12 samples written, 0 skipped"), std::string::npos) << r.out;
  std::vector<Sample> want = expected_clip();
  for (const Sample& s : expected("i2d-000000.tar")) want.push_back(s);
  for (size_t i = 0; i < want.size(); ++i) {
    char key[32];
    std::snprintf(key, sizeof key, "%08zu", i);
    want[i].key = key;  // the sample's number in SRC
  }
  std::vector<Sample> got;
  for (const fs::path& shard : {out / "re-000000.tar"}) {
    for (const detail::TarSample& s : read_shard(shard)) got.push_back(as_sample(s));
  }
  expect_same_samples(got, want);
  expect_same_samples(indexed_samples(read_index(out / "re.index.json"), out.path()), want);
  // Labels where the input had a decimal .cls.
  const detail::ShardIndex index = read_index(out / "re.index.json");
  EXPECT_FALSE(index.shards[0].samples[3].has_label);
  EXPECT_EQ(index.shards[0].samples[4].label, 1);
  EXPECT_FALSE(index.shards[0].samples[8].has_label);
}

// A minimal index of one shard "s.tar" of 4096 bytes around `sample` (the text of one sample).
std::string index_text(const std::string& sample, int version = 2) {
  return "{\"format\": \"conveyor-wds-index\", \"version\": " + std::to_string(version) +
         ", \"shards\": [{\"file\": \"s.tar\", \"bytes\": 4096, \"samples\": 1}], "
         "\"samples\": [" +
         sample + "]}";
}

TEST(ShardIndexVersions, AVersion1IndexStillLoadsAsOneJpgMemberAndItsLabel) {
  const detail::ShardIndex index = detail::parse_index(
      index_text(R"({"shard": "s.tar", "key": "k", "offset": 512, "size": 9, "label": 3})", 1),
      "v1");
  ASSERT_EQ(index.shards.at(0).samples.size(), 1u);
  const detail::IndexedSample& s = index.shards[0].samples[0];
  EXPECT_EQ(s.offset, 512u);
  EXPECT_EQ(s.size, 9u);
  EXPECT_EQ(s.label, 3);
  EXPECT_TRUE(s.has_label);
  const auto members = index.shards[0].members_of(s);
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(index.member_names.at(members[0].name), "jpg");
  EXPECT_EQ(members[0].offset, 512u);
  EXPECT_EQ(members[0].size, 9u);
  EXPECT_EQ(index.member_id("jpg"), members[0].name);
  EXPECT_EQ(index.member_id("txt"), detail::ShardIndex::kNoMember);
}

TEST(ShardIndexVersions, Version2WrittenAndReadBackIsTheSameIndex) {
  detail::ShardIndex index;
  index.classes = {"cat", "dog"};
  detail::IndexedShard& shard = index.shards.emplace_back();
  shard.file = "s.tar";
  shard.bytes = 4096;
  const std::vector<detail::IndexedMember> a = {{index.name_member("txt"), 512, 3},
                                                {index.name_member("jpeg"), 1024, 100}};
  detail::IndexedSample labelled;
  labelled.key = "a";
  labelled.label = 1;
  index.add_sample(shard, labelled, a);
  const std::vector<detail::IndexedMember> b = {{index.name_member("boxes.npy"), 2048, 0}};
  detail::IndexedSample unlabelled;
  unlabelled.key = "b";
  unlabelled.has_label = false;
  index.add_sample(shard, unlabelled, b);
  EXPECT_EQ(shard.samples[0].offset, 1024u) << "the image member's";
  EXPECT_EQ(shard.samples[0].size, 100u);
  const std::string text = detail::write_index(index);
  EXPECT_NE(text.find(R"("version":2)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("members":[["txt",512,3],["jpeg",1024,100]],"offset":1024,"size":100,)"
                      R"("label":1})"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"({"shard":"s.tar","key":"b","members":[["boxes.npy",2048,0]]})"),
            std::string::npos)
      << text;
  const detail::ShardIndex back = detail::parse_index(text, "written");
  EXPECT_EQ(detail::write_index(back), text);
  EXPECT_FALSE(back.shards[0].samples[1].has_label);
  EXPECT_EQ(back.classes, index.classes);
}

TEST(ShardIndexVersions, AMalformedVersion2IndexIsRefusedNamingWhatIsWrong) {
  const std::string many = [] {
    std::string m;
    for (size_t i = 0; i <= detail::kMaxSampleMembers; ++i) {
      m += std::string(i ? "," : "") + "[\"e" + std::to_string(i) + "\", 0, 1]";
    }
    return m;
  }();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"shard": "s.tar", "key": "k", "offset": 512, "size": 9, "label": 3})",
       "sample k without \"members\" (version 2)"},
      {R"({"shard": "s.tar", "key": "k", "members": {"jpg": 1}})",
       "sample k's \"members\" is not an array"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", 512]]})",
       "sample k's member is not [NAME, OFFSET, SIZE]"},
      {R"({"shard": "s.tar", "key": "k", "members": [[7, 512, 3]]})",
       "sample k's member is not [NAME, OFFSET, SIZE]"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", -1, 3]]})",
       "sample k's member jpg's offset is negative"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", 512, 1.5]]})",
       "sample k's member jpg's size is not an integer"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", 4000, 97]]})",
       "sample k's member jpg (bytes 4000 + 97) lies outside shard s.tar (4096 bytes)"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", 18446744073709551615, 1]]})",
       "sample k's member jpg's offset is not an integer in range"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", 0, 1], ["jpg", 2, 1]]})",
       "sample k's member jpg is listed twice"},
      {R"({"shard": "s.tar", "key": "k", "members": [["", 0, 1]]})",
       "sample k's member name '' is not one"},
      {R"({"shard": "s.tar", "key": "k", "members": [["t\u0007xt", 0, 1]]})",
       "sample k's member name 't\\x07xt' is not one"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", 0, 268435457]]})",
       "sample k's member jpg is 268435457 bytes (at most 268435456)"},
      {R"({"shard": "s.tar", "key": "k", "members": [)" + many + "]}",
       "sample k's \"members\" lists 65 members (at most 64)"},
      {R"({"shard": "s.tar", "key": "k", "members": [["jpg", 512, 9]], "offset": 0, "size": 9})",
       "sample k's \"offset\" and \"size\" are not those of its image member"},
  };
  for (const auto& [sample, why] : cases) {
    try {
      detail::parse_index(index_text(sample), "bad.index.json");
      ADD_FAILURE() << "accepted: " << sample;
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("tar_shards: index bad.index.json: " + why), std::string::npos)
          << message;
    }
  }
  // A version this reader does not know.
  EXPECT_THROW(detail::parse_index(index_text("", 3), "v3"), std::runtime_error);
}

}  // namespace
}  // namespace conveyor
