// system_storage() (conveyor/storage.h): local files through POSIX calls, URLs through libcurl
// (http.h), pipe: commands through /bin/sh (command.h); and the read loops every source uses.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/storage.h"
#include "storage/clock.h"
#include "storage/command.h"
#include "storage/file_descriptor.h"
#include "storage/http.h"

namespace conveyor {

std::string StorageLocation::name() const {
  return kind == Kind::kPipe ? "pipe:" + location : location;
}

// ---------------------------------------------------------------------------------------------
// StreamCancel

StreamCancel::StreamCancel() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0) throw std::runtime_error(std::string("eventfd failed: ") + std::strerror(errno));
}

StreamCancel::~StreamCancel() { ::close(fd_); }

void StreamCancel::cancel() {
  cancelled_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof one);
}

bool StreamCancel::sleep_for(std::chrono::milliseconds duration) const {
  const auto deadline = detail::Clock::now() + duration;
  while (!cancelled()) {
    if (detail::Clock::now() >= deadline) return true;
    pollfd fd{fd_, POLLIN, 0};
    ::poll(&fd, 1, detail::milliseconds_until(deadline));
  }
  return false;
}

namespace {

using detail::FileDescriptor;

[[noreturn]] void file_error(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

[[noreturn]] void errno_error(const std::string& path, const char* what, int error) {
  file_error(path, std::string(what) + ": " + std::strerror(error));
}

// A local file: its descriptor, shared by every reader (pread takes no lock).
class LocalFile final : public StorageFile {
 public:
  LocalFile(std::string path, FileDescriptor fd, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size) {}
  const std::string& name() const override { return path_; }
  uint64_t size() const override { return size_; }
  int fd() const { return fd_.get(); }

 private:
  std::string path_;
  FileDescriptor fd_;
  uint64_t size_;
};

// A URL: read through each reader's own connections.
class RemoteFile final : public StorageFile {
 public:
  explicit RemoteFile(std::string url) : url_(std::move(url)) {}
  const std::string& name() const override { return url_; }
  uint64_t size() const override { return kUnknownSize; }

 private:
  std::string url_;
};

// Opens `path` for reading: a regular file, checked with fstat.
std::shared_ptr<const StorageFile> open_local(const std::string& path) {
  // O_NONBLOCK: opening a FIFO named like an image must not wait for a writer; it is refused
  // below as not a regular file. Reads from regular files ignore the flag.
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    const int e = errno;
    struct stat link {};
    if (e == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      file_error(path, "dangling symbolic link");
    }
    errno_error(path, "cannot open", e);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) errno_error(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode)) file_error(path, "not a regular file");
  return std::make_shared<LocalFile>(path, std::move(fd), static_cast<uint64_t>(st.st_size));
}

// A local file's bytes in order, for streaming: pread from where the attempt starts.
class FileStream final : public ByteStream {
 public:
  FileStream(std::shared_ptr<const StorageFile> file, const StreamCancel& cancel)
      : file_(std::move(file)), cancel_(cancel) {}
  uint64_t start(uint64_t offset) override {
    position_ = offset;
    return offset;
  }
  Bytes read() override {
    if (cancel_.cancelled()) throw StreamCancelled();
    if (buffer_.empty()) buffer_.resize(kChunk);
    const auto& file = static_cast<const LocalFile&>(*file_);
    while (true) {
      const ssize_t n =
          ::pread(file.fd(), buffer_.data(), buffer_.size(), static_cast<off_t>(position_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        throw StreamFailure(std::string("read failed: ") + std::strerror(errno), false);
      }
      position_ += static_cast<uint64_t>(n);
      return {buffer_.data(), static_cast<size_t>(n)};
    }
  }
  void stop() override {}

 private:
  static constexpr size_t kChunk = 1 << 20;
  std::shared_ptr<const StorageFile> file_;
  const StreamCancel& cancel_;
  uint64_t position_ = 0;
  std::vector<uint8_t> buffer_;
};

class SystemReader final : public StorageReader {
 public:
  explicit SystemReader(const RemoteOptions& options) : options_(options) {}

  size_t read_at(const StorageFile& file, uint64_t offset, size_t size, uint8_t* buffer) override {
    if (const auto* local = dynamic_cast<const LocalFile*>(&file)) {
      while (true) {
        const ssize_t n = ::pread(local->fd(), buffer, size, static_cast<off_t>(offset));
        if (n >= 0) return static_cast<size_t>(n);
        if (errno != EINTR) errno_error(file.name(), "read failed", errno);
      }
    }
    const std::string& url = file.name();
    if (!(ahead_ && ahead_->take({&url, offset, size}, bytes_))) {
      // Not read ahead, or not whole: read it (again) with retries; errors name the URL.
      if (!http_) http_ = std::make_unique<detail::HttpClient>(options_);
      http_->get_range(url, offset, size, bytes_);
    }
    const size_t n = std::min(size, bytes_.size());
    std::memcpy(buffer, bytes_.data(), n);
    return n;
  }

  void will_read(const FileRange* ranges, size_t count) override {
    if (options_.requests_in_flight <= 1) return;
    remote_.clear();
    for (size_t i = 0; i < count; ++i) {
      const FileRange& r = ranges[i];
      if (dynamic_cast<const RemoteFile*>(r.file) != nullptr) {
        remote_.push_back({&r.file->name(), r.offset, r.size});
      }
    }
    if (remote_.empty()) return;
    if (!ahead_) {
      ahead_ = std::make_unique<detail::HttpReadAhead>(options_, options_.requests_in_flight);
    }
    ahead_->start(remote_);
  }

  bool read_whole(const StorageLocation& where, size_t max_bytes,
                  std::vector<uint8_t>& out) override {
    switch (where.kind) {
      case StorageLocation::Kind::kHttp:
        if (!http_) http_ = std::make_unique<detail::HttpClient>(options_);
        if (!http_->get_if_exists(where.location, max_bytes, out)) return false;
        break;
      case StorageLocation::Kind::kPipe:
        detail::read_command_output(where.location, options_, max_bytes, out);
        break;
      case StorageLocation::Kind::kLocal: {
        struct stat st {};
        if (::stat(where.location.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
        const auto file = open_local(where.location);
        if (file->size() > max_bytes) {
          throw std::runtime_error(where.name() + ": " + std::to_string(file->size()) +
                                   " bytes, more than the " + std::to_string(max_bytes) +
                                   " it may have");
        }
        out.resize(static_cast<size_t>(std::min<uint64_t>(file->size(), max_bytes + 1)));
        size_t done = 0;
        while (done < out.size()) {
          const size_t n = read_at(*file, done, out.size() - done, out.data() + done);
          if (n == 0) break;
          done += n;
        }
        out.resize(done);
        break;
      }
    }
    if (out.size() > max_bytes) {
      throw std::runtime_error(where.name() + ": more than " + std::to_string(max_bytes) +
                               " bytes");
    }
    return true;
  }

  std::unique_ptr<ByteStream> open_stream(const StorageLocation& where,
                                          const StreamCancel& cancel) override {
    switch (where.kind) {
      case StorageLocation::Kind::kHttp:
        if (!stream_handles_)
          stream_handles_ = std::make_unique<detail::HttpStreamHandles>(options_);
        return detail::open_http_stream(*stream_handles_, where.location, options_, cancel);
      case StorageLocation::Kind::kPipe:
        return detail::open_pipe_stream(where.location, options_, cancel);
      case StorageLocation::Kind::kLocal:
        break;
    }
    return std::make_unique<FileStream>(open_local(where.location), cancel);
  }

 private:
  const RemoteOptions options_;
  std::unique_ptr<detail::HttpClient> http_;      // made on the first remote read
  std::unique_ptr<detail::HttpReadAhead> ahead_;  // made on the first hint with remote ranges
  std::unique_ptr<detail::HttpStreamHandles> stream_handles_;  // kept across streams
  std::vector<detail::HttpReadAhead::Range> remote_;
  std::vector<uint8_t> bytes_;  // a remote range, before it is copied out
};

class SystemStorage final : public Storage {
 public:
  std::vector<FolderEntry> list_folder(const std::string& path) const override {
    struct Closer {
      void operator()(DIR* d) const { ::closedir(d); }
    };
    std::unique_ptr<DIR, Closer> dir(::opendir(path.c_str()));
    if (!dir) errno_error(path, "cannot list the folder", errno);
    std::vector<FolderEntry> entries;
    while (true) {
      errno = 0;
      const dirent* entry = ::readdir(dir.get());
      if (entry == nullptr) {
        if (errno != 0) errno_error(path, "cannot list the folder", errno);
        break;
      }
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      bool folder = entry->d_type == DT_DIR;
      if (entry->d_type == DT_LNK || entry->d_type == DT_UNKNOWN) {
        struct stat st {};  // follows links; a dangling one is no folder
        folder = ::stat((path + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      }
      entries.push_back({name, folder});
    }
    return entries;
  }

  std::shared_ptr<const StorageFile> open_file(const StorageLocation& where) const override {
    if (where.kind == StorageLocation::Kind::kHttp) {
      return std::make_shared<RemoteFile>(where.location);
    }
    if (where.kind == StorageLocation::Kind::kPipe) {
      throw std::invalid_argument(where.name() + ": a command's output can only be streamed");
    }
    return open_local(where.location);
  }

  std::unique_ptr<StorageReader> reader(const RemoteOptions& options) const override {
    return std::make_unique<SystemReader>(options);
  }
};

}  // namespace

std::shared_ptr<const Storage> system_storage() { return std::make_shared<SystemStorage>(); }

void read_range(StorageReader& reader, const StorageFile& file, uint64_t offset, uint64_t size,
                std::vector<uint8_t>& out) {
  if (size > std::numeric_limits<size_t>::max() / 2) {
    throw std::runtime_error(file.name() + ": range too large");
  }
  const auto bytes = static_cast<size_t>(size);
  if (out.capacity() < bytes) out.reserve(bytes + bytes / 4);
  out.resize(bytes);
  size_t done = 0;
  while (done < bytes) {
    const size_t n = reader.read_at(file, offset + done, bytes - done, out.data() + done);
    if (n == 0) {
      throw std::runtime_error(file.name() + ": the file ends at byte " +
                               std::to_string(offset + done) + ", inside bytes " +
                               std::to_string(offset) + ".." + std::to_string(offset + size) +
                               " (truncated since the index was written?)");
    }
    done += n;
  }
}

void read_file(const Storage& storage, StorageReader& reader, const std::string& path,
               std::vector<uint8_t>& out, uint64_t max_bytes) {
  const std::shared_ptr<const StorageFile> file =
      storage.open_file({StorageLocation::Kind::kLocal, path});
  const uint64_t size = file->size();
  if (size == 0) file_error(path, "empty file");
  if (size > max_bytes || size > std::numeric_limits<size_t>::max() / 2) {
    file_error(path, std::to_string(size) + " bytes, more than the limit of " +
                         std::to_string(max_bytes) + " bytes");
  }
  const auto bytes = static_cast<size_t>(size);
  if (out.capacity() < bytes) out.reserve(bytes + bytes / 4);
  out.resize(bytes);
  size_t done = 0;
  while (done < bytes) {
    const size_t n = reader.read_at(*file, done, bytes - done, out.data() + done);
    if (n == 0) file_error(path, "file shrank while being read");
    done += n;
  }
}

void read_file(const std::string& path, std::vector<uint8_t>& out, uint64_t max_bytes) {
  static const SystemStorage storage;    // stateless
  SystemReader reader{RemoteOptions{}};  // connects to nothing for a local file
  read_file(storage, reader, path, out, max_bytes);
}

}  // namespace conveyor
