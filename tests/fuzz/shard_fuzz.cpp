// conveyor-shard-fuzz: libFuzzer over what tar_shards parses from disk or a server (issue 13).
//
// The first byte of an input, modulo 3, chooses what the rest is:
//   0: an index (PREFIX.index.json, version 1 or 2) for a fixed, valid shard of two samples.
//      When ImageSource::tar_shards accepts it (random-access mode), every sample is written
//      once, so that the offsets and sizes the index claims are exercised by the reads; and
//      detail::parse_index's invariants are checked on what it accepts (every member within its
//      shard and the bounds, issue 31).
//   1: a tar shard without an index: the header-counting pass and the streaming reader
//      (libarchive, the key/extension rule, the .cls labels) run over it, and every position
//      of the stream is written once; then the reader under the member rule (issue 31) reads
//      every position, whose members must lie within its bytes and bounds.
//   2: a command-line argument naming shards: the shard-name parser (split_shard_patterns,
//      expand_shard_locations, names_tar_shards) and the index-name derivation (file_name_of,
//      index_location_for), whose result must be a location of the same kind.
// std::exception from construction or from a sample is an expected outcome (a clear error); a
// crash, a sanitizer report, a broken invariant (abort), a leak, a hang or an out-of-memory is a
// finding.
//
// `conveyor-shard-fuzz --write-seeds DIR` writes the seed corpus and exits: the fixture's index
// and shard, shard names, and the hostile inputs of issue 29 (an index nested 100,000 deep, a
// shard of GNU sparse members claiming 255 MiB each, a header with a wrong checksum), which need
// the max_len of conveyor-shard-fuzz.options. tests/fuzz_test.sh also passes
// conveyor-shard-fuzz.dict and fuzzes corpus/shard/, the inputs long runs found.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "conveyor/storage.h"
#include "shards/index.h"
#include "shards/names.h"
#include "shards/tar_reader.h"

namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxSamples = 64;  // samples written per input at most

// Appends a member: ustar, or with `expanded` a GNU sparse one (type 'S') whose `data` is its
// first bytes and the rest, up to `expanded`, a hole.
void append_tar_member(std::vector<uint8_t>& tar, const std::string& name,
                       const std::vector<uint8_t>& data, uint64_t expanded = 0) {
  std::vector<uint8_t> header(512, 0);
  std::memcpy(header.data(), name.data(), std::min<size_t>(name.size(), 99));
  std::snprintf(reinterpret_cast<char*>(&header[100]), 8, "%07o", 0644);
  std::snprintf(reinterpret_cast<char*>(&header[108]), 8, "%07o", 0);
  std::snprintf(reinterpret_cast<char*>(&header[116]), 8, "%07o", 0);
  std::snprintf(reinterpret_cast<char*>(&header[124]), 12, "%011llo",
                static_cast<unsigned long long>(data.size()));
  std::snprintf(reinterpret_cast<char*>(&header[136]), 12, "%011o", 0);
  header[156] = '0';
  std::memcpy(&header[257], "ustar", 6);
  header[263] = '0';
  header[264] = '0';
  if (expanded != 0) {
    header[156] = 'S';
    std::memcpy(&header[257], "ustar  ", 8);
    const auto octal12 = [&](size_t at, uint64_t value) {
      std::snprintf(reinterpret_cast<char*>(&header[at]), 12, "%011llo",
                    static_cast<unsigned long long>(value));
    };
    octal12(386, 0);            // sparse[0]: the data, at offset 0 ...
    octal12(398, data.size());  // ... of data.size() bytes
    octal12(410, expanded);     // sparse[1]: the end
    octal12(422, 0);
    octal12(483, expanded);  // the expanded size
  }
  std::memset(&header[148], ' ', 8);
  unsigned sum = 0;
  for (uint8_t b : header) sum += b;
  std::snprintf(reinterpret_cast<char*>(&header[148]), 8, "%06o", sum);
  header[155] = ' ';
  tar.insert(tar.end(), header.begin(), header.end());
  tar.insert(tar.end(), data.begin(), data.end());
  tar.resize((tar.size() + 511) / 512 * 512, 0);
}

std::vector<uint8_t> small_jpeg(int seed) {
  std::vector<uint8_t> rgb(16 * 12 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7 + seed * 31);
  return conveyor::encode_jpeg(rgb.data(), 16, 12, 80);
}

// A valid shard of two samples, and the index conveyor-prepare would write for it.
struct Fixture {
  std::vector<uint8_t> tar;
  std::string index;     // version 1
  std::string index_v2;  // version 2: every member
  Fixture() {
    std::string samples, samples_v2;
    for (int i = 0; i < 2; ++i) {
      const std::string key = "0000000" + std::to_string(i);
      const uint64_t offset = tar.size() + 512;
      const std::vector<uint8_t> jpeg = small_jpeg(i);
      append_tar_member(tar, key + ".jpg", jpeg);
      const uint64_t cls_offset = tar.size() + 512;
      append_tar_member(tar, key + ".cls", {static_cast<uint8_t>('0' + i)});
      samples += std::string(i ? ",\n" : "") + "{\"shard\": \"f-000000.tar\", \"key\": \"" + key +
                 "\", \"offset\": " + std::to_string(offset) +
                 ", \"size\": " + std::to_string(jpeg.size()) +
                 ", \"label\": " + std::to_string(i) + "}";
      samples_v2 += std::string(i ? ",\n" : "") + "{\"shard\": \"f-000000.tar\", \"key\": \"" +
                    key + "\", \"members\": [[\"jpg\", " + std::to_string(offset) + ", " +
                    std::to_string(jpeg.size()) + "], [\"cls\", " + std::to_string(cls_offset) +
                    ", 1]], \"label\": " + std::to_string(i) + "}";
    }
    tar.resize(tar.size() + 1024, 0);
    const std::string head =
        "\"classes\": [\"a\", \"b\"],\n\"shards\": [{\"file\": \"f-000000.tar\", \"bytes\": " +
        std::to_string(tar.size()) + ", \"samples\": 2}],\n\"samples\": [\n";
    index = "{\"format\": \"conveyor-wds-index\", \"version\": 1, " + head + samples + "\n]}\n";
    index_v2 =
        "{\"format\": \"conveyor-wds-index\", \"version\": 2, " + head + samples_v2 + "\n]}\n";
  }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

// A folder of this process's own, removed at exit.
struct Scratch {
  fs::path dir;
  Scratch() {
    char name[] = "/tmp/conveyor-shard-fuzz-XXXXXX";
    if (::mkdtemp(name) == nullptr) std::abort();
    dir = name;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

const fs::path& scratch() {
  static const Scratch s;
  return s.dir;
}

void write(const fs::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

void write_every_sample(conveyor::ImageSource& source) {
  source.prepare(1);
  const auto fields = source.fields();
  std::vector<std::byte> image(fields[0].sample_bytes());
  int64_t label = 0;
  std::byte* rows[2] = {image.data(), reinterpret_cast<std::byte*>(&label)};
  const size_t n = std::min(source.size(), kMaxSamples);
  for (size_t i = 0; i < n; ++i) {
    try {
      source.write_sample({0, i, 1, 0}, rows);
    } catch (const std::exception&) {
    }
    (void)source.describe(i);
  }
}

conveyor::ImageTransform small() {
  conveyor::ImageTransform t = conveyor::ImageTransform::eval(8, 10);
  t.limits.max_pixels = 1 << 20;
  return t;
}

void check(bool condition, const char* what, const std::string& input) {
  if (condition) return;
  std::fprintf(stderr, "shard names: %s for input '%s'\n", what, input.c_str());
  std::abort();
}

// Mode 2: the shard names of one command-line argument.
void parse_names(const std::string& text) {
  (void)conveyor::names_tar_shards(text);
  std::vector<std::string> patterns;
  try {
    patterns = conveyor::split_shard_patterns(text);
  } catch (const std::exception&) {
    return;
  }
  for (const std::string& p : patterns) check(!p.empty(), "an empty pattern", text);
  std::vector<conveyor::ShardLocation> shards;
  try {
    shards = conveyor::expand_shard_locations(patterns);
  } catch (const std::invalid_argument&) {
    return;
  }
  // A brace range may name up to a million shards: their index names are checked on the first
  // and last 256 (every name of a range has the same form), so that one input stays within
  // libFuzzer's per-input timeout under ASan.
  constexpr size_t kChecked = 256;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (i == kChecked && shards.size() > 2 * kChecked) i = shards.size() - kChecked;
    const conveyor::ShardLocation& shard = shards[i];
    (void)conveyor::detail::file_name_of(shard);
    if (!conveyor::detail::has_index_name(shard)) continue;
    const conveyor::ShardLocation index = conveyor::detail::index_location_for(shard);
    check(index.kind == shard.kind, "an index location of another kind", text);
    check(index.location.find(".index.json") != std::string::npos,
          "an index location without .index.json", text);
  }
}

// Mode 0: what parse_index accepts keeps its invariants (index.h).
void check_index(const std::string& text) {
  conveyor::detail::ShardIndex index;
  try {
    index = conveyor::detail::parse_index(text, "fuzzed");
  } catch (const std::exception&) {
    return;
  }
  for (const auto& shard : index.shards) {
    for (const auto& sample : shard.samples) {
      check(sample.members_begin <= shard.members.size() &&
                sample.members_count <= shard.members.size() - sample.members_begin,
            "a sample's members outside its shard's list", "index");
      check(sample.members_count <= conveyor::detail::kMaxSampleMembers, "too many members",
            "index");
      for (const auto& m : shard.members_of(sample)) {
        check(m.name < index.member_names.size(), "a member name id out of range", "index");
        check(m.offset <= shard.bytes && m.size <= shard.bytes - m.offset,
              "a member outside its shard", "index");
        check(m.size <= conveyor::detail::kMaxMemberBytes, "a member over the bound", "index");
      }
    }
  }
}

// Mode 1: the reader under the member rule: each position's members lie within its bytes.
void read_members(const fs::path& shard) {
  const std::unique_ptr<conveyor::StorageReader> reader =
      conveyor::system_storage()->reader(conveyor::RemoteOptions());
  const conveyor::StreamCancel never;
  try {
    conveyor::detail::TarSampleReader samples({conveyor::ShardLocation::Kind::kLocal, shard},
                                              *reader, conveyor::RemoteOptions(), never,
                                              conveyor::detail::SampleRule::kMembers);
    conveyor::detail::TarSample s;
    for (size_t n = 0; n < 4 * kMaxSamples && samples.next(s); ++n) {
      check(s.error.empty() || s.members.empty(), "a failed position with members", "tar");
      check(s.members.size() <= conveyor::detail::kMaxSampleMembers, "too many members", "tar");
      uint64_t total = 0;
      for (const auto& m : s.members) {
        check(m.data_begin == total && m.size <= conveyor::detail::kMaxMemberBytes,
              "a member outside the sample's bytes", "tar");
        total += m.size;
      }
      check(total == s.data.size(), "members that do not tile the sample's bytes", "tar");
    }
    (void)conveyor::detail::count_tar_samples(*conveyor::system_storage(), *reader, shard,
                                              conveyor::detail::SampleRule::kMembers);
  } catch (const std::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] % 3 == 2) {
    parse_names(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
    return 0;
  }
  const fs::path& dir = scratch();
  const bool streamed = data[0] % 3 == 1;
  fs::remove(dir / "f.index.json");
  try {
    conveyor::ShardOptions options;
    options.shuffle_buffer = 4;
    options.stream_window = 8;
    options.stream_lookahead = 4;
    if (streamed) {
      write(dir / "f-000000.tar", data + 1, size - 1);
    } else {
      const Fixture& f = fixture();
      write(dir / "f-000000.tar", f.tar.data(), f.tar.size());
      write(dir / "f.index.json", data + 1, size - 1);
    }
    auto source =
        conveyor::ImageSource::tar_shards({(dir / "f-000000.tar").string()}, small(), options);
    write_every_sample(*source);
  } catch (const std::exception&) {
  }
  if (streamed) {
    read_members(dir / "f-000000.tar");
  } else {
    check_index(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  }
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i + 1 < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--write-seeds") == 0) {
      const fs::path out = (*argv)[i + 1];
      fs::create_directories(out);
      const Fixture& f = fixture();
      std::vector<uint8_t> index(1, 0);
      index.insert(index.end(), f.index.begin(), f.index.end());
      write(out / "index", index.data(), index.size());
      std::vector<uint8_t> index_v2(1, 0);
      index_v2.insert(index_v2.end(), f.index_v2.begin(), f.index_v2.end());
      write(out / "index-v2", index_v2.data(), index_v2.size());
      std::vector<uint8_t> tar(1, 1);
      tar.insert(tar.end(), f.tar.begin(), f.tar.end());
      write(out / "tar", tar.data(), tar.size());
      // Issue 29's hostile inputs.
      std::string deep = "\x00{\"format\": \"conveyor-wds-index\", \"version\": 1, \"x\": ";
      deep += std::string(100000, '[') + std::string(100000, ']') + "}";
      write(out / "index-deep", reinterpret_cast<const uint8_t*>(deep.data()), deep.size());
      std::vector<uint8_t> sparse(1, 1);
      for (int i = 0; i < 8; ++i) {
        const std::string key = "0000000" + std::to_string(i);
        append_tar_member(sparse, key + ".jpg", std::vector<uint8_t>(512, 0xab),
                          uint64_t{255} << 20);
        append_tar_member(sparse, key + ".cls", {'1'});
      }
      sparse.resize(sparse.size() + 1024, 0);
      write(out / "tar-sparse", sparse.data(), sparse.size());
      // The second sample's .jpg header with a wrong checksum (its name's first byte changed).
      std::vector<uint8_t> damaged = tar;
      const std::string second = "00000001.jpg";
      const auto at = std::search(damaged.begin(), damaged.end(), second.begin(), second.end());
      if (at != damaged.end()) *at ^= 0x20;
      write(out / "tar-damaged", damaged.data(), damaged.size());
      const char* names[] = {
          "/data/train-{000000..000012}.tar,{a,b}-{0..3}.tar",
          "http://host:8080/shards/train-{000..009}.tar?X-Amz-Signature=abc#frag",
          "\"pipe:curl -s -H 'a, b' https://h/t-{000000..000002}.tar\",file:///d/x%20y-000001.tar",
          "pipe:aws s3 cp s3://bucket/train-{000000..000146}.tar - | cat;",
          "s3://bucket/x.tar,gs://b/y-1.tar,ftp://z,file://relative"};
      for (size_t i = 0; i < std::size(names); ++i) {
        std::string seed(1, '\x02');
        seed += names[i];
        write(out / ("names" + std::to_string(i)), reinterpret_cast<const uint8_t*>(seed.data()),
              seed.size());
      }
      std::exit(0);
    }
  }
  return 0;
}
