// TarSampleReader and count_tar_samples (tar_reader.h): libarchive over the storage's streams
// and reads at random.
#include "shards/tar_reader.h"

#include <archive.h>
#include <archive_entry.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor/internal/printable.h"
#include "storage/resuming_stream.h"

namespace conveyor::detail {

namespace {

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};
using Archive = std::unique_ptr<archive, ArchiveFree>;

Archive new_tar_reader() {
  Archive a(archive_read_new());
  if (!a) throw std::runtime_error("tar_shards: archive_read_new failed");
  archive_read_support_format_tar(a.get());
  return a;
}

std::string archive_message(archive* a) {
  const char* text = archive_error_string(a);
  return text != nullptr ? text : "unknown libarchive error";
}

// WebDataset's rule: the key is the path up to the first dot of its last component, the
// extension the rest ("a/b.c.jpg" -> "a/b", "c.jpg"); the extension is compared in lower case.
void split_member(const std::string& path, std::string& key, std::string& extension) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) {
    key = path;
    extension.clear();
    return;
  }
  key = path.substr(0, dot);
  extension = path.substr(dot + 1);
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

bool is_image(const std::string& extension) { return extension == "jpg" || extension == "jpeg"; }

constexpr int64_t kMaxLabelBytes = 64;  // a .cls member larger is not a label

// Why an image member of `entry` is refused before any of its data is read, or empty: a size
// outside (0, kMaxImageBytes], or holes (a sparse member, counted at its expanded size).
std::string refused_image(archive_entry* entry) {
  const int64_t size = archive_entry_size(entry);
  if (size <= 0 || static_cast<uint64_t>(size) > kMaxImageBytes) {
    return std::to_string(size) + " bytes, not a JPEG this loader reads (at most " +
           std::to_string(kMaxImageBytes) + ")";
  }
  if (archive_entry_sparse_count(entry) > 0) {
    int64_t stored = 0;
    la_int64_t offset = 0, length = 0;
    archive_entry_sparse_reset(entry);
    while (archive_entry_sparse_next(entry, &offset, &length) == ARCHIVE_OK) stored += length;
    return "a sparse member of " + std::to_string(size) + " bytes of which the shard holds " +
           std::to_string(stored) + " (the rest are holes): not a JPEG this loader reads";
  }
  return {};
}

// Reads the next header, going over a run of damaged ones (a wrong checksum: libarchive's
// ARCHIVE_RETRY, one 512-byte block at a time, which is how it finds the next valid header).
// Returns libarchive's result for the header that ended the run (or the only one read); with a
// run, `damaged_at` is the offset of its first block, else -1.
int next_header(archive* a, archive_entry** entry, int64_t& damaged_at) {
  damaged_at = -1;
  int r = archive_read_next_header(a, entry);
  while (r == ARCHIVE_RETRY) {
    if (damaged_at < 0) damaged_at = archive_read_header_position(a);
    r = archive_read_next_header(a, entry);
  }
  return r;
}

}  // namespace

struct TarSampleReader::State {
  std::string name;  // the shard, for messages
  Archive tar;
  std::unique_ptr<ResumingStream> stream;
  std::exception_ptr failure;  // what the stream threw inside libarchive's read
  archive_entry* entry = nullptr;
  bool held = false;  // `entry`'s header was read, its data not yet
  bool archive_ended = false;
  bool finished = false;
  // A run of damaged headers was read over, to be reported as a failed position before
  // `after_damage` (libarchive's result for the header that ended it) is taken up.
  int64_t damaged_at = -1;
  int after_damage = ARCHIVE_OK;
  bool damage_pending = false;
  std::string member, key, extension, sample_key;  // scratch, reused

  // libarchive's read callback: no exception leaves it (it is stored, and rethrown by fail()).
  static la_ssize_t read(archive* a, void* self_ptr, const void** buffer) noexcept {
    auto* self = static_cast<State*>(self_ptr);
    try {
      const std::span<const uint8_t> bytes = self->stream->next();
      *buffer = bytes.data();
      return static_cast<la_ssize_t>(bytes.size());
    } catch (...) {
      self->failure = std::current_exception();
      archive_set_error(a, EIO, "the shard's read failed");
      return -1;
    }
  }

  // The stream's own error where it caused libarchive's, else libarchive's, naming the shard.
  std::exception_ptr error_of(const std::string& where) {
    if (failure) return failure;
    return std::make_exception_ptr(std::runtime_error(where + ": " + archive_message(tar.get())));
  }
  [[noreturn]] void fail(const std::string& where) { std::rethrow_exception(error_of(where)); }
  // A header that could not be read after a sample was gathered: the sample is given first,
  // and the next call throws this.
  std::exception_ptr header_failure;

  // The failed position of the run of damaged headers read over last.
  void report_damage(TarSample& out) {
    const std::string at = std::to_string(damaged_at);
    const bool member_follows = after_damage == ARCHIVE_OK || after_damage == ARCHIVE_WARN;
    out.bytes.clear();
    out.has_label = false;
    out.label = 0;
    out.name = name + " (damaged tar header at byte " + at + ")";
    out.error =
        "the tar header at byte " + at +
        " is damaged (its checksum is wrong); the member there and the bytes up to " +
        (member_follows ? "the next valid header, at byte " +
                              std::to_string(archive_read_header_position(tar.get())) + ", are lost"
                        : "the end of the shard are lost");
    damage_pending = false;
  }

  // Reads the current member's data into `out` (exactly `size` bytes).
  void read_member(int64_t size, const std::string& what, std::vector<uint8_t>& out) {
    out.resize(static_cast<size_t>(size));
    size_t done = 0;
    while (done < out.size()) {
      const la_ssize_t n = archive_read_data(tar.get(), out.data() + done, out.size() - done);
      if (n < 0) fail(what);
      if (n == 0) {
        throw std::runtime_error(what + ": the member ends after " + std::to_string(done) + " of " +
                                 std::to_string(size) + " bytes (truncated shard)");
      }
      done += static_cast<size_t>(n);
    }
  }
};

TarSampleReader::TarSampleReader(const ShardLocation& shard, StorageReader& reader,
                                 const RemoteOptions& options, const StreamCancel& cancel)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.name = shard.name();
  s.tar = new_tar_reader();
  s.stream =
      std::make_unique<ResumingStream>(s.name, reader.open_stream(shard, cancel), options, cancel);
  if (archive_read_open(s.tar.get(), &s, nullptr, &State::read, nullptr) != ARCHIVE_OK) {
    s.fail(s.name);
  }
}

TarSampleReader::~TarSampleReader() = default;

bool TarSampleReader::next(TarSample& out) {
  State& s = *state_;
  out.error.clear();
  if (s.header_failure) std::rethrow_exception(s.header_failure);
  if (s.damage_pending) {
    s.report_damage(out);
    return true;
  }
  if (s.archive_ended) {
    if (!s.finished) s.stream->finish();
    s.finished = true;
    return false;
  }
  out.has_label = false;
  out.label = 0;
  bool image = false;
  bool started = false;  // a key is being gathered
  archive* a = s.tar.get();
  while (true) {
    if (!s.held) {
      int r = ARCHIVE_OK;
      if (s.damaged_at >= 0) {
        r = s.after_damage;  // the header that ended the damaged run just reported
        s.damaged_at = -1;
      } else {
        r = next_header(a, &s.entry, s.damaged_at);
        if (s.damaged_at >= 0) {
          s.after_damage = r;
          s.damage_pending = true;
          if (image) return true;  // the sample gathered so far; the damage comes next
          out.error.clear();
          return next(out);
        }
      }
      if (r == ARCHIVE_EOF) {
        s.archive_ended = true;
        if (image) return true;
        return next(out);
      }
      if (r < ARCHIVE_WARN) {
        if (!image) s.fail(s.name);
        s.header_failure = s.error_of(s.name);  // a shard cut short: what it held comes first
        return true;
      }
      s.held = true;
    }
    const char* path = archive_entry_pathname(s.entry);
    if (archive_entry_filetype(s.entry) != AE_IFREG || path == nullptr) {
      s.held = false;
      if (archive_read_data_skip(a) < ARCHIVE_WARN) s.fail(s.name);
      continue;
    }
    s.member = path;
    split_member(s.member, s.key, s.extension);
    if (started && s.key != s.sample_key) {
      if (image) return true;  // the header stays held: it starts the next sample
      out.has_label = false;   // a key without an image: dropped
      out.label = 0;
      out.error.clear();
    }
    if (!started || s.key != s.sample_key) {
      started = true;
      s.sample_key = s.key;
    }
    s.held = false;
    const std::string what = s.name + " (member " + printable(s.member) + ")";
    if (is_image(s.extension) && !image) {
      out.name = what;
      image = true;
      const std::string refused = refused_image(s.entry);
      if (refused.empty()) {
        s.read_member(archive_entry_size(s.entry), what, out.bytes);
        continue;
      }
      out.bytes.clear();
      out.error = refused;
      if (archive_read_data_skip(a) < ARCHIVE_WARN) s.fail(what);
    } else if (s.extension == "cls") {
      const int64_t size = archive_entry_size(s.entry);
      if (size < 0 || size > kMaxLabelBytes || archive_entry_sparse_count(s.entry) > 0) {
        if (out.error.empty()) {
          out.error = "its label, member " + printable(s.member) + ", is " + std::to_string(size) +
                      " bytes: not a label";
        }
        if (archive_read_data_skip(a) < ARCHIVE_WARN) s.fail(what);
        continue;
      }
      std::vector<uint8_t> text;
      s.read_member(size, what, text);
      std::string digits(text.begin(), text.end());
      while (!digits.empty() && std::isspace(static_cast<unsigned char>(digits.back()))) {
        digits.pop_back();
      }
      char* end = nullptr;
      errno = 0;
      const long long label = std::strtoll(digits.c_str(), &end, 10);
      if (digits.empty() || *end != '\0' || errno != 0) {
        if (out.error.empty()) {
          out.error = "its label, member " + printable(s.member) + ", is not decimal text: '" +
                      printable(digits) + "'";
        }
        continue;
      }
      out.label = label;
      out.has_label = true;
    } else if (archive_read_data_skip(a) < ARCHIVE_WARN) {
      s.fail(what);
    }
  }
}

namespace {

// libarchive over a file's reads at random, so that skipping a member's data reads none of it.
struct RandomAccessTar {
  RandomAccessTar(StorageReader& r, const StorageFile& f) : reader(r), file(f) {}
  StorageReader& reader;
  const StorageFile& file;
  uint64_t position = 0;
  std::vector<uint8_t> buffer = std::vector<uint8_t>(64 * 1024);
  std::exception_ptr failure;

  // libarchive's callbacks: no exception leaves them (it is stored, and rethrown after the call).
  static la_ssize_t read(archive* a, void* self_ptr, const void** out) noexcept {
    auto* self = static_cast<RandomAccessTar*>(self_ptr);
    try {
      const size_t n = self->reader.read_at(self->file, self->position, self->buffer.size(),
                                            self->buffer.data());
      self->position += n;
      *out = self->buffer.data();
      return static_cast<la_ssize_t>(n);
    } catch (...) {
      self->failure = std::current_exception();
      archive_set_error(a, EIO, "the shard's read failed");
      return -1;
    }
  }
  static la_int64_t skip(archive*, void* self_ptr, la_int64_t request) noexcept {
    auto* self = static_cast<RandomAccessTar*>(self_ptr);
    self->position += static_cast<uint64_t>(request);
    return request;
  }
};

}  // namespace

size_t count_tar_samples(const Storage& storage, StorageReader& reader, const std::string& path) {
  const auto file = storage.open_file({ShardLocation::Kind::kLocal, path});
  RandomAccessTar source(reader, *file);
  Archive a = new_tar_reader();
  auto fail = [&]() {
    if (source.failure) std::rethrow_exception(source.failure);
    throw std::runtime_error("tar_shards: " + path + ": " + archive_message(a.get()));
  };
  archive_read_set_read_callback(a.get(), &RandomAccessTar::read);
  archive_read_set_skip_callback(a.get(), &RandomAccessTar::skip);
  archive_read_set_callback_data(a.get(), &source);
  if (archive_read_open1(a.get()) != ARCHIVE_OK) fail();
  size_t samples = 0;
  std::string last_key, key, extension;
  bool counted = false;
  bool any_header = false;
  archive_entry* entry = nullptr;
  while (true) {
    int64_t damaged_at = -1;
    const int r = next_header(a.get(), &entry, damaged_at);
    if (damaged_at >= 0) {
      ++samples;  // the reader's failed position for the run; a new key starts after it
      last_key.clear();
      counted = false;
    }
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      // Cut short (or damaged past reading): the reader fails at the same place, and the cut
      // counts as one sample, so that the stream reports it (it ends a position short). Before
      // the first header, this is not a tar shard.
      if (!any_header || source.failure) fail();
      ++samples;
      break;
    }
    any_header = true;
    const char* name = archive_entry_pathname(entry);
    if (archive_entry_filetype(entry) == AE_IFREG && name != nullptr) {
      split_member(name, key, extension);
      if (key != last_key) {
        last_key = key;
        counted = false;
      }
      if (is_image(extension) && !counted) {
        ++samples;
        counted = true;
      }
    }
    if (archive_read_data_skip(a.get()) < ARCHIVE_WARN) fail();
  }
  return samples;
}

}  // namespace conveyor::detail
