// datasets/shards/tar_writer.h (build-only): writing a tar shard, for conveyor-prepare: POSIX
// ustar through libarchive, the same library that reads the shards back (tar_reader.h).
//
// Guarantees: the bytes are a pure function of the members added (name, data, in order): every
// header says regular file, mode 0644, owner 0, no user or group name, mtime 0, so the same
// inputs give the same shard on every run. Python's tarfile and the webdataset package read it.
// add() returns where the member's data starts, which the index records; member_bytes() is what a
// member takes in the archive, so that a writer can keep a shard under a size before adding it.
// Thread safety: one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace conveyor::detail {

class TarWriter {
 public:
  // Every byte of the archive goes to `sink`, in order (it throws to stop the writer).
  explicit TarWriter(std::function<void(const void* data, size_t size)> sink);
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  // Adds a regular file `name` holding data[0, size); returns the offset of its data in the
  // archive. Throws std::runtime_error with libarchive's reason (a name ustar cannot hold, a
  // member over 8 GiB) or what the sink threw.
  uint64_t add(const std::string& name, const void* data, size_t size);
  // Writes the end of the archive (two zero blocks); returns the archive's size. No add() after.
  uint64_t finish();
  // Bytes written so far.
  uint64_t written() const { return written_; }

  // What a member of `size` data bytes adds to an archive: its header and its data, padded to
  // whole 512-byte blocks; and what finish() adds.
  static uint64_t member_bytes(uint64_t size);
  static constexpr uint64_t kEndBytes = 1024;

 private:
  struct Archive;
  std::function<void(const void*, size_t)> sink_;
  std::unique_ptr<Archive> archive_;
  uint64_t written_ = 0;
  bool finished_ = false;
};

}  // namespace conveyor::detail
