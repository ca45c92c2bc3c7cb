// datasets/sources/image_kind.h (build-only): the kinds of image source behind ImageSource, one
// implementation each, over one Storage (conveyor/storage.h):
//   files   (file_kinds.cpp)   image_folder and file_list: one local file per sample;
//   memory  (file_kinds.cpp)   in_memory: the bytes the source holds;
//   shards  (shard_kind.cpp)   tar_shards at random: one ranged read per sample, by the index;
//   stream  (shard_stream.h)   tar_shards streamed: the positions of a ShardStream.
// ImageSource itself decodes (ImageWriter) and counts; a Kind only says where sample i's encoded
// bytes and label come from, and how to name it.
//
// Requires: prepare(workers) before the first read(), with no read() running; read() from the
// workers, each passing its own worker number (ctx.worker < workers), so that per-worker state
// (a StorageReader: connections, read-ahead) needs no lock.
// Guarantees: read() gives the sample's bytes and label or throws a std::runtime_error whose
// message names the file, shard or URL (the loader adds the sample index and describe()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/datasets.h"

namespace conveyor {

class ImageSource::Kind {
 public:
  struct Encoded {
    const uint8_t* data = nullptr;
    size_t size = 0;
    int64_t label = 0;
  };

  Kind(std::vector<ImageItem> items, std::vector<std::string> classes)
      : items_(std::move(items)), classes_(std::move(classes)) {}
  virtual ~Kind() = default;
  Kind(const Kind&) = delete;
  Kind& operator=(const Kind&) = delete;

  const std::vector<ImageItem>& items() const { return items_; }
  const std::vector<std::string>& classes() const { return classes_; }
  virtual size_t size() const { return items_.size(); }
  // Called before a loader's first read, with its number of workers.
  virtual void prepare(size_t workers) = 0;
  // Sample ctx.index's encoded bytes (into `buffer`, reusing its capacity, or memory the kind
  // holds) and its label.
  virtual Encoded read(const SampleContext& ctx, std::vector<uint8_t>& buffer) = 0;
  // A name for sample `index` in errors and skip lists: its path, or its shard and member.
  virtual std::string describe(size_t index) const {
    return index < items_.size() ? items_[index].path : "sample " + std::to_string(index);
  }
  // SampleSource::will_write: the samples worker `worker` reads next.
  virtual void will_read(size_t worker, const size_t* indices, size_t count) {
    (void)worker;
    (void)indices;
    (void)count;
  }

 protected:
  std::vector<ImageItem> items_;
  std::vector<std::string> classes_;
};

}  // namespace conveyor
