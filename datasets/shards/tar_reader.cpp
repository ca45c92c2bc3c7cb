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
  std::string member, key, extension, sample_key;  // scratch, reused

  static la_ssize_t read(archive* a, void* self_ptr, const void** buffer) {
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
  [[noreturn]] void fail(const std::string& where) {
    if (failure) std::rethrow_exception(failure);
    throw std::runtime_error(where + ": " + archive_message(tar.get()));
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
      const int r = archive_read_next_header(a, &s.entry);
      if (r == ARCHIVE_EOF) {
        s.archive_ended = true;
        if (image) return true;
        return next(out);
      }
      if (r < ARCHIVE_WARN) s.fail(s.name);
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
    }
    if (!started || s.key != s.sample_key) {
      started = true;
      s.sample_key = s.key;
    }
    s.held = false;
    const std::string what = s.name + " (member " + s.member + ")";
    if (is_image(s.extension) && !image) {
      const int64_t size = archive_entry_size(s.entry);
      if (size <= 0 || static_cast<uint64_t>(size) > kMaxImageBytes) {
        throw std::runtime_error(what + ": " + std::to_string(size) +
                                 " bytes, not a JPEG this loader reads");
      }
      s.read_member(size, what, out.bytes);
      out.name = what;
      image = true;
    } else if (s.extension == "cls") {
      const int64_t size = archive_entry_size(s.entry);
      if (size < 0 || size > 64) throw std::runtime_error(what + ": not a label");
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
        throw std::runtime_error(what + ": not a decimal label: '" + digits + "'");
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

  static la_ssize_t read(archive* a, void* self_ptr, const void** out) {
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
  static la_int64_t skip(archive*, void* self_ptr, la_int64_t request) {
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
  archive_entry* entry = nullptr;
  while (true) {
    const int r = archive_read_next_header(a.get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) fail();
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
