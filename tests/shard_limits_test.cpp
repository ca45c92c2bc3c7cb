// Hostile shards and indexes (issue 29): every parser of tar_shards' untrusted bytes has limits
// set before anything is allocated, and damage is a clear, counted error, never a crash, an
// unbounded allocation, a lost shard or a faked log line. The shards are built here byte by byte
// (TarBuilder), so that each test damages exactly what it means to:
//   - an index nested 100,000 deep, and one over the size cap (a sparse file of 1 GiB + 1);
//   - GNU sparse .jpg members claiming 250 MiB each in a shard of a few kB;
//   - a tar header with a wrong checksum, and shards cut inside a header and inside a member;
//   - member names and labels with newlines and terminal escapes (printable(), whose own rules
//     printable_test checks).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/internal/printable.h"
#include "conveyor/loader.h"
#include "shards/index.h"
#include "shards/tar_reader.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// A tar archive written header by header.
class TarBuilder {
 public:
  // A regular member (ustar); returns the offset of its header.
  size_t add(const std::string& name, const std::vector<uint8_t>& data) {
    const size_t at = header(name, data.size(), '0', false, 0, 0);
    append(data);
    return at;
  }
  size_t add(const std::string& name, const std::string& text) {
    return add(name, std::vector<uint8_t>(text.begin(), text.end()));
  }
  // A GNU sparse member (old GNU format, as `tar --sparse` writes it): `stored` bytes of data at
  // its start, then a hole up to `expanded` bytes.
  size_t add_sparse(const std::string& name, uint64_t expanded, uint64_t stored) {
    const size_t at = header(name, stored, 'S', true, expanded, stored);
    append(std::vector<uint8_t>(stored, 0xab));
    return at;
  }
  // The end of the archive: two zero blocks.
  std::vector<uint8_t> finish() {
    bytes_.resize(bytes_.size() + 1024, 0);
    return bytes_;
  }

 private:
  static void octal(uint8_t* field, size_t width, uint64_t value) {
    std::snprintf(reinterpret_cast<char*>(field), width, "%0*llo", static_cast<int>(width - 1),
                  static_cast<unsigned long long>(value));
  }
  size_t header(const std::string& name, uint64_t size, char type, bool gnu, uint64_t expanded,
                uint64_t stored) {
    std::vector<uint8_t> h(512, 0);
    std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
    octal(&h[100], 8, 0644);
    octal(&h[108], 8, 0);
    octal(&h[116], 8, 0);
    octal(&h[124], 12, size);
    octal(&h[136], 12, 0);
    h[156] = static_cast<uint8_t>(type);
    if (gnu) {
      std::memcpy(&h[257], "ustar  ", 8);  // GNU's magic and version
      octal(&h[386], 12, 0);               // sparse[0]: the data at offset 0 ...
      octal(&h[398], 12, stored);          // ... of `stored` bytes
      octal(&h[410], 12, expanded);        // sparse[1]: the end, no data
      octal(&h[422], 12, 0);
      octal(&h[483], 12, expanded);  // realsize
    } else {
      std::memcpy(&h[257], "ustar", 6);
      h[263] = '0';
      h[264] = '0';
    }
    std::memset(&h[148], ' ', 8);
    unsigned sum = 0;
    for (uint8_t b : h) sum += b;
    std::snprintf(reinterpret_cast<char*>(&h[148]), 8, "%06o", sum);
    h[155] = ' ';
    const size_t at = bytes_.size();
    bytes_.insert(bytes_.end(), h.begin(), h.end());
    return at;
  }
  void append(const std::vector<uint8_t>& data) {
    bytes_.insert(bytes_.end(), data.begin(), data.end());
    bytes_.resize((bytes_.size() + 511) / 512 * 512, 0);
  }
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> jpeg_of(int i) {
  return make_photo_jpeg(40, 30, static_cast<uint64_t>(i + 1));
}

std::string key_of(int i) {
  char key[16];
  std::snprintf(key, sizeof key, "%08d", i);
  return key;
}

// Sample i: KEY.jpg (a photo-like JPEG) and KEY.cls (label i). Returns the offset of its .jpg
// member's header.
size_t add_sample(TarBuilder& tar, int i) {
  const size_t at = tar.add(key_of(i) + ".jpg", jpeg_of(i));
  tar.add(key_of(i) + ".cls", std::to_string(i));
  return at;
}

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  testing::write_bytes(path, bytes);
}

ShardOptions streamed() {
  ShardOptions o;
  o.streaming = true;
  o.shuffle_buffer = 1;  // the shard's own order
  return o;
}

std::shared_ptr<ImageSource> source_of(const fs::path& shard, const ShardOptions& o = streamed()) {
  return std::shared_ptr<ImageSource>(
      ImageSource::tar_shards({shard.string()}, ImageTransform::eval(24, 28), o));
}

// What one epoch under kSkip delivers: the distinct labels and the loader's count of skips.
struct SkipRun {
  std::set<int64_t> labels;
  uint64_t skipped = 0;
  std::vector<std::string> reasons;  // of the skipped samples
};

SkipRun read_skipping(std::shared_ptr<ImageSource> source) {
  LoaderOptions options;
  options.batch_size = 2;
  options.workers = 2;
  options.on_error = ErrorPolicy::kSkip;
  DataLoader loader(std::move(source), options);
  SkipRun run;
  for (Batch& batch : loader) {
    const at::Tensor labels = batch.labels().contiguous();
    for (int64_t i = 0; i < labels.size(0); ++i) run.labels.insert(labels[i].item<int64_t>());
  }
  run.skipped = loader.stats().skipped;
  for (const SkippedSample& s : loader.stats().skipped_samples) run.reasons.push_back(s.message);
  return run;
}

// The message of the first error one epoch under kRaise gives ("" when there is none).
std::string first_error(std::shared_ptr<ImageSource> source) {
  LoaderOptions options;
  options.batch_size = 2;
  options.workers = 1;
  DataLoader loader(std::move(source), options);
  try {
    for (Batch& batch : loader) (void)batch;
  } catch (const SampleError& e) {
    return e.what();
  }
  return "";
}

size_t peak_resident_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<size_t>(usage.ru_maxrss) / 1024;
}

// --- The index: nesting depth and size.

// A valid shard of two samples at dir/f-000000.tar, for indexes to describe.
fs::path two_sample_shard(const TempDir& dir) {
  TarBuilder tar;
  add_sample(tar, 0);
  add_sample(tar, 1);
  const fs::path shard = dir / "f-000000.tar";
  write_file(shard, tar.finish());
  return shard;
}

// About 200 KB of "[[[...": nlohmann's values copy and compare recursively, and such a document
// overflowed the stack (SIGSEGV, in Python too). Now the parse stops at the 65th level, naming the
// index; the same for nesting inside a valid index's unknown keys.
TEST(ShardIndexLimits, ADeeplyNestedIndexIsAClearErrorNotACrash) {
  TempDir dir;
  const fs::path shard = two_sample_shard(dir);
  const fs::path index = dir / "f.index.json";
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& text :
       {deep, "{\"format\": \"conveyor-wds-index\", \"version\": 1, \"extra\": " + deep + "}",
        "{\"samples\": [{\"key\": " + deep + "}]}"}) {
    write_file(index, std::vector<uint8_t>(text.begin(), text.end()));
    try {
      source_of(shard, ShardOptions());
      ADD_FAILURE() << "accepted";
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(index.string()), std::string::npos) << message;
      EXPECT_NE(message.find("nested more than 64 deep"), std::string::npos) << message;
    }
  }
  // The format's own depth, and an unknown key nested a little, still read.
  const detail::ShardIndex parsed = detail::parse_index(
      "{\"format\": \"conveyor-wds-index\", \"version\": 1, \"later\": [[[{\"a\": [1]}]]], "
      "\"samples\": [{\"shard\": \"s.tar\", \"key\": \"k\", \"offset\": 512, \"size\": 9, "
      "\"label\": 3}], \"shards\": [{\"file\": \"s.tar\", \"bytes\": 2048}]}",
      "inline");
  ASSERT_EQ(parsed.shards.size(), 1u);
  ASSERT_EQ(parsed.shards[0].samples.size(), 1u) << "samples before \"shards\" are kept";
  EXPECT_EQ(parsed.shards[0].samples[0].key, "k");
  EXPECT_EQ(parsed.shards[0].samples[0].label, 3);
}

// An index one byte over kMaxIndexBytes (a sparse file: no disk, no time) is refused before it is
// read: the error names it and its size, and the process's peak memory does not grow by the
// gigabyte the old reader allocated and filled first.
TEST(ShardIndexLimits, AnIndexOverTheSizeCapIsRefusedBeforeItIsRead) {
  TempDir dir;
  const fs::path shard = two_sample_shard(dir);
  const fs::path index = dir / "f.index.json";
  {
    std::ofstream out(index, std::ios::binary);
    out << "{\"format\": \"conveyor-wds-index\"";
  }
  fs::resize_file(index, detail::kMaxIndexBytes + 1);
  const size_t peak_before = peak_resident_mb();
  try {
    source_of(shard, ShardOptions());
    ADD_FAILURE() << "accepted";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(index.string()), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(detail::kMaxIndexBytes + 1) + " bytes"),
              std::string::npos)
        << message;
  }
  EXPECT_LT(peak_resident_mb(), peak_before + 256) << "the index was read before it was refused";
}

// --- Tar members.

// GNU sparse .jpg members claiming 250 MiB each (512 bytes stored): each is refused, naming the
// shard and member, before anything is allocated; under kSkip each is one counted skip and the
// samples around them arrive. The old reader expanded each into a 250 MiB buffer (a few of them
// took gigabytes).
TEST(TarShardLimits, SparseMembersAreRefusedBeforeAnythingIsAllocated) {
  TempDir dir;
  TarBuilder tar;
  add_sample(tar, 0);
  constexpr int kSparse = 4;
  for (int i = 1; i <= kSparse; ++i) {
    tar.add_sparse(key_of(i) + ".jpg", uint64_t{250} << 20, 512);
    tar.add(key_of(i) + ".cls", std::to_string(i));
  }
  add_sample(tar, kSparse + 1);
  const fs::path shard = dir / "sparse.tar";
  write_file(shard, tar.finish());
  ASSERT_LT(fs::file_size(shard), 64u * 1024);

  const size_t peak_before = peak_resident_mb();
  const SkipRun run = read_skipping(source_of(shard));
  EXPECT_EQ(run.labels, (std::set<int64_t>{0, kSparse + 1}));
  EXPECT_EQ(run.skipped, static_cast<uint64_t>(kSparse));
  EXPECT_LT(peak_resident_mb(), peak_before + 200) << "sparse members were expanded";
  ASSERT_FALSE(run.reasons.empty());
  EXPECT_NE(run.reasons[0].find("sparse member of 262144000 bytes of which the shard holds 512"),
            std::string::npos)
      << run.reasons[0];

  const std::string error = first_error(source_of(shard));
  EXPECT_NE(error.find(shard.string() + " (member 00000001.jpg)"), std::string::npos) << error;
  EXPECT_NE(error.find("sparse"), std::string::npos) << error;
}

// A header whose checksum is wrong: the old reader stopped with "INTERNAL ERROR ... state
// 'header'" and lost the rest of the shard (without an index, tar_shards itself failed). Now the
// damaged header is one failed position naming the shard and its offset, libarchive finds the
// next valid header, and every other sample arrives, with and without an index's count.
TEST(TarShardLimits, ADamagedHeaderIsOneCountedSkipAndTheRestOfTheShardIsRead) {
  TempDir dir;
  TarBuilder tar;
  size_t damaged = 0;
  for (int i = 0; i < 6; ++i) {
    const size_t at = add_sample(tar, i);
    if (i == 2) damaged = at;
  }
  std::vector<uint8_t> bytes = tar.finish();
  bytes[damaged] ^= 0x20;  // the name's first byte: the checksum no longer matches
  const fs::path shard = dir / "damaged.tar";
  write_file(shard, bytes);

  const SkipRun run = read_skipping(source_of(shard));
  EXPECT_EQ(run.labels, (std::set<int64_t>{0, 1, 3, 4, 5}));
  EXPECT_EQ(run.skipped, 1u);

  const std::string error = first_error(source_of(shard));
  EXPECT_NE(error.find(shard.string() + " (damaged tar header at byte " + std::to_string(damaged)),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("checksum"), std::string::npos) << error;
  EXPECT_EQ(error.find("INTERNAL ERROR"), std::string::npos) << error;
}

// A local shard without an index cut inside a header (the counting pass used to throw
// "Truncated tar archive", so tar_shards failed under every policy) or inside a member's data:
// under kSkip the samples before the cut arrive and the loss is one counted skip; under kRaise
// the error names the shard.
TEST(TarShardLimits, ATruncatedShardWithoutAnIndexIsACountedSkip) {
  TempDir dir;
  TarBuilder tar;
  std::vector<size_t> headers;
  for (int i = 0; i < 5; ++i) headers.push_back(add_sample(tar, i));
  const std::vector<uint8_t> whole = tar.finish();
  struct Cut {
    const char* what;
    size_t at;
  };
  for (const Cut& cut : {Cut{"inside a header", headers[3] + 100},
                         Cut{"inside a member's data", headers[3] + 512 + jpeg_of(3).size() / 2}}) {
    SCOPED_TRACE(cut.what);
    const fs::path shard = dir / "cut.tar";
    write_file(shard, std::vector<uint8_t>(whole.begin(), whole.begin() + cut.at));
    const SkipRun run = read_skipping(source_of(shard));
    EXPECT_EQ(run.labels, (std::set<int64_t>{0, 1, 2}));
    EXPECT_EQ(run.skipped, 1u);
    const std::string error = first_error(source_of(shard));
    EXPECT_NE(error.find(shard.string()), std::string::npos) << error;
    EXPECT_NE(error.find("runcated"), std::string::npos) << error;
  }
}

// A member named "a\nERROR fake.jpg" whose bytes are not a JPEG, and a label with a terminal
// escape: their errors are one line each, with the escapes visible; no line can be faked.
TEST(TarShardLimits, NamesFromTheShardAreEscapedInMessages) {
  TempDir dir;
  TarBuilder tar;
  tar.add("a\nERROR fake.jpg", std::string(100, 'x'));
  tar.add("a\nERROR fake.cls", "1");
  add_sample(tar, 2);
  tar.add(key_of(3) + ".jpg", jpeg_of(3));
  tar.add(key_of(3) + ".cls", "3\x1b[2K");
  const fs::path shard = dir / "names.tar";
  write_file(shard, tar.finish());

  const std::string error = first_error(source_of(shard));
  EXPECT_NE(error.find("(member a\\nERROR fake.jpg)"), std::string::npos) << error;
  EXPECT_EQ(error.find("\nERROR fake"), std::string::npos) << error;

  const SkipRun run = read_skipping(source_of(shard));
  EXPECT_EQ(run.labels, (std::set<int64_t>{2}));
  EXPECT_EQ(run.skipped, 2u);
  bool label_named = false;
  for (const std::string& reason : run.reasons) {
    EXPECT_EQ(reason.find('\n'), std::string::npos) << reason;
    EXPECT_EQ(reason.find('\x1b'), std::string::npos) << reason;
    label_named = label_named || reason.find("'3\\x1b[2K'") != std::string::npos;
  }
  EXPECT_TRUE(label_named);
}

}  // namespace
}  // namespace conveyor
