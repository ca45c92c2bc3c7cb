// datasets/shards/tar_reader.h (build-only): the samples of a WebDataset tar shard, read in
// order through libarchive: for streaming mode (sources/shard_stream.h), for conveyor-prepare's
// shard inputs, and for counting the samples of a local shard without an index.
//
// WebDataset's key rule: a member's key is its path up to the first dot of its last component,
// its extension the rest, compared in lower case ("a/b.c.JPG" -> "a/b", "c.jpg"). A sample is a
// key with a .jpg or .jpeg member (the first, if several) and its .cls label (decimal text);
// other members are skipped, and a key without an image is dropped: SampleRule::kImages, the
// image sources' rule. Under SampleRule::kMembers (issue 31) a sample is a key with any regular
// member, and TarSample::members lists every one of them in tar order, with its bytes and where
// they lie in the shard. A key that repeats an extension keeps the first such member (the later
// ones are skipped). An empty member is a member (an empty caption).
//
// Member bounds under kMembers, checked from the tar header before anything is allocated; a key
// over one is one failed position naming the shard and the key: a member of more than
// kMaxMemberBytes (kMaxImageBytes, the images' bound) or sparse; more than kMaxSampleMembers
// members; a member path longer than kMaxMemberPathBytes; members of more than kMaxSampleBytes
// together. Under kMembers a .cls that is not decimal text is a member like any other (has_label
// false; the field that reads it says why), not a failed position.
//
// Damage that leaves the rest of the shard readable is one failed position, not the end of the
// shard: an image member over kMaxImageBytes, or sparse (its holes are bytes the shard does
// not hold, so its size says nothing of what it costs to read: refused before anything is
// allocated); a label that is not decimal text; and a run of tar headers whose checksum is wrong
// (libarchive then looks for the next valid header, 512 bytes at a time, and the reader goes on
// from there; what lay between is lost, the member there included). count_tar_samples counts each
// of these as one sample, as the reader gives it. What leaves the rest unreadable (a truncated
// shard, a read that fails) throws, naming the shard and the member.
// Names from the shard (members, labels) enter messages through printable()
// (conveyor/internal/printable.h). Thread safety: one thread per reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/storage.h"

namespace conveyor::detail {

// Which keys of a shard are samples (see above).
enum class SampleRule {
  kImages,   // a key with a .jpg or .jpeg member; only the image and its .cls are read
  kMembers,  // a key with any member; every member is read (TarSample::members)
};

// Bounds on a sample's members (SampleRule::kMembers, and the index: shards/index.h).
constexpr uint64_t kMaxMemberBytes = kMaxImageBytes;      // one member's data
constexpr size_t kMaxSampleMembers = 64;                  // members of one key
constexpr size_t kMaxMemberPathBytes = 1024;              // a member's path: key, '.', extension
constexpr uint64_t kMaxSampleBytes = 2 * kMaxImageBytes;  // a key's members together

// WebDataset's key rule: the key is `path` up to the first dot of its last component, the
// extension the rest, in lower case ("a/b.c.JPG" -> "a/b", "c.jpg"; no dot: the extension is
// empty). The one definition, for the reader, count_tar_samples and conveyor-prepare.
void split_member(const std::string& path, std::string& key, std::string& extension);
// The image sources' image member: one of Field::kDefaultImageKeys ("jpg", "jpeg", "png",
// "webp"), the first of them in tar order that a key has; decoded by its content.
bool is_image_extension(std::string_view extension);

// One member of a sample (SampleRule::kMembers).
struct TarMember {
  std::string extension;      // lower case, as the key rule gives it ("jpg", "boxes.npy")
  uint64_t shard_offset = 0;  // where its data starts in the shard
  uint64_t size = 0;          // bytes
  size_t data_begin = 0;      // where its bytes start in TarSample::data
};

// One sample of a tar shard: its image member's bytes and the label beside it; or a failed
// position (`error` set, `bytes` empty, and under kMembers `members` empty).
struct TarSample {
  std::vector<uint8_t> bytes;  // the image member's (kMembers: a copy of it; empty without one)
  int64_t label = 0;
  bool has_label = false;
  // "SHARD (member KEY.jpg)"; under kMembers for a key without an image "SHARD (sample KEY)";
  // or "SHARD (damaged tar header at byte N)".
  std::string name;
  std::string error;  // empty, or why this position cannot be read (the message is name: error)
  // SampleRule::kMembers only (left empty under kImages):
  std::string key;                 // the sample's key, as in the shard (not printable-escaped)
  std::vector<TarMember> members;  // every member, in tar order, the first of each extension
  std::vector<uint8_t> data;       // the members' bytes, one after another
  // The bytes of `m`, one of `members`.
  const uint8_t* bytes_of(const TarMember& m) const { return data.data() + m.data_begin; }
  // The member whose extension is `extension`, or null.
  const TarMember* find(std::string_view extension) const {
    for (const TarMember& m : members) {
      if (m.extension == extension) return &m;
    }
    return nullptr;
  }
};

class TarSampleReader {
 public:
  // Streams `shard` through `reader` (StorageReader::open_stream: a local file, one plain GET, a
  // command's output), with failed attempts resumed (storage/resuming_stream.h). `reader` and
  // `cancel` must outlive this. Throws std::runtime_error naming the shard when it cannot be
  // opened.
  TarSampleReader(const ShardLocation& shard, StorageReader& reader, const RemoteOptions& options,
                  const StreamCancel& cancel, SampleRule rule = SampleRule::kImages);
  ~TarSampleReader();
  TarSampleReader(const TarSampleReader&) = delete;
  TarSampleReader& operator=(const TarSampleReader&) = delete;

  // The next sample into `out` (reusing the capacity of its vectors: no allocation per sample
  // once they have held the largest), or a failed position (out.error,
  // see above); false after the last one, once the shard's source ended well too (a command's
  // exit status). Throws std::runtime_error naming the shard (and the member) on a read error or
  // a shard cut short; StreamCancelled.
  bool next(TarSample& out);

 private:
  // SampleRule::kMembers: the member whose header is current joins `out` (or is skipped, or
  // refused: out.error); `image` is set by the key's first image member.
  void take_member(TarSample& out, const std::string& what, bool& image);

  struct State;
  std::unique_ptr<State> state_;
};

// Samples in the local shard `path`: the keys with a .jpg or .jpeg member (kImages) or with any
// regular member (kMembers), and the runs of damaged headers, counted by walking the tar headers
// (member data skipped, not read): what TarSampleReader with the same rule gives. A shard cut short
// counts what its headers before the cut say, and one more for a header the cut goes through (its
// reader fails there, and the stream, a position short, reports it). Throws naming the shard on a
// read error, or when not even its first header can be read (not a tar).
size_t count_tar_samples(const Storage& storage, StorageReader& reader, const std::string& path,
                         SampleRule rule = SampleRule::kImages);

}  // namespace conveyor::detail
