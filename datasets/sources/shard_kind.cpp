// ImageSource::tar_shards: WebDataset tar shards on local disk, over HTTP(S) or from a command.
// With an index for every shard (shards/index.h) they are read at random, one ranged read per
// sample (the shard kind, here); otherwise, or when asked, streamed (sources/shard_stream.h).
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/internal/printable.h"
#include "shards/index.h"
#include "shards/names.h"
#include "shards/tar_reader.h"
#include "sources/sample_kind.h"
#include "sources/shard_stream.h"
#include "storage/http.h"

namespace conveyor {

namespace {

using Where = ShardLocation::Kind;

// Where one member of a sample lies in its shard.
struct MemberRange {
  uint32_t name = 0;  // into ShardKind's names
  uint64_t offset = 0;
  uint64_t size = 0;
};

// One sample: its shard, its members (ShardKind's ranges [first, first + count)) and its label.
struct IndexedEntry {
  uint32_t shard = 0;  // into ShardKind's files
  size_t first = 0;
  uint32_t count = 0;
  bool has_label = false;
  int64_t label = 0;
};

// Shards read at random by their indexes: each sample is one ranged read of the span of the
// members its fields use (members of a sample lie together in a tar), through the worker's own
// StorageReader (its HTTP connections and read-ahead). The files are opened once and shared.
// Under SampleRule::kImages (ImageSource) the members are the image (as "jpg": the index's first
// jpg, jpeg, png or webp, is_image_extension) and the index's label ("cls"); under kMembers those
// want() names.
class ShardKind final : public ImageSource::Kind {
 public:
  ShardKind(std::vector<ImageItem> items, std::vector<std::string> classes,
            std::shared_ptr<const Storage> storage, ShardOptions options,
            std::vector<std::shared_ptr<const StorageFile>> files,
            std::vector<IndexedEntry> entries, std::vector<MemberRange> ranges,
            std::vector<std::string> names, detail::SampleRule rule, bool remote)
      : Kind(std::move(items), std::move(classes)),
        storage_(std::move(storage)),
        options_(std::move(options)),
        files_(std::move(files)),
        entries_(std::move(entries)),
        ranges_(std::move(ranges)),
        names_(std::move(names)),
        rule_(rule),
        remote_(remote) {
    wanted_.assign(names_.size(), rule_ == detail::SampleRule::kImages);
  }

  void want(const Fields& fields) override {
    if (rule_ == detail::SampleRule::kImages) return;
    for (const auto& [name, field] : fields) {
      for (const std::string& key : field.key_list()) {
        for (size_t n = 0; n < names_.size(); ++n) {
          if (names_[n] == key) wanted_[n] = true;
        }
      }
    }
  }

  void prepare(size_t workers) override {
    while (workers_.size() < workers) workers_.push_back({storage_->reader(options_), {}});
  }

  void read(const SampleContext& ctx, detail::SampleMembers& out) override {
    const IndexedEntry& e = entries_.at(ctx.index);
    const FileRange span = span_of(e);
    out.members.clear();
    if (span.size > 0) {
      read_range(*workers_.at(ctx.worker).reader, *span.file, span.offset, span.size, out.buffer);
    }
    if (rule_ == detail::SampleRule::kImages) {
      const MemberRange& image = ranges_[e.first];
      detail::image_members(out, out.buffer.data(), static_cast<size_t>(image.size), e.label);
      if (!e.has_label) out.members.pop_back();  // the label field names what is missing
      return;
    }
    for (size_t m = e.first; m < e.first + e.count; ++m) {
      const MemberRange& r = ranges_[m];
      if (!wanted_[r.name]) continue;
      out.members.push_back({names_[r.name], detail::MemberEncoding::kFile,
                             out.buffer.data() + (r.offset - span.offset),
                             static_cast<size_t>(r.size), 0});
    }
  }

  void will_read(size_t worker, const size_t* indices, size_t count) override {
    if (!remote_) return;  // local reads are not started ahead
    Worker& w = workers_.at(worker);
    w.upcoming.clear();
    for (size_t i = 0; i < count; ++i) {
      const FileRange span = span_of(entries_.at(indices[i]));
      if (span.size > 0) w.upcoming.push_back(span);
    }
    w.reader->will_read(w.upcoming.data(), w.upcoming.size());
  }

 private:
  struct Worker {
    std::unique_ptr<StorageReader> reader;
    std::vector<FileRange> upcoming;  // will_read's ranges, reused
  };

  // The bytes of `e`'s wanted members, from the first one's start to the last one's end.
  FileRange span_of(const IndexedEntry& e) const {
    uint64_t begin = UINT64_MAX;
    uint64_t end = 0;
    for (size_t m = e.first; m < e.first + e.count; ++m) {
      const MemberRange& r = ranges_[m];
      if (!wanted_[r.name]) continue;
      begin = std::min(begin, r.offset);
      end = std::max(end, r.offset + r.size);
    }
    if (begin == UINT64_MAX) return {files_[e.shard].get(), 0, 0};
    return {files_[e.shard].get(), begin, end - begin};
  }

  std::shared_ptr<const Storage> storage_;
  ShardOptions options_;
  std::vector<std::shared_ptr<const StorageFile>> files_;  // per shard
  std::vector<IndexedEntry> entries_;                      // per sample
  std::vector<MemberRange> ranges_;                        // the samples' members
  std::vector<std::string> names_;                         // member names
  std::vector<bool> wanted_;                               // per name: some field reads it
  detail::SampleRule rule_;
  bool remote_;  // some shard is read over HTTP
  std::vector<Worker> workers_;
};

// The first line of `text`.
std::string one_line_of(const std::string& text) { return text.substr(0, text.find('\n')); }

// Each shard's index, where there is one.
struct Indexes {
  std::map<std::string, std::unique_ptr<detail::ShardIndex>> by_location;  // null: none there
  std::vector<const detail::ShardIndex*> of;  // per shard; null: streamed
  std::vector<std::string> location;          // per shard: where its index is
  std::string no_index;  // why a command beside pipe: shards gave none, for an error
  std::vector<std::string> classes;
};

Indexes load_indexes(const std::vector<ShardLocation>& shards, const ShardOptions& options,
                     StorageReader& reader) {
  Indexes x;
  x.of.assign(shards.size(), nullptr);
  x.location.resize(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardLocation& shard = shards[i];
    if (options.index.empty() && !detail::has_index_name(shard)) continue;  // streamed
    const ShardLocation where = options.index.empty() ? detail::index_location_for(shard)
                                                      : parse_shard_location(options.index);
    x.location[i] = where.name();
    auto found = x.by_location.find(x.location[i]);
    if (found == x.by_location.end()) {
      auto index = std::make_unique<detail::ShardIndex>();
      const bool lenient = options.index.empty() && shard.kind == Where::kPipe;
      std::string why;
      if (!detail::load_index(reader, where, shard.name(), lenient, *index, why)) {
        if (!options.index.empty()) {
          throw std::runtime_error("tar_shards: no index at " + options.index +
                                   " (ShardOptions::index)");
        }
        if (x.no_index.empty()) x.no_index = why;
        index.reset();
      }
      found = x.by_location.emplace(x.location[i], std::move(index)).first;
    }
    x.of[i] = found->second.get();
  }
  const std::vector<std::string>* classes = nullptr;
  for (size_t i = 0; i < shards.size(); ++i) {
    const detail::ShardIndex* index = x.of[i];
    if (index == nullptr) continue;
    const std::string where = shards[i].name();
    if (classes == nullptr) {
      classes = &index->classes;
    } else if (*classes != index->classes) {
      throw std::invalid_argument("tar_shards: " + where + ": its index " + x.location[i] +
                                  " names other classes than the first indexed shard's");
    }
    if (index->find(detail::file_name_of(shards[i])) == nullptr) {
      throw std::runtime_error("tar_shards: " + where + " is not listed in its index " +
                               x.location[i]);
    }
  }
  if (classes != nullptr) x.classes = *classes;
  return x;
}

std::unique_ptr<ImageSource::Kind> streaming_kind(const std::vector<ShardLocation>& shards,
                                                  const ShardOptions& options,
                                                  const Storage& storage, StorageReader& reader,
                                                  Indexes& indexes, detail::SampleRule rule) {
  std::vector<detail::StreamShard> stream_shards;
  std::vector<size_t> counts;
  bool counts_known = true;
  for (size_t i = 0; i < shards.size(); ++i) {
    detail::StreamShard s{shards[i], 0};
    if (indexes.of[i] != nullptr) {
      s.samples = indexes.of[i]->find(detail::file_name_of(shards[i]))->samples.size();
    } else if (shards[i].kind == Where::kLocal) {
      s.samples = detail::count_tar_samples(storage, reader, shards[i].location, rule);
    } else {
      counts_known = false;
    }
    counts.push_back(s.samples);
    stream_shards.push_back(std::move(s));
  }
  if (shards.size() < options.world_size) {
    throw std::invalid_argument("tar_shards (streaming): " + std::to_string(shards.size()) +
                                " shards cannot be split over " +
                                std::to_string(options.world_size) + " ranks");
  }
  size_t positions = options.epoch_samples;
  if (positions == 0) {
    if (!counts_known) {
      throw std::invalid_argument(
          "tar_shards (streaming): remote or pipe: shards without an index: give "
          "ShardOptions::epoch_samples (samples per rank per epoch), or write an index "
          "(conveyor-prepare)" +
          (indexes.no_index.empty() ? std::string() : " (" + one_line_of(indexes.no_index) + ")"));
    }
    positions = detail::ShardStream::equal_positions(counts, options.world_size);
  }
  if (positions == 0) throw std::runtime_error("tar_shards: the shards hold no samples");
  return detail::stream_kind(
      std::make_shared<detail::ShardStream>(std::move(stream_shards), options, positions, rule),
      std::move(indexes.classes));
}

// A server that ignores Range would fail every sample: said once, here, with what works. One
// request of one byte, to the first remote shard's server, without retries; any other failure is
// left to the reads, which report it.
void check_range_support(const Storage& storage, const ShardOptions& options,
                         const std::vector<std::shared_ptr<const StorageFile>>& files,
                         const std::vector<ShardLocation>& shards) {
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].kind != Where::kHttp) continue;
    RemoteOptions once = options;
    once.retries = 0;
    uint8_t byte = 0;
    try {
      storage.reader(once)->read_at(*files[i], 0, 1, &byte);
    } catch (const detail::RangeIgnored&) {
      throw std::runtime_error(
          "tar_shards: " + shards[i].location +
          ": the server ignored a Range request (HTTP 200 with the whole resource). Random "
          "access reads each sample with a Range request; streaming reads each shard with one "
          "plain GET and works with this server: set ShardOptions::streaming "
          "(conveyor-bench --streaming)");
    } catch (const std::exception&) {
    }
    return;
  }
}

std::unique_ptr<ImageSource::Kind> random_access_kind(const std::vector<ShardLocation>& shards,
                                                      const ShardOptions& options,
                                                      std::shared_ptr<const Storage> storage,
                                                      Indexes& indexes, detail::SampleRule rule) {
  std::vector<std::shared_ptr<const StorageFile>> files;
  std::vector<IndexedEntry> entries;
  std::vector<MemberRange> ranges;
  std::vector<std::string> names;
  std::map<std::string, uint32_t, std::less<>> name_ids;
  const auto name_id = [&](const std::string& name) {
    const auto [it, added] = name_ids.emplace(name, static_cast<uint32_t>(names.size()));
    if (added) names.push_back(name);
    return it->second;
  };
  std::vector<ImageItem> items;
  bool remote = false;
  if (shards.size() >= std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument("tar_shards: too many shards");
  }
  const bool images = rule == detail::SampleRule::kImages;
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardLocation& shard = shards[i];
    const std::string& where = shard.location;
    const detail::ShardIndex& index = *indexes.of[i];
    const detail::IndexedShard& indexed = *index.find(detail::file_name_of(shard));
    std::shared_ptr<const StorageFile> file;
    try {
      file = storage->open_file(shard);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("tar_shards: cannot open shard ") + e.what());
    }
    // Shorter than the index says: truncated, and only the members it cuts fail, when read.
    // Longer: rewritten, and the offsets cannot be trusted.
    if (file->size() != StorageFile::kUnknownSize && file->size() > indexed.bytes) {
      throw std::runtime_error("tar_shards: shard " + where + " is " +
                               std::to_string(file->size()) + " bytes but its index " +
                               indexes.location[i] + " says " + std::to_string(indexed.bytes) +
                               " (rewritten since the index was written?)");
    }
    remote = remote || shard.kind == Where::kHttp;
    for (const detail::IndexedSample& s : indexed.samples) {
      const std::string key = detail::printable(s.key);
      IndexedEntry e;
      e.shard = static_cast<uint32_t>(i);
      e.first = ranges.size();
      e.has_label = s.has_label;
      e.label = s.label;
      if (images) {
        // A key without an image is not an image source's sample (as when streamed).
        const auto members = indexed.members_of(s);
        if (std::none_of(members.begin(), members.end(), [&](const detail::IndexedMember& m) {
              return detail::is_image_extension(index.member_names[m.name]);
            })) {
          continue;
        }
        if (s.size > kMaxImageBytes) {
          throw std::runtime_error("tar_shards: index " + indexes.location[i] + ": sample " + key +
                                   "'s image is " + std::to_string(s.size) +
                                   " bytes, more than any image this loader reads");
        }
        if (s.size == 0 || s.offset > indexed.bytes || s.size > indexed.bytes - s.offset) {
          throw std::runtime_error("tar_shards: index " + indexes.location[i] + ": sample " + key +
                                   "'s image lies outside shard " + where);
        }
        ranges.push_back({name_id("jpg"), s.offset, s.size});
        e.count = 1;
        items.push_back({where + " (member " + key + ".jpg)", s.label});
      } else {
        // parse_index checked each member: within the shard's bytes, under the bounds.
        for (const detail::IndexedMember& m : indexed.members_of(s)) {
          ranges.push_back({name_id(index.member_names[m.name]), m.offset, m.size});
          ++e.count;
        }
        items.push_back({where + " (sample " + key + ")", s.label});
      }
      entries.push_back(e);
    }
    files.push_back(std::move(file));
  }
  if (items.empty()) throw std::runtime_error("tar_shards: the shards hold no samples");
  check_range_support(*storage, options, files, shards);
  return std::make_unique<ShardKind>(
      std::move(items), std::move(indexes.classes), std::move(storage), options, std::move(files),
      std::move(entries), std::move(ranges), std::move(names), rule, remote);
}

}  // namespace

std::unique_ptr<ImageSource> ImageSource::tar_shards(const std::vector<std::string>& patterns,
                                                     ImageTransform transform,
                                                     const ShardOptions& options) {
  return tar_shards(expand_shard_locations(patterns), std::move(transform), options);
}

std::unique_ptr<ImageSource> ImageSource::tar_shards(std::initializer_list<std::string> patterns,
                                                     ImageTransform transform,
                                                     const ShardOptions& options) {
  return tar_shards(std::vector<std::string>(patterns), std::move(transform), options);
}

namespace {

// The kind of `locations`: streamed, or read at random by their indexes (see tar_shards).
std::unique_ptr<FieldSource::Kind> shard_kind(const std::vector<ShardLocation>& locations,
                                              const ShardOptions& options,
                                              detail::SampleRule rule) {
  if (options.retries < 0) throw std::invalid_argument("tar_shards: retries must be >= 0");
  if (options.world_size == 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("tar_shards: rank " + std::to_string(options.rank) +
                                " is not in [0, " + std::to_string(options.world_size) + ")");
  }
  if (locations.empty()) throw std::invalid_argument("tar_shards: no shards given");
  const std::shared_ptr<const Storage> storage =
      options.storage ? options.storage : system_storage();
  const std::unique_ptr<StorageReader> reader = storage->reader(options);
  Indexes indexes = load_indexes(locations, options, *reader);
  // A command's output can only be streamed.
  const bool pipes = std::any_of(locations.begin(), locations.end(),
                                 [](const ShardLocation& s) { return s.kind == Where::kPipe; });
  const bool streaming =
      options.streaming || pipes ||
      std::find(indexes.of.begin(), indexes.of.end(), nullptr) != indexes.of.end();
  return streaming ? streaming_kind(locations, options, *storage, *reader, indexes, rule)
                   : random_access_kind(locations, options, storage, indexes, rule);
}

}  // namespace

std::unique_ptr<ImageSource> ImageSource::tar_shards(const std::vector<ShardLocation>& locations,
                                                     ImageTransform transform,
                                                     const ShardOptions& options) {
  return std::unique_ptr<ImageSource>(
      new ImageSource(shard_kind(locations, options, detail::SampleRule::kImages), transform));
}

std::unique_ptr<FieldSource> FieldSource::tar_shards(const std::vector<std::string>& patterns,
                                                     Fields fields, const ShardOptions& options) {
  return tar_shards(expand_shard_locations(patterns), std::move(fields), options);
}

std::unique_ptr<FieldSource> FieldSource::tar_shards(const std::vector<ShardLocation>& locations,
                                                     Fields fields, const ShardOptions& options) {
  return std::unique_ptr<FieldSource>(new FieldSource(
      shard_kind(locations, options, detail::SampleRule::kMembers), std::move(fields)));
}

}  // namespace conveyor
