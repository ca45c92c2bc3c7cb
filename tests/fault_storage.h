// Test support: a Storage (conveyor/storage.h) that injects faults into another, the real one by
// default, for the storage-fault and soak tests. The sources take it through their options
// (FolderOptions::storage, ShardOptions::storage); the shipped path is untouched.
//
// Each fault applies to the files whose name (path or URL) contains its `match` text (empty:
// every file), and counts the reads at random of those files across all readers (1 is the
// first). The faults, and the errors they give, are those of the real world:
//   io_error   read number k (and the `times - 1` after it) fails with EIO, as a disk or NFS read
//              does: "NAME: read failed: Input/output error";
//   short_reads every read returns at most `bytes` bytes, as a pipe, a FUSE or NFS read may (the
//              sources must read on: the bytes are the same);
//   gone       the file was removed after the listing (or after the index was read): opening it
//              fails with ENOENT, and so does reading one opened before (as a remote file does);
//   resized    the file is now `bytes` long: reads past that return 0 (end of file), as after a
//              truncation while the file was open or after its listing;
//   stall      read number k sleeps `duration` before it reads, as a hung mount does (past the
//              loader's timeout, which then raises TimeoutError; the read itself ends).
// Streams and whole-file reads (read_whole, open_stream) pass through unchanged.
// Thread safety: add faults while no read runs (a fault added after a source was made, before its
// loader runs, applies from then on: a shard opened at construction, then gone); reads from any
// number of threads.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/storage.h"

namespace conveyor::testing {

class FaultStorage : public Storage {
 public:
  explicit FaultStorage(std::shared_ptr<const Storage> inner = system_storage())
      : inner_(std::move(inner)) {}

  FaultStorage& io_error(std::string match, size_t kth, size_t times = 1) {
    return add({Fault::kIoError, std::move(match), kth, times, 0, {}});
  }
  FaultStorage& short_reads(std::string match, size_t bytes) {
    return add({Fault::kShortReads, std::move(match), 1, ~size_t{0}, bytes, {}});
  }
  FaultStorage& gone(std::string match) {
    return add({Fault::kGone, std::move(match), 1, ~size_t{0}, 0, {}});
  }
  FaultStorage& resized(std::string match, uint64_t bytes) {
    return add({Fault::kResized, std::move(match), 1, ~size_t{0}, bytes, {}});
  }
  FaultStorage& stall(std::string match, size_t kth, std::chrono::milliseconds duration) {
    return add({Fault::kStall, std::move(match), kth, 1, 0, duration});
  }

  // Faults injected so far (reads failed, shortened, cut or stalled; opens refused).
  size_t injected() const { return injected_.load(); }
  // Reads at random so far, of every file.
  size_t reads() const { return reads_.load(); }

  std::vector<FolderEntry> list_folder(const std::string& path) const override {
    return inner_->list_folder(path);
  }

  std::shared_ptr<const StorageFile> open_file(const StorageLocation& where) const override {
    for (const Rule& r : rules_) {
      if (r.fault == Fault::kGone && matches(r, where.location)) {
        injected_.fetch_add(1);
        throw std::runtime_error(where.location + ": cannot open: " + std::strerror(ENOENT));
      }
    }
    return std::make_shared<File>(inner_->open_file(where));
  }

  std::unique_ptr<StorageReader> reader(const RemoteOptions& options) const override {
    return std::make_unique<Reader>(*this, inner_->reader(options));
  }

 private:
  enum class Fault { kIoError, kShortReads, kGone, kResized, kStall };
  struct Rule {
    Fault fault;
    std::string match;
    size_t kth;    // the first read it applies to (1-based)
    size_t times;  // how many reads from there
    uint64_t bytes;
    std::chrono::milliseconds duration;
    std::unique_ptr<std::atomic<size_t>> count = std::make_unique<std::atomic<size_t>>(0);
  };

  class File final : public StorageFile {
   public:
    explicit File(std::shared_ptr<const StorageFile> inner) : inner_(std::move(inner)) {}
    const std::string& name() const override { return inner_->name(); }
    uint64_t size() const override { return inner_->size(); }
    const StorageFile& inner() const { return *inner_; }

   private:
    std::shared_ptr<const StorageFile> inner_;
  };

  class Reader final : public StorageReader {
   public:
    Reader(const FaultStorage& storage, std::unique_ptr<StorageReader> inner)
        : storage_(storage), inner_(std::move(inner)) {}

    size_t read_at(const StorageFile& file, uint64_t offset, size_t size,
                   uint8_t* buffer) override {
      const auto& f = static_cast<const File&>(file);
      size = storage_.apply(f.name(), offset, size);
      if (size == 0) return 0;
      return inner_->read_at(f.inner(), offset, size, buffer);
    }
    void will_read(const FileRange* ranges, size_t count) override {
      inner_ranges_.clear();
      for (size_t i = 0; i < count; ++i) {
        FileRange r = ranges[i];
        r.file = &static_cast<const File*>(r.file)->inner();
        inner_ranges_.push_back(r);
      }
      inner_->will_read(inner_ranges_.data(), inner_ranges_.size());
    }
    bool read_whole(const StorageLocation& where, size_t max_bytes,
                    std::vector<uint8_t>& out) override {
      return inner_->read_whole(where, max_bytes, out);
    }
    std::unique_ptr<ByteStream> open_stream(const StorageLocation& where,
                                            const StreamCancel& cancel) override {
      return inner_->open_stream(where, cancel);
    }

   private:
    const FaultStorage& storage_;
    std::unique_ptr<StorageReader> inner_;
    std::vector<FileRange> inner_ranges_;
  };

  FaultStorage& add(Rule rule) {
    rules_.push_back(std::move(rule));
    return *this;
  }
  static bool matches(const Rule& r, const std::string& name) {
    return r.match.empty() || name.find(r.match) != std::string::npos;
  }

  // Applies the rules to one read of `size` bytes at `offset` of `name`: returns how many bytes
  // the read may return (0: the end of the file), or throws, or sleeps first.
  size_t apply(const std::string& name, uint64_t offset, size_t size) const {
    reads_.fetch_add(1);
    for (const Rule& r : rules_) {
      if (!matches(r, name)) continue;
      const size_t n = r.count->fetch_add(1) + 1;  // this read's number, for this rule
      const bool due = n >= r.kth && n - r.kth < r.times;
      switch (r.fault) {
        case Fault::kIoError:
          if (due) {
            injected_.fetch_add(1);
            throw std::runtime_error(name + ": read failed: " + std::strerror(EIO));
          }
          break;
        case Fault::kGone:
          injected_.fetch_add(1);
          throw std::runtime_error(name + ": read failed: " + std::strerror(ENOENT) +
                                   " (removed since it was opened)");
        case Fault::kShortReads:
          if (size > r.bytes) {
            injected_.fetch_add(1);
            size = static_cast<size_t>(r.bytes);
          }
          break;
        case Fault::kResized:
          if (offset + size > r.bytes) {
            injected_.fetch_add(1);
            size = offset >= r.bytes ? 0 : static_cast<size_t>(r.bytes - offset);
          }
          break;
        case Fault::kStall:
          if (due) {
            injected_.fetch_add(1);
            std::this_thread::sleep_for(r.duration);
          }
          break;
      }
    }
    return size;
  }

  std::shared_ptr<const Storage> inner_;
  std::deque<Rule> rules_;
  mutable std::atomic<size_t> injected_{0};
  mutable std::atomic<size_t> reads_{0};
};

}  // namespace conveyor::testing
