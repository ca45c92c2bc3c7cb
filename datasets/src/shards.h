// datasets/src/shards.h (build-only): the open shard files behind ImageSource::tar_shards and
// where each sample's .jpg member lies in them.
//
// Invariant: every member lies inside its shard (offset + size <= the shard's size, checked when
// the index is read), and every descriptor stays open for the Shards' lifetime.
// Thread safety: read() is const and uses only pread() on descriptors that nothing else moves or
// closes, so any number of workers call it at once without a lock.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/datasets.h"

namespace conveyor {
namespace detail {

// An owned file descriptor, closed on destruction.
class ShardFile {
 public:
  ShardFile() = default;
  explicit ShardFile(int fd) : fd_(fd) {}
  ~ShardFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardFile(ShardFile&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ShardFile& operator=(ShardFile&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace detail

struct ImageSource::Shards {
  struct Member {
    uint32_t shard = 0;   // index into paths / files
    uint64_t offset = 0;  // of the .jpg member's data in the shard
    uint64_t size = 0;    // of the .jpg member's data
  };
  std::vector<std::string> paths;  // as opened (file:// removed)
  std::vector<detail::ShardFile> files;
  std::vector<Member> members;  // one per sample

  // Reads sample `index`'s JPEG bytes into `out` (reusing its capacity) with one pread (more only
  // if the kernel returns fewer bytes). Throws std::runtime_error naming the sample index and
  // `description` (the shard and member, as describe() gives them) when the read fails or comes
  // back short.
  // Inline: images.cpp calls it, and the fuzz target (tests/fuzz) compiles images.cpp without
  // shards.cpp.
  void read(size_t index, const std::string& description, std::vector<uint8_t>& out) const {
    const Member& m = members.at(index);
    const int fd = files[m.shard].get();
    const auto size = static_cast<size_t>(m.size);
    if (out.capacity() < size) out.reserve(size + size / 4);
    out.resize(size);
    size_t done = 0;
    while (done < size) {
      const ssize_t n =
          ::pread(fd, out.data() + done, size - done, static_cast<off_t>(m.offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error(description + ": sample " + std::to_string(index) +
                                 ": read failed: " + std::strerror(errno));
      }
      if (n == 0) {
        throw std::runtime_error(description + ": sample " + std::to_string(index) +
                                 ": the shard ends inside the member (truncated since the "
                                 "index was written?)");
      }
      done += static_cast<size_t>(n);
    }
  }
};

}  // namespace conveyor
