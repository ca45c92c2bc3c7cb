// ShardStream: streaming mode of ImageSource::tar_shards (see shard_stream.h).
#include "shard_stream.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>

#include "conveyor/random.h"
#include "file_descriptor.h"
#include "http.h"

namespace conveyor {
namespace detail {

namespace {

constexpr uint64_t kChunkBytes = 4u << 20;             // one HTTP Range request of a streamed shard
constexpr int64_t kMaxMemberBytes = int64_t{1} << 28;  // a .jpg member larger is refused
constexpr size_t kSpareBuffers = 64;
constexpr size_t kInitialBuffer = 100;  // samples in the shuffle buffer before the first comes out

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};
using Archive = std::unique_ptr<archive, ArchiveFree>;

// A remote shard fed to libarchive in chunks of kChunkBytes; skipped member data is not fetched.
struct RemoteTar {
  HttpClient* client = nullptr;
  std::string url;
  uint64_t offset = 0;
  std::vector<uint8_t> chunk;

  static la_ssize_t read(archive* a, void* self_ptr, const void** buffer) {
    auto* self = static_cast<RemoteTar*>(self_ptr);
    try {
      self->client->get_chunk(self->url, self->offset, kChunkBytes, self->chunk);
    } catch (const std::exception& e) {
      archive_set_error(a, EIO, "%s", e.what());
      return -1;
    }
    self->offset += self->chunk.size();
    *buffer = self->chunk.data();
    return static_cast<la_ssize_t>(self->chunk.size());
  }
  static la_int64_t skip(archive*, void* self_ptr, la_int64_t request) {
    static_cast<RemoteTar*>(self_ptr)->offset += static_cast<uint64_t>(request);
    return request;
  }
};

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

// Reads the current member's data into `out` (exactly `size` bytes). Throws on a short read.
void read_member(archive* a, int64_t size, const std::string& what, std::vector<uint8_t>& out) {
  out.resize(static_cast<size_t>(size));
  size_t done = 0;
  while (done < out.size()) {
    const la_ssize_t n = archive_read_data(a, out.data() + done, out.size() - done);
    if (n < 0) throw std::runtime_error(what + ": " + archive_message(a));
    if (n == 0) {
      throw std::runtime_error(what + ": the member ends after " + std::to_string(done) + " of " +
                               std::to_string(size) + " bytes (truncated shard)");
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

size_t count_tar_samples(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw std::runtime_error("tar_shards: cannot open shard " + path + ": " + std::strerror(errno));
  }
  Archive a = new_tar_reader();
  if (archive_read_open_fd(a.get(), fd.get(), 1 << 16) != ARCHIVE_OK) {
    throw std::runtime_error("tar_shards: " + path + ": " + archive_message(a.get()));
  }
  size_t samples = 0;
  std::string last_key, key, extension;
  bool counted = false;
  archive_entry* entry = nullptr;
  while (true) {
    const int r = archive_read_next_header(a.get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      throw std::runtime_error("tar_shards: " + path + ": " + archive_message(a.get()));
    }
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
    archive_read_data_skip(a.get());
  }
  return samples;
}

std::vector<size_t> ShardStream::rank_shards(size_t shard_count, uint64_t seed, uint64_t epoch,
                                             size_t rank, size_t world_size) {
  std::vector<size_t> order(shard_count);
  for (size_t i = 0; i < shard_count; ++i) order[i] = i;
  SampleRng rng(seed ^ 0x5348415244ull /* "SHARD" */, epoch, 0);
  for (size_t i = shard_count; i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
  std::vector<size_t> mine;
  for (size_t i = rank; i < shard_count; i += world_size) mine.push_back(order[i]);
  return mine;
}

size_t ShardStream::equal_positions(std::vector<size_t> counts, size_t world_size) {
  const size_t each = counts.size() / world_size;
  std::sort(counts.begin(), counts.end());
  size_t total = 0;
  for (size_t i = 0; i < each; ++i) total += counts[i];
  return total;
}

ShardStream::ShardStream(std::vector<StreamShard> shards, ShardOptions options, size_t positions)
    : shards_(std::move(shards)),
      options_(std::move(options)),
      positions_(positions),
      lookahead_(std::max<size_t>(1, options_.stream_lookahead)),
      behind_(std::max<size_t>(1, options_.stream_window)) {}

ShardStream::~ShardStream() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  stop_reader(lock);
}

void ShardStream::stop_reader(std::unique_lock<std::mutex>& lock) {
  ++generation_;
  changed_.notify_all();
  std::thread old = std::move(reader_);
  lock.unlock();
  if (old.joinable()) old.join();  // its reads have deadlines, so this returns
  lock.lock();
}

void ShardStream::reset() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (restarting_) changed_.wait(lock);
  restarting_ = true;
  stop_reader(lock);
  window_.clear();
  running_ = false;
  restarting_ = false;
  changed_.notify_all();
}

void ShardStream::restart(std::unique_lock<std::mutex>& lock, Key key) {
  while (restarting_) changed_.wait(lock);
  if (running_ && key_ == key) return;  // another worker started it
  restarting_ = true;
  stop_reader(lock);
  for (auto& [position, entry] : window_) {
    if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(entry.bytes));
  }
  window_.clear();
  emitted_ = 0;
  floor_ = 0;
  highest_ = 0;
  ended_ = false;
  errors_.clear();
  key_ = key;
  running_ = true;
  reader_ = std::thread(&ShardStream::run, this, generation_, key);
  restarting_ = false;
  changed_.notify_all();
}

int64_t ShardStream::fetch(uint64_t seed, uint64_t epoch, size_t position,
                           std::vector<uint8_t>& out) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Key key{seed, epoch};
  while (restarting_) changed_.wait(lock);
  if (!running_ || !(key_ == key)) {
    if (running_ && seed == key_.seed && epoch < key_.epoch) {
      throw std::runtime_error("tar_shards (streaming): position " + std::to_string(position) +
                               " of epoch " + std::to_string(epoch) + " asked for after epoch " +
                               std::to_string(key_.epoch) + " began");
    }
    restart(lock, key);
  }
  if (position >= positions_) {
    throw std::out_of_range("tar_shards (streaming): position " + std::to_string(position) +
                            " of " + std::to_string(positions_));
  }
  auto dropped = [&] {
    return std::runtime_error(
        "tar_shards (streaming): position " + std::to_string(position) + " of epoch " +
        std::to_string(epoch) + " was already dropped (the stream keeps the " +
        std::to_string(behind_) +
        " positions below the highest asked for; read a streaming source in order, with the "
        "sequential sampler and one loader at a time, and give ShardOptions::stream_window at "
        "least the loader's slots x batch_size)");
  };
  if (position < floor_) throw dropped();
  if (position > highest_) {
    highest_ = position;
    changed_.notify_all();
  }
  changed_.wait(lock, [&] {
    return stopping_ || restarting_ || !(key_ == key) || window_.count(position) != 0 ||
           position < floor_ || (ended_ && position >= emitted_);
  });
  const auto it = window_.find(position);
  if (it == window_.end() || !(key_ == key)) {
    if (stopping_ || restarting_ || !(key_ == key)) {
      throw std::runtime_error("tar_shards (streaming): the stream of epoch " +
                               std::to_string(epoch) + " was replaced while position " +
                               std::to_string(position) + " was awaited");
    }
    if (position < floor_) throw dropped();
    throw std::runtime_error(
        "tar_shards (streaming): the stream of epoch " + std::to_string(epoch) + " (rank " +
        std::to_string(options_.rank) + " of " + std::to_string(options_.world_size) +
        ") ended after " + std::to_string(emitted_) + " of " + std::to_string(positions_) +
        " samples, before position " + std::to_string(position) +
        (errors_.empty() ? std::string(": the shards hold fewer samples than that")
                         : ": " + errors_));
  }
  const Entry& entry = it->second;
  if (!entry.has_label) {
    throw std::runtime_error(entry.name + ": no .cls member beside it (the label)");
  }
  out.assign(entry.bytes.begin(), entry.bytes.end());
  return entry.label;
}

std::string ShardStream::describe(size_t position) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = window_.find(position);
  if (it != window_.end()) return it->second.name;
  return "stream position " + std::to_string(position) + " (rank " + std::to_string(options_.rank) +
         ")";
}

bool ShardStream::emit(uint64_t generation, Entry&& entry) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    return stopping_ || generation_ != generation || emitted_ <= highest_ + lookahead_;
  });
  if (stopping_ || generation_ != generation || emitted_ >= positions_) return false;
  window_.emplace(emitted_++, std::move(entry));
  while (!window_.empty() && window_.begin()->first + behind_ < highest_) {
    if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(window_.begin()->second.bytes));
    floor_ = window_.begin()->first + 1;
    window_.erase(window_.begin());
  }
  changed_.notify_all();
  return emitted_ < positions_;
}

void ShardStream::run(uint64_t generation, Key key) {
  const size_t capacity = options_.shuffle_buffer;
  std::vector<Entry> buffer;
  buffer.reserve(std::min<size_t>(capacity, 1 << 16));
  SampleRng draws(key.seed ^ 0x4255464645ull /* "BUFFE" */, key.epoch, options_.rank);
  bool stop = false;
  // As WebDataset's shuffle: output starts once `initial` samples are in; the buffer then grows
  // to `capacity`, two samples in for one out, and stays full, one in for one out.
  const size_t initial = std::min<size_t>(capacity, kInitialBuffer);
  size_t in_since_out = 0;
  const std::function<void(Entry &&)> push = [&](Entry&& entry) {
    if (capacity <= 1) {
      stop = !emit(generation, std::move(entry));
      return;
    }
    buffer.push_back(std::move(entry));
    ++in_since_out;
    if (buffer.size() < initial) return;
    if (buffer.size() < capacity && in_since_out < 2) return;
    in_since_out = 0;
    const size_t j = static_cast<size_t>(draws.next() % buffer.size());
    Entry out = std::move(buffer[j]);
    buffer[j] = std::move(buffer.back());
    buffer.pop_back();
    stop = !emit(generation, std::move(out));
  };
  std::string errors;
  try {
    std::unique_ptr<HttpClient> http;
    for (size_t shard :
         rank_shards(shards_.size(), key.seed, key.epoch, options_.rank, options_.world_size)) {
      if (stop) break;
      const StreamShard& s = shards_[shard];
      try {
        Archive a = new_tar_reader();
        std::unique_ptr<FileDescriptor> fd;
        RemoteTar remote;
        if (s.remote) {
          if (!http) http = std::make_unique<HttpClient>(options_);
          remote.client = http.get();
          remote.url = s.location;
          archive_read_set_read_callback(a.get(), &RemoteTar::read);
          archive_read_set_skip_callback(a.get(), &RemoteTar::skip);
          archive_read_set_callback_data(a.get(), &remote);
          if (archive_read_open1(a.get()) != ARCHIVE_OK) {
            throw std::runtime_error(s.location + ": " + archive_message(a.get()));
          }
        } else {
          fd = std::make_unique<FileDescriptor>(::open(s.location.c_str(), O_RDONLY | O_CLOEXEC));
          if (fd->get() < 0) {
            throw std::runtime_error("cannot open " + s.location + ": " + std::strerror(errno));
          }
          if (archive_read_open_fd(a.get(), fd->get(), 1 << 20) != ARCHIVE_OK) {
            throw std::runtime_error(s.location + ": " + archive_message(a.get()));
          }
        }
        Entry pending;
        std::string pending_key, key_text, extension;
        bool pending_image = false;
        auto flush = [&] {
          if (pending_image) push(std::move(pending));
          pending = Entry{};
          pending_image = false;
        };
        archive_entry* member = nullptr;
        while (!stop) {
          const int r = archive_read_next_header(a.get(), &member);
          if (r == ARCHIVE_EOF) break;
          if (r < ARCHIVE_WARN)
            throw std::runtime_error(s.location + ": " + archive_message(a.get()));
          const char* name = archive_entry_pathname(member);
          if (archive_entry_filetype(member) != AE_IFREG || name == nullptr) {
            archive_read_data_skip(a.get());
            continue;
          }
          split_member(name, key_text, extension);
          if (key_text != pending_key) {
            flush();
            pending_key = key_text;
          }
          const std::string what = s.location + " (member " + name + ")";
          if (is_image(extension) && !pending_image) {
            const int64_t size = archive_entry_size(member);
            if (size <= 0 || size > kMaxMemberBytes) {
              throw std::runtime_error(what + ": " + std::to_string(size) +
                                       " bytes, not a JPEG this loader reads");
            }
            {
              std::lock_guard<std::mutex> lock(mutex_);
              if (!spare_.empty()) {
                pending.bytes = std::move(spare_.back());
                spare_.pop_back();
              }
            }
            read_member(a.get(), size, what, pending.bytes);
            pending.name = what;
            pending_image = true;
          } else if (extension == "cls") {
            const int64_t size = archive_entry_size(member);
            std::vector<uint8_t> text;
            if (size < 0 || size > 64) throw std::runtime_error(what + ": not a label");
            read_member(a.get(), size, what, text);
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
            pending.label = label;
            pending.has_label = true;
          } else {
            archive_read_data_skip(a.get());
          }
        }
        if (!stop) flush();
      } catch (const std::exception& e) {
        // The samples the shard still held are lost; the stream goes on with the next shard.
        errors += (errors.empty() ? "" : "; ") + std::string(e.what());
      }
    }
    while (!stop && !buffer.empty()) {
      const size_t j = static_cast<size_t>(draws.next() % buffer.size());
      Entry out = std::move(buffer[j]);
      buffer[j] = std::move(buffer.back());
      buffer.pop_back();
      stop = !emit(generation, std::move(out));
    }
  } catch (const std::exception& e) {
    errors += (errors.empty() ? "" : "; ") + std::string(e.what());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (generation_ == generation) {
    ended_ = true;
    errors_ = std::move(errors);
    changed_.notify_all();
  }
}

}  // namespace detail
}  // namespace conveyor
