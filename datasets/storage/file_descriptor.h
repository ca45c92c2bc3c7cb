// datasets/storage/file_descriptor.h (build-only): an owned POSIX file descriptor.
//
// Invariant: get() is the descriptor this object owns, or -1; it is closed exactly once, by the
// destructor or by a move assignment over it.
// Thread safety: get() may be called from any thread; the object itself is not shared for writes.
#pragma once

#include <unistd.h>

namespace conveyor::detail {

class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace conveyor::detail
