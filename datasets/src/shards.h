// datasets/src/shards.h (build-only): the shards behind ImageSource::tar_shards, where each
// sample's .jpg member lies in them, and the per-worker readers that fetch a member's bytes.
//
// Invariant: every member lies inside its shard as the index describes it (offset + size <= the
// index's size of the shard, checked when the index is read). A shard may since have been cut
// short; the reader then fails only the members past its end.
// Thread safety: a Shards is immutable once built and shared by all workers. Each worker reads
// through its own ShardReader (open_reader()), so the remote case keeps one connection per worker
// without a lock; local readers share the descriptors through pread(), which takes none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/datasets.h"
#include "file_descriptor.h"

namespace conveyor {
namespace detail {

// Where one .jpg member lies.
struct MemberRange {
  uint32_t shard = 0;   // index into Shards::locations
  uint64_t offset = 0;  // of the member's data in the shard
  uint64_t size = 0;    // of the member's data
};

// One worker's way to fetch members. Not thread-safe; one per worker.
class ShardReader {
 public:
  virtual ~ShardReader() = default;
  // Reads `size` bytes at `offset` of shard `shard` into `out` (reusing its capacity). Throws
  // std::runtime_error naming the shard (its path or URL), the byte range and the cause when the
  // read fails, or when the shard ends before the member does. The loader adds the sample.
  virtual void read(uint32_t shard, uint64_t offset, uint64_t size, std::vector<uint8_t>& out) = 0;
  // The members the worker reads next, in order: a remote reader starts their requests.
  virtual void will_read(const std::vector<MemberRange>& members) = 0;
};

using ShardFile = FileDescriptor;  // a local shard's descriptor; -1 for a remote one

// The classes that the index beside the first of `shards` names (as tar_shards finds it: beside
// the shard, or what a pipe: shard's command writes for it); empty when it has none. For
// conveyor-prepare, which reads shards in order through TarSampleReader. Throws as tar_shards
// does for an index that cannot be read or parsed.
std::vector<std::string> shard_classes(const std::vector<ShardLocation>& shards,
                                       const ShardOptions& options);

}  // namespace detail

struct ImageSource::Shards {
  using Member = detail::MemberRange;
  std::vector<std::string> locations;    // per shard: the path (file:// removed) or the URL
  std::vector<detail::ShardFile> files;  // per shard; not open for a remote one
  std::vector<Member> members;           // one per sample
  bool remote = false;                   // some shard is read over HTTP
  ShardOptions options;                  // for the HTTP readers

  // A reader for one worker: pread() on `files` for local shards, and its own HTTP connection
  // (made on its first remote read) for remote ones.
  std::unique_ptr<detail::ShardReader> open_reader() const;
};

}  // namespace conveyor
