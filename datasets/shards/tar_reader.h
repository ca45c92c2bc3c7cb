// datasets/shards/tar_reader.h (build-only): the samples of a WebDataset tar shard, read in
// order through libarchive: for streaming mode (sources/shard_stream.h), for conveyor-prepare's
// shard inputs, and for counting the samples of a local shard without an index.
//
// WebDataset's key rule: a member's key is its path up to the first dot of its last component,
// its extension the rest, compared in lower case ("a/b.c.JPG" -> "a/b", "c.jpg"). A sample is a
// key with a .jpg or .jpeg member (the first, if several) and its .cls label (decimal text);
// other members are skipped, and a key without an image is dropped.
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
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/storage.h"

namespace conveyor::detail {

// One sample of a tar shard: its image member's bytes and the label beside it; or a failed
// position (`error` set, `bytes` empty).
struct TarSample {
  std::vector<uint8_t> bytes;
  int64_t label = 0;
  bool has_label = false;
  std::string name;   // "SHARD (member KEY.jpg)", or "SHARD (damaged tar header at byte N)"
  std::string error;  // empty, or why this position cannot be read (the message is name: error)
};

class TarSampleReader {
 public:
  // Streams `shard` through `reader` (StorageReader::open_stream: a local file, one plain GET, a
  // command's output), with failed attempts resumed (storage/resuming_stream.h). `reader` and
  // `cancel` must outlive this. Throws std::runtime_error naming the shard when it cannot be
  // opened.
  TarSampleReader(const ShardLocation& shard, StorageReader& reader, const RemoteOptions& options,
                  const StreamCancel& cancel);
  ~TarSampleReader();
  TarSampleReader(const TarSampleReader&) = delete;
  TarSampleReader& operator=(const TarSampleReader&) = delete;

  // The next sample into `out` (reusing out.bytes' capacity), or a failed position (out.error,
  // see above); false after the last one, once the shard's source ended well too (a command's
  // exit status). Throws std::runtime_error naming the shard (and the member) on a read error or
  // a shard cut short; StreamCancelled.
  bool next(TarSample& out);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Samples in the local shard `path`: the keys with a .jpg or .jpeg member, and the runs of damaged
// headers, counted by walking the tar headers (member data skipped, not read): what
// TarSampleReader gives. A shard cut short counts what its headers before the cut say, and one
// more for a header the cut goes through (its reader fails there, and the stream, a position
// short, reports it). Throws naming the shard on a read error, or when not even its first header
// can be read (not a tar).
size_t count_tar_samples(const Storage& storage, StorageReader& reader, const std::string& path);

}  // namespace conveyor::detail
