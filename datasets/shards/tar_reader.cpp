// TarSampleReader and count_tar_samples (tar_reader.h): libarchive over the storage's streams
// and reads at random.
#include "shards/tar_reader.h"

#include "conveyor/fields.h"

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

constexpr int64_t kMaxLabelBytes = 64;  // a .cls member larger is not a label

// The label in `digits` (a .cls member's text, trailing white space removed in place): decimal
// text that fits int64. False when it is not.
bool decimal_label(std::string& digits, int64_t& label) {
  while (!digits.empty() && std::isspace(static_cast<unsigned char>(digits.back()))) {
    digits.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || errno != 0) return false;
  label = value;
  return true;
}

// The bytes a sparse member's shard holds (its expanded size less the holes).
int64_t stored_bytes(archive_entry* entry) {
  int64_t stored = 0;
  la_int64_t offset = 0, length = 0;
  archive_entry_sparse_reset(entry);
  while (archive_entry_sparse_next(entry, &offset, &length) == ARCHIVE_OK) stored += length;
  return stored;
}

// Why an image member of `entry` is refused before any of its data is read, or empty: a size
// outside (0, kMaxImageBytes], or holes (a sparse member, counted at its expanded size).
std::string refused_image(archive_entry* entry) {
  const int64_t size = archive_entry_size(entry);
  if (size <= 0 || static_cast<uint64_t>(size) > kMaxImageBytes) {
    return std::to_string(size) + " bytes, not a JPEG this loader reads (at most " +
           std::to_string(kMaxImageBytes) + ")";
  }
  if (archive_entry_sparse_count(entry) > 0) {
    return "a sparse member of " + std::to_string(size) + " bytes of which the shard holds " +
           std::to_string(stored_bytes(entry)) +
           " (the rest are holes): not a JPEG this loader reads";
  }
  return {};
}

// Why member `path` (its header `entry`) cannot join `sample` under SampleRule::kMembers (the
// bounds in tar_reader.h), or empty.
std::string refused_member(archive_entry* entry, const std::string& path, const TarSample& sample) {
  const std::string member = "member " + printable(path);
  const int64_t size = archive_entry_size(entry);
  if (path.size() > kMaxMemberPathBytes) {
    return "a member path of " + std::to_string(path.size()) + " bytes (at most " +
           std::to_string(kMaxMemberPathBytes) + ")";
  }
  if (sample.members.size() >= kMaxSampleMembers) {
    return "more than " + std::to_string(kMaxSampleMembers) + " members (at " + member + ")";
  }
  if (size < 0 || static_cast<uint64_t>(size) > kMaxMemberBytes) {
    return member + " is " + std::to_string(size) + " bytes (at most " +
           std::to_string(kMaxMemberBytes) + ")";
  }
  if (archive_entry_sparse_count(entry) > 0) {
    return member + " is sparse: " + std::to_string(size) + " bytes of which the shard holds " +
           std::to_string(stored_bytes(entry)) + " (the rest are holes)";
  }
  if (static_cast<uint64_t>(size) > kMaxSampleBytes - sample.data.size()) {
    return "its members come to more than " + std::to_string(kMaxSampleBytes) + " bytes (at " +
           member + ")";
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

void split_member(const std::string& path, std::string& key, std::string& extension) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) {
    key = path;
    extension.clear();
    return;
  }
  key.assign(path, 0, dot);
  extension.assign(path, dot + 1);
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

bool is_image_extension(std::string_view extension) {
  std::string_view keys = Field::kDefaultImageKeys;
  for (;;) {
    const size_t semicolon = keys.find(';');
    if (keys.substr(0, semicolon) == extension) return true;
    if (semicolon == std::string_view::npos) return false;
    keys.remove_prefix(semicolon + 1);
  }
}

struct TarSampleReader::State {
  std::string name;  // the shard, for messages
  SampleRule rule = SampleRule::kImages;
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
    out.key.clear();
    out.members.clear();
    out.data.clear();
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
    read_into(out.data(), out.size(), what);
  }
  void read_into(uint8_t* out, size_t size, const std::string& what) {
    size_t done = 0;
    while (done < size) {
      const la_ssize_t n = archive_read_data(tar.get(), out + done, size - done);
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
                                 const RemoteOptions& options, const StreamCancel& cancel,
                                 SampleRule rule)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.name = shard.name();
  s.rule = rule;
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
  const bool all_members = s.rule == SampleRule::kMembers;
  if (all_members) {
    out.bytes.clear();
    out.key.clear();
    out.members.clear();
    out.data.clear();
  }
  bool image = false;
  bool started = false;  // a key is being gathered
  // A sample was gathered: under kImages a key with an image, under kMembers any key. A failed
  // one gives no members.
  const auto gathered = [&] {
    if (all_members && started && !out.error.empty()) {
      out.bytes.clear();
      out.members.clear();
      out.data.clear();
    }
    return all_members ? started : image;
  };
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
          if (gathered()) return true;  // the sample gathered so far; the damage comes next
          out.error.clear();
          return next(out);
        }
      }
      if (r == ARCHIVE_EOF) {
        s.archive_ended = true;
        if (gathered()) return true;
        return next(out);
      }
      if (r < ARCHIVE_WARN) {
        if (!gathered()) s.fail(s.name);
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
      if (gathered()) return true;  // the header stays held: it starts the next sample
      out.has_label = false;        // a key without an image: dropped
      out.label = 0;
      out.error.clear();
    }
    if (!started || s.key != s.sample_key) {
      started = true;
      s.sample_key = s.key;
      if (all_members) {
        out.key = s.key;
        out.name = s.name + " (sample " + printable(s.key) + ")";
      }
    }
    s.held = false;
    const std::string what = s.name + " (member " + printable(s.member) + ")";
    if (all_members) {
      take_member(out, what, image);
      continue;
    }
    if (is_image_extension(s.extension) && !image) {
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
      if (!decimal_label(digits, out.label)) {
        if (out.error.empty()) {
          out.error = "its label, member " + printable(s.member) + ", is not decimal text: '" +
                      printable(digits) + "'";
        }
        continue;
      }
      out.has_label = true;
    } else if (archive_read_data_skip(a) < ARCHIVE_WARN) {
      s.fail(what);
    }
  }
}

void TarSampleReader::take_member(TarSample& out, const std::string& what, bool& image) {
  State& s = *state_;
  archive* a = s.tar.get();
  // After a refusal the key's other members are skipped too (one failed position); so is a
  // repeated extension (the first wins).
  if (!out.error.empty() || out.find(s.extension) != nullptr) {
    if (archive_read_data_skip(a) < ARCHIVE_WARN) s.fail(what);
    return;
  }
  const std::string refused = refused_member(s.entry, s.member, out);
  if (!refused.empty()) {
    out.error = refused;
    if (archive_read_data_skip(a) < ARCHIVE_WARN) s.fail(what);
    return;
  }
  TarMember& m = out.members.emplace_back();
  m.extension = s.extension;
  m.shard_offset = static_cast<uint64_t>(archive_filter_bytes(a, 0));  // the header consumed
  m.size = static_cast<uint64_t>(archive_entry_size(s.entry));
  m.data_begin = out.data.size();
  out.data.resize(m.data_begin + m.size);
  s.read_into(out.data.data() + m.data_begin, m.size, what);
  const uint8_t* bytes = out.bytes_of(m);
  if (is_image_extension(m.extension) && !image) {
    image = true;
    out.name = what;
    out.bytes.assign(bytes, bytes + m.size);
  } else if (m.extension == "cls" && m.size <= kMaxLabelBytes) {
    std::string digits(bytes, bytes + m.size);
    out.has_label = decimal_label(digits, out.label);
    if (!out.has_label) out.label = 0;
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

size_t count_tar_samples(const Storage& storage, StorageReader& reader, const std::string& path,
                         SampleRule rule) {
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
      if ((rule == SampleRule::kMembers || is_image_extension(extension)) && !counted) {
        ++samples;
        counted = true;
      }
    }
    if (archive_read_data_skip(a.get()) < ARCHIVE_WARN) fail();
  }
  return samples;
}

}  // namespace conveyor::detail
