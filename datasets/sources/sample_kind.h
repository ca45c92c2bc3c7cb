// datasets/sources/sample_kind.h (build-only): where a FieldSource's samples come from, one
// implementation per kind of source, over one Storage (conveyor/storage.h):
//   files    (file_kinds.cpp)     image_folder and file_list: one local file and a label per
//   sample; memory   (file_kinds.cpp)     in_memory: the bytes the source holds; shards
//   (shard_kind.cpp)     tar_shards at random: one ranged read per sample, by the index; stream
//   (shard_stream.h)     tar_shards streamed: the positions of a ShardStream; manifest
//   (manifest_kind.cpp)  a manifest's rows, and the files its image columns name.
// A kind says only what sample i's members are (SampleMembers) and how to name it; FieldSource
// (field_source.cpp) makes each field of them (fields/: one writer per field kind).
//
// A member is what one field may read: a WebDataset member file (its extension, lower case, as
// the key rule gives it: "jpg", "boxes.npy"), a manifest cell (its column), or a number the kind
// knows (an ImageFolder's class: "cls"). Kinds give every member they have; a kind that reads
// members at random (shards) reads only those whose names want() lists.
//
// Requires: want() and prepare(workers) before the first read(), with no read() running; read()
// from the workers, each passing its own worker number (ctx.worker < workers), so that per-worker
// state (a StorageReader: connections, read-ahead) needs no lock.
// Guarantees: read() fills `out` with the sample's members or throws a std::runtime_error whose
// message names the file, shard, URL or manifest row (the loader adds the sample index and
// describe()). Members view out.buffer or memory the kind holds, valid until the next read() of
// the same worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/fields.h"

namespace conveyor {
namespace detail {

// What a member's bytes are.
enum class MemberEncoding {
  kFile,      // a file's bytes as they are (a shard member, an image file, a CSV or TSV cell)
  kJson,      // the text of one JSON value (a JSON Lines cell)
  kInteger,   // no bytes: `integer` is the value (a class the kind knows)
  kFloating,  // no bytes: `floating` is the value (a MemberReader's number)
  kArray,     // `size` bytes of `dtype` in C order, of shape shape[0..ndim) (a MemberReader's)
};

struct Member {
  std::string_view name;  // extension or column; views memory the kind holds
  MemberEncoding encoding = MemberEncoding::kFile;
  const uint8_t* data = nullptr;
  size_t size = 0;
  int64_t integer = 0;                            // kInteger
  double floating = 0;                            // kFloating
  c10::ScalarType dtype = c10::ScalarType::Byte;  // kArray
  const int64_t* shape = nullptr;                 // kArray: ndim dimensions
  size_t ndim = 0;
};

// One sample's members, as read() gives them; reused by each worker (no allocation once warm).
struct SampleMembers {
  std::vector<uint8_t> buffer;  // bytes that members may view
  std::string names;            // names that members may view (a stream's, copied)
  std::vector<Member> members;  // cleared and refilled by each read
  // The member named `name`, or null.
  const Member* find(std::string_view name) const {
    for (const Member& m : members) {
      if (m.name == name) return &m;
    }
    return nullptr;
  }
};

// The members of an image source's sample (ImageSource: "image" and "label"): the image file's
// bytes as "jpg" and the label as "cls".
inline void image_members(SampleMembers& out, const uint8_t* image, size_t size, int64_t label) {
  out.members.clear();
  out.members.push_back({"jpg", MemberEncoding::kFile, image, size, 0});
  out.members.push_back({"cls", MemberEncoding::kInteger, nullptr, 0, label});
}

}  // namespace detail

// A MemberList's members: added at offsets into `out`'s buffer and names, then made Members by
// finish(), once no add can move the bytes any more.
struct MemberList::Contents {
  struct Added {
    size_t name_begin = 0, name_size = 0;
    detail::MemberEncoding encoding = detail::MemberEncoding::kFile;
    size_t data_begin = 0, size = 0;
    int64_t integer = 0;
    double floating = 0;
    c10::ScalarType dtype = c10::ScalarType::Byte;
    size_t shape_begin = 0, ndim = 0;
  };
  detail::SampleMembers* out = nullptr;  // set by begin()
  std::vector<Added> added;
  std::vector<int64_t> shapes;

  // Empties `members` and directs the adds to it.
  void begin(detail::SampleMembers& members);
  // Makes out->members view what was added.
  void finish();
};

class FieldSource::Kind {
 public:
  Kind(std::vector<ImageItem> items, std::vector<std::string> classes)
      : items_(std::move(items)), classes_(std::move(classes)) {}
  virtual ~Kind() = default;
  Kind(const Kind&) = delete;
  Kind& operator=(const Kind&) = delete;

  // The file (and label) of each sample, where each sample is one file (folders, lists, memory,
  // indexed shards: "SHARD (member KEY.jpg)"); empty for a stream or a manifest.
  const std::vector<ImageItem>& items() const { return items_; }
  const std::vector<std::string>& classes() const { return classes_; }
  virtual size_t size() const { return items_.size(); }
  // The source's fields, once, before prepare(): a kind that reads members at random reads only
  // the members they name; a manifest reads an image field's column as a file's path. Throws
  // std::invalid_argument naming a field that this kind can never serve (a version 1 index, which
  // lists images only, asked for a txt member).
  virtual void want(const Fields& fields) { (void)fields; }
  // Called before a loader's first read, with its number of workers.
  virtual void prepare(size_t workers) = 0;
  // Sample ctx.index's members into `out` (see above).
  virtual void read(const SampleContext& ctx, detail::SampleMembers& out) = 0;
  // A name for sample `index` in errors and skip lists: its path, its shard and key, its row.
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
