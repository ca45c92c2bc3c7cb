// datasets/shards/index.h (build-only): the shard index, PREFIX.index.json: the one definition of
// its format, which ImageSource::tar_shards reads and conveyor-prepare writes (tools/prepare.cpp).
//
//   {"format": "conveyor-wds-index", "version": 2, "classes": ["name", ...],
//    "shards": [{"file": "PREFIX-000000.tar", "bytes": N, "samples": N}, ...],
//    "samples": [{"shard": "PREFIX-000000.tar", "key": "00000000",
//                 "members": [["jpg", OFFSET, SIZE], ["txt", OFFSET, SIZE], ...],
//                 "offset": N, "size": N, "label": N}, ...]}
//
// Version 2 (issue 31): "members" lists every member of the sample in tar order, each as its
// extension (lower case, by the key rule of tar_reader.h), the offset of its data in the shard and
// its size. "offset" and "size" repeat those of the image member (the first "jpg", "jpeg", "png" or
// "webp": tar_reader.h's is_image_extension), for
// readers of version 1; written only for a sample that has one, and when given they must agree
// with "members". "label" is the decimal .cls beside it, written only when the sample has one.
// Version 1: no "members"; "offset" and "size" are the .jpg member's, "label" is required; it
// reads as one member "jpg" and the label. "bytes" is the shard's size when the index was written.
// The JSON is read and written by nlohmann/json (Debian's nlohmann-json3-dev); keys the reader does
// not know are skipped, so a later writer may add some. write_index() is a pure function of the
// index: the same index, the same bytes. Invariant of a parsed index: every sample's shard is
// listed, no number is negative, every member's data lies within its shard's "bytes" and is at most
// kMaxMemberBytes, a sample has at most kMaxSampleMembers members, each name once, and names are
// printable (no control bytes, at most kMaxMemberPathBytes).
//
// Limits, for an index from anywhere (a server, a command, a downloaded file), checked before
// the bytes they bound are read or built: an index is at most kMaxIndexBytes (a local file's
// size is checked before any byte is read; a longer one is refused, naming it), and its arrays and
// objects nest at most kMaxIndexDepth deep (a deeper one is refused as it opens: nlohmann's
// values copy and compare recursively, and ~200 KB of "[[[..." would overflow the stack). Parsing
// holds the text and the samples once (about 2.5 times the text at most), not a JSON document of
// the samples.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/storage.h"
#include "shards/tar_reader.h"

namespace conveyor::detail {

// The largest index read: 1 GiB, about ten million samples (ImageNet's 1.28 million take 120 MB).
constexpr size_t kMaxIndexBytes = size_t{1} << 30;
// The deepest nesting of arrays and objects in an index (the format's own is 3).
constexpr size_t kMaxIndexDepth = 64;

// One member of a sample: its name (an id into ShardIndex::member_names) and its data's place in
// the shard.
struct IndexedMember {
  uint32_t name = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct IndexedSample {
  std::string key;
  uint64_t offset = 0;  // the image member's data (is_image_extension); 0 and 0 without one
  uint64_t size = 0;
  int64_t label = 0;  // the .cls label when has_label, else 0
  bool has_label = true;
  // Its members: IndexedShard::members[members_begin, members_begin + members_count).
  size_t members_begin = 0;
  uint32_t members_count = 0;
};

struct IndexedShard {
  std::string file;    // its file name
  uint64_t bytes = 0;  // as written
  std::vector<IndexedSample> samples;
  std::vector<IndexedMember> members;  // the samples' members, sample after sample
  // The members of `sample`, one of `samples`.
  std::span<const IndexedMember> members_of(const IndexedSample& sample) const {
    return {members.data() + sample.members_begin, sample.members_count};
  }
};

struct ShardIndex {
  std::vector<std::string> classes;
  std::vector<IndexedShard> shards;       // in the index's order; samples in their shard's order
  std::map<std::string, size_t> by_file;  // file -> its place in `shards` (parse_index fills it)
  std::vector<std::string> member_names;  // every member name of the index, once (IndexedMember)
  std::map<std::string, uint32_t, std::less<>> member_ids;  // name -> its place in member_names
  // The shard named `file`, or null when the index does not list it.
  const IndexedShard* find(const std::string& file) const;
  // The id of member name `name`, or kNoMember when no sample has such a member.
  static constexpr uint32_t kNoMember = UINT32_MAX;
  uint32_t member_id(std::string_view name) const;
  // The id of `name`, added to member_names if new.
  uint32_t name_member(std::string_view name);
  // Adds `sample` to `shard` (one of `shards`) with `members` (ids from name_member), and sets
  // the sample's offset and size from its image member (the first is_image_extension; 0 and 0
  // without one): how a writer builds an index (conveyor-prepare). No bound is checked here:
  // parse_index checks what it reads.
  void add_sample(IndexedShard& shard, IndexedSample sample,
                  std::span<const IndexedMember> members);
};

// Parses the text of an index. Throws std::runtime_error "tar_shards: index WHERE: WHAT" for
// text that is not JSON, or not an index of version 1 or 2 (a missing field, a wrong type, a
// negative number, samples in a shard it does not list, "samples" given twice, a member outside its
// shard or over the bounds above, a name given twice in a sample), or nested deeper than
// kMaxIndexDepth. Names from the text are in the message through printable().
ShardIndex parse_index(const std::string& text, const std::string& where);

// The text of `index`: one line of JSON of version 2, the keys in the order shown above.
std::string write_index(const ShardIndex& index);

// The index at `where` (a path, URL or pipe: command: index_location_for, or the user's
// ShardOptions::index), read through `reader`. False when there is none there (no file, HTTP
// 404); with `lenient` (the index beside pipe: shards) also when the command fails or writes no
// index, with `why` set. Throws naming `shard` when it cannot be read, and as parse_index when it
// is not an index.
bool load_index(StorageReader& reader, const ShardLocation& where, const std::string& shard,
                bool lenient, ShardIndex& index, std::string& why);

// The classes that the index of the first of `shards` names (beside it, as tar_shards finds it,
// or options.index); empty when it has none. For conveyor-prepare, which reads shards in order.
// Throws as load_index does.
std::vector<std::string> shard_classes(const std::vector<ShardLocation>& shards,
                                       const ShardOptions& options);

}  // namespace conveyor::detail
