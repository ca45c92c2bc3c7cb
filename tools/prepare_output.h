// conveyor-prepare's outputs (tools/prepare.cpp): WebDataset tar shards with their index
// (--format wds), or an ImageFolder (--format folder).
//
// Guarantees: every file is written under a temporary name and renamed into place when complete
// (a file never committed is removed); the index is written last, so an index means a complete
// set of shards. The bytes are a pure function of what is added, in order: the tar headers carry
// no time or owner (shards/tar_writer.h), and the index's format is the reader's own
// (shards/index.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/datasets.h"
#include "shards/index.h"
#include "shards/tar_writer.h"

namespace conveyor::tools {

// A file written under `final_path + ".tmp"` and renamed to `final_path` by commit(); removed if
// never committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t size);
  const std::string& path() const { return final_; }
  void commit();

 private:
  std::string final_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// --format wds: DST-000000.tar, DST-000001.tar, ... of about shard_size bytes, then DST.index.json.
class ShardWriter {
 public:
  // `on_shard(path, samples, bytes)` is told of each shard written.
  ShardWriter(std::string dst, uint64_t shard_size, std::vector<std::string> classes,
              std::function<void(const std::string&, size_t, uint64_t)> on_shard);
  ~ShardWriter();
  // Adds sample KEY: members KEY.jpg (the bytes) and KEY.cls (the label as decimal text). KEY.jpg
  // must be one path segment (detail::check_path_segment): a reader may extract it.
  void add(const std::string& key, const std::vector<uint8_t>& jpeg, int64_t label);
  // One member of a sample: KEY.EXTENSION holding data[0, size).
  struct Member {
    std::string_view extension;
    const uint8_t* data = nullptr;
    size_t size = 0;
  };
  // Adds sample KEY with `members`, in their order (extensions distinct, as the reader gives
  // them); the index gives `label` where has_label. Each member name must be one path segment.
  void add(const std::string& key, const std::vector<Member>& members, int64_t label,
           bool has_label);
  // Closes the last shard and writes the index. Returns the shards' total bytes.
  uint64_t finish();
  size_t shards() const { return index_.shards.size(); }

 private:
  void close_shard();

  std::string dst_;
  uint64_t shard_size_;
  std::function<void(const std::string&, size_t, uint64_t)> on_shard_;
  detail::ShardIndex index_;
  std::unique_ptr<AtomicFile> file_;  // the shard being written
  std::unique_ptr<detail::TarWriter> tar_;
  uint64_t bytes_ = 0;
  std::vector<detail::IndexedMember> indexed_;  // scratch: the members of the sample being added
};

// --format folder: DST/<class>/KEY.jpg. Without class names (shards without an index) a label's
// folder is its number as six digits, made when first needed; finish() adds the empty ones below
// the largest label, so that the sorted names give the labels back. Class names and keys come
// from data: each must be one path segment (detail::path_under), or the constructor (for a class
// name, before anything is created) or add() throws std::invalid_argument naming it; no file is
// written outside DST.
class FolderWriter {
 public:
  FolderWriter(const std::string& dst, std::vector<std::string> classes);
  void add(const std::string& key, const std::vector<uint8_t>& jpeg, int64_t label);
  uint64_t bytes() const { return bytes_; }
  void finish() const;

 private:
  std::filesystem::path dst_;
  std::vector<std::string> classes_;
  int64_t max_label_ = -1;
  uint64_t bytes_ = 0;
};

// Folder names for a file list's labels 0..max: zero-padded to one width, so that the sorted
// names give back the same labels (labels without images get an empty folder).
std::vector<std::string> label_folders(const std::vector<ImageItem>& items);

}  // namespace conveyor::tools
