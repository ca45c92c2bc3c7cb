// TarWriter (tar_writer.h): ustar shards through libarchive, with reproducible headers.
#include "shards/tar_writer.h"

#include <archive.h>
#include <archive_entry.h>

#include <cerrno>
#include <exception>
#include <stdexcept>
#include <utility>

namespace conveyor::detail {

namespace {
constexpr uint64_t kBlock = 512;
}  // namespace

struct TarWriter::Archive {
  archive* a = nullptr;
  archive_entry* entry = nullptr;
  std::exception_ptr sink_failure;  // what the sink threw inside libarchive's write callback
  ~Archive() {
    if (entry != nullptr) archive_entry_free(entry);
    if (a != nullptr) archive_write_free(a);
  }
};

uint64_t TarWriter::member_bytes(uint64_t size) {
  return kBlock + (size + kBlock - 1) / kBlock * kBlock;
}

TarWriter::TarWriter(std::function<void(const void*, size_t)> sink)
    : sink_(std::move(sink)), archive_(std::make_unique<Archive>()) {
  Archive& x = *archive_;
  x.a = archive_write_new();
  x.entry = archive_entry_new();
  if (x.a == nullptr || x.entry == nullptr)
    throw std::runtime_error("tar: libarchive out of memory");
  // No blocking: every byte goes to the sink as it is written, so written() is exact after each
  // call, and the archive ends right after its two zero blocks (no padding to 10 KiB).
  if (archive_write_set_format_ustar(x.a) != ARCHIVE_OK ||
      archive_write_set_bytes_per_block(x.a, 0) != ARCHIVE_OK ||
      archive_write_open(
          x.a, this, nullptr,
          [](archive* a, void* self_ptr, const void* data, size_t size) -> la_ssize_t {
            auto* self = static_cast<TarWriter*>(self_ptr);
            try {
              self->sink_(data, size);
            } catch (...) {
              self->archive_->sink_failure = std::current_exception();
              archive_set_error(a, EIO, "the shard's write failed");
              return -1;
            }
            self->written_ += size;
            return static_cast<la_ssize_t>(size);
          },
          nullptr) != ARCHIVE_OK) {
    throw std::runtime_error(std::string("tar: ") + archive_error_string(x.a));
  }
}

TarWriter::~TarWriter() = default;

uint64_t TarWriter::add(const std::string& name, const void* data, size_t size) {
  Archive& x = *archive_;
  auto check = [&](la_ssize_t status, const char* what) {
    if (status >= ARCHIVE_WARN) return;
    if (x.sink_failure) std::rethrow_exception(x.sink_failure);
    throw std::runtime_error("tar: " + name + ": " + what + ": " + archive_error_string(x.a));
  };
  if (finished_) throw std::logic_error("TarWriter::add after finish");
  archive_entry_clear(x.entry);
  archive_entry_set_pathname(x.entry, name.c_str());
  archive_entry_set_filetype(x.entry, AE_IFREG);
  archive_entry_set_perm(x.entry, 0644);
  archive_entry_set_size(x.entry, static_cast<la_int64_t>(size));
  archive_entry_set_uid(x.entry, 0);
  archive_entry_set_gid(x.entry, 0);
  archive_entry_set_mtime(x.entry, 0, 0);
  check(archive_write_header(x.a, x.entry), "header");
  const uint64_t offset = written_;
  check(archive_write_data(x.a, data, size), "data");
  check(archive_write_finish_entry(x.a), "padding");
  return offset;
}

uint64_t TarWriter::finish() {
  Archive& x = *archive_;
  if (!finished_) {
    finished_ = true;
    if (archive_write_close(x.a) != ARCHIVE_OK) {
      if (x.sink_failure) std::rethrow_exception(x.sink_failure);
      throw std::runtime_error(std::string("tar: closing: ") + archive_error_string(x.a));
    }
  }
  return written_;
}

}  // namespace conveyor::detail
