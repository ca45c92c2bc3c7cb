// ShardStream: streaming mode of ImageSource::tar_shards (shard_stream.h): the reader thread,
// the shuffle buffer and the window of positions; and the stream kind of ImageSource.
#include "sources/shard_stream.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>

#include "conveyor/random.h"

namespace conveyor {
namespace detail {

namespace {

constexpr size_t kSpareBuffers = 64;
constexpr size_t kInitialBuffer = 100;  // samples in the shuffle buffer before the first comes out
constexpr size_t kMessageLine = 600;    // a failed shard's line in an error, at most

// `text` on one line: line breaks become " | ", and it is cut at kMessageLine characters.
std::string one_line(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < kMessageLine; ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      if (!out.empty() && out.compare(out.size() - std::min<size_t>(3, out.size()), 3, " | ") != 0)
        out += " | ";
    } else {
      out += text[i];
    }
  }
  if (out.size() >= kMessageLine) out += "...";
  return out;
}

}  // namespace

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

ShardStream::ShardStream(std::vector<StreamShard> shards, ShardOptions options, size_t positions,
                         SampleRule rule)
    : shards_(std::move(shards)),
      options_(std::move(options)),
      storage_(options_.storage ? options_.storage : system_storage()),
      positions_(positions),
      lookahead_(std::max<size_t>(1, options_.stream_lookahead)),
      behind_(std::max<size_t>(1, options_.stream_window)),
      rule_(rule) {}

ShardStream::~ShardStream() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  stop_reader(lock);
}

void ShardStream::stop_reader(std::unique_lock<std::mutex>& lock) {
  ++generation_;
  changed_.notify_all();
  std::thread old = std::move(reader_);
  const std::unique_ptr<StreamCancel> cancel = std::move(cancel_);  // destroyed after the join
  if (cancel) cancel->cancel();  // wakes a read or a backoff at once
  lock.unlock();
  if (old.joinable()) old.join();
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
    if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(bytes_of(entry)));
  }
  window_.clear();
  emitted_ = 0;
  floor_ = 0;
  highest_ = 0;
  ended_ = false;
  errors_.clear();
  key_ = key;
  running_ = true;
  cancel_ = std::make_unique<StreamCancel>();
  reader_ = std::thread(&ShardStream::run, this, generation_, key, cancel_.get());
  restarting_ = false;
  changed_.notify_all();
}

namespace {

// Every member of a stream's sample (SampleRule::kMembers), copied into `out`: names and bytes.
void tar_members(const TarSample& entry, SampleMembers& out) {
  out.names.clear();
  for (const TarMember& m : entry.members) out.names += m.extension;
  out.buffer.assign(entry.data.begin(), entry.data.end());
  out.members.clear();
  size_t at = 0;
  for (const TarMember& m : entry.members) {
    const std::string_view name(out.names.data() + at, m.extension.size());
    at += m.extension.size();
    out.members.push_back({name, MemberEncoding::kFile, out.buffer.data() + m.data_begin,
                           static_cast<size_t>(m.size), 0});
  }
}

}  // namespace

void ShardStream::fetch(uint64_t seed, uint64_t epoch, size_t position, SampleMembers& out) {
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
  if (!entry.error.empty()) throw std::runtime_error(entry.name + ": " + entry.error);
  if (rule_ == SampleRule::kMembers) {
    tar_members(entry, out);
    return;
  }
  if (!entry.has_label) {
    throw std::runtime_error(entry.name + ": no .cls member beside it (the label)");
  }
  out.buffer.assign(entry.bytes.begin(), entry.bytes.end());
  image_members(out, out.buffer.data(), out.buffer.size(), entry.label);
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
    if (spare_.size() < kSpareBuffers)
      spare_.push_back(std::move(bytes_of(window_.begin()->second)));
    floor_ = window_.begin()->first + 1;
    window_.erase(window_.begin());
  }
  changed_.notify_all();
  return emitted_ < positions_;
}

namespace {

// "N of M shards failed:" and a line for each of the first three, then how many more.
std::string failed_shards_text(const std::vector<std::string>& failures, size_t shards) {
  if (failures.empty()) return {};
  constexpr size_t kShown = 3;
  std::string text = std::to_string(failures.size()) + " of " + std::to_string(shards) +
                     (shards == 1 ? " shard" : " shards") + " failed:";
  for (size_t i = 0; i < std::min(kShown, failures.size()); ++i) text += "\n  " + failures[i];
  if (failures.size() > kShown) {
    text += "\n  and " + std::to_string(failures.size() - kShown) + " more";
  }
  return text;
}

}  // namespace

void ShardStream::run(uint64_t generation, Key key, const StreamCancel* cancel) {
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
  std::vector<std::string> failures;  // one line per failed shard
  size_t shards_read = 0;
  try {
    // Kept across shards: an HTTP connection is reused.
    const std::unique_ptr<StorageReader> reader = storage_->reader(options_);
    for (size_t shard :
         rank_shards(shards_.size(), key.seed, key.epoch, options_.rank, options_.world_size)) {
      if (stop) break;
      ++shards_read;
      try {
        TarSampleReader samples(shards_[shard].where, *reader, options_, *cancel, rule_);
        while (!stop) {
          Entry entry;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!spare_.empty()) {
              bytes_of(entry) = std::move(spare_.back());
              spare_.pop_back();
            }
          }
          if (!samples.next(entry)) break;
          push(std::move(entry));
        }
      } catch (const StreamCancelled&) {
        stop = true;
      } catch (const std::exception& e) {
        // The samples the shard still held are lost; the stream goes on with the next shard.
        failures.push_back(one_line(e.what()));
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
    failures.push_back(one_line(e.what()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (generation_ == generation) {
    ended_ = true;
    errors_ = failed_shards_text(failures, shards_read);
    changed_.notify_all();
  }
}

namespace {

class StreamKind final : public ImageSource::Kind {
 public:
  StreamKind(std::shared_ptr<ShardStream> stream, std::vector<std::string> classes)
      : Kind({}, std::move(classes)), stream_(std::move(stream)) {}
  size_t size() const override { return stream_->positions(); }
  // A new loader reads its epochs from their beginning.
  void prepare(size_t) override { stream_->reset(); }
  void read(const SampleContext& ctx, detail::SampleMembers& out) override {
    stream_->fetch(ctx.seed, ctx.epoch, ctx.index, out);
  }
  std::string describe(size_t index) const override { return stream_->describe(index); }

 private:
  std::shared_ptr<ShardStream> stream_;
};

}  // namespace

std::unique_ptr<ImageSource::Kind> stream_kind(std::shared_ptr<ShardStream> stream,
                                               std::vector<std::string> classes) {
  return std::make_unique<StreamKind>(std::move(stream), std::move(classes));
}

}  // namespace detail
}  // namespace conveyor
