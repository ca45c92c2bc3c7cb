// The shard index (index.h), read and written through nlohmann/json.
#include "shards/index.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "shards/names.h"

namespace conveyor::detail {

namespace {

using Json = nlohmann::ordered_json;  // keys written in the order the format shows

constexpr const char* kFormat = "conveyor-wds-index";
constexpr int kVersion = 1;
constexpr size_t kMaxIndexBytes = size_t{1} << 30;  // an index larger is refused

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error("tar_shards: index " + where + ": " + what);
}

// The member `key` of `object`, of the type `wanted` asks: a string, or an integer that is not
// negative unless `negative_ok`.
const Json& member(const Json& object, const char* key, const std::string& where,
                   const char* context) {
  const auto it = object.find(key);
  if (it == object.end()) fail(where, std::string(context) + " without \"" + key + "\"");
  return *it;
}

std::string string_of(const Json& object, const char* key, const std::string& where,
                      const char* context) {
  const Json& v = member(object, key, where, context);
  if (!v.is_string()) fail(where, std::string(context) + "'s \"" + key + "\" is not a string");
  return v.get<std::string>();
}

int64_t integer_of(const Json& object, const char* key, const std::string& where,
                   const char* context, bool negative_ok = false) {
  const Json& v = member(object, key, where, context);
  if (!v.is_number_integer()) {
    fail(where, std::string(context) + "'s \"" + key + "\" is not an integer");
  }
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
    fail(where, std::string(context) + "'s \"" + key + "\" is out of range");
  }
  const auto n = v.get<int64_t>();
  if (n < 0 && !negative_ok) fail(where, std::string(context) + "'s \"" + key + "\" is negative");
  return n;
}

const Json& array_of(const Json& object, const char* key, const std::string& where) {
  const Json& v = member(object, key, where, "the index");
  if (!v.is_array()) fail(where, std::string("\"") + key + "\" is not an array");
  return v;
}

}  // namespace

const IndexedShard* ShardIndex::find(const std::string& file) const {
  const auto it = by_file.find(file);
  return it == by_file.end() ? nullptr : &shards[it->second];
}

ShardIndex parse_index(const std::string& text, const std::string& where) {
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::parse_error& e) {
    fail(where, std::string("not JSON: ") + e.what());
  }
  if (!doc.is_object()) fail(where, "not a JSON object");
  if (!doc.contains("format") || doc["format"] != kFormat) {
    fail(where, std::string("no \"format\": \"") + kFormat + "\"");
  }
  if (integer_of(doc, "version", where, "the index", true) != kVersion) {
    fail(where, "unsupported version (this reader knows " + std::to_string(kVersion) + ")");
  }
  ShardIndex index;
  if (doc.contains("classes")) {
    for (const Json& c : array_of(doc, "classes", where)) {
      if (!c.is_string()) fail(where, "a class name that is not a string");
      index.classes.push_back(c.get<std::string>());
    }
  }
  std::map<std::string, size_t>& position = index.by_file;
  for (const Json& s : array_of(doc, "shards", where)) {
    if (!s.is_object()) fail(where, "a shard that is not an object");
    IndexedShard shard;
    shard.file = string_of(s, "file", where, "a shard");
    shard.bytes = static_cast<uint64_t>(integer_of(s, "bytes", where, "a shard"));
    if (shard.file.empty()) fail(where, "a shard with an empty \"file\"");
    if (!position.emplace(shard.file, index.shards.size()).second) {
      fail(where, "shard " + shard.file + " is listed twice");
    }
    index.shards.push_back(std::move(shard));
  }
  for (const Json& s : array_of(doc, "samples", where)) {
    if (!s.is_object()) fail(where, "a sample that is not an object");
    const std::string shard = string_of(s, "shard", where, "a sample");
    IndexedSample sample;
    sample.key = string_of(s, "key", where, "a sample");
    sample.offset = static_cast<uint64_t>(integer_of(s, "offset", where, "a sample"));
    sample.size = static_cast<uint64_t>(integer_of(s, "size", where, "a sample"));
    sample.label = integer_of(s, "label", where, "a sample", true);
    const auto found = position.find(shard);
    if (found == position.end()) {
      throw std::runtime_error("tar_shards: index " + where + ": samples in " + shard +
                               ", which its \"shards\" does not list");
    }
    index.shards[found->second].samples.push_back(std::move(sample));
  }
  return index;
}

std::string write_index(const ShardIndex& index) {
  Json shards = Json::array();
  Json samples = Json::array();
  for (const IndexedShard& shard : index.shards) {
    shards.push_back(
        {{"file", shard.file}, {"bytes", shard.bytes}, {"samples", shard.samples.size()}});
    for (const IndexedSample& s : shard.samples) {
      samples.push_back({{"shard", shard.file},
                         {"key", s.key},
                         {"offset", s.offset},
                         {"size", s.size},
                         {"label", s.label}});
    }
  }
  const Json doc = {{"format", kFormat},
                    {"version", kVersion},
                    {"classes", index.classes},
                    {"shards", std::move(shards)},
                    {"samples", std::move(samples)}};
  return doc.dump() + "\n";
}

bool load_index(StorageReader& reader, const ShardLocation& where, const std::string& shard,
                bool lenient, ShardIndex& index, std::string& why) {
  const std::string location = where.name();
  std::vector<uint8_t> bytes;
  try {
    if (!reader.read_whole(where, kMaxIndexBytes, bytes)) return false;
  } catch (const std::exception& e) {
    if (lenient) {
      why = e.what();
      return false;
    }
    throw std::runtime_error("tar_shards: " + shard + ": cannot read its index: " + e.what());
  }
  const std::string text(bytes.begin(), bytes.end());
  if (!lenient) {
    index = parse_index(text, location);
    return true;
  }
  try {
    index = parse_index(text, location);
  } catch (const std::exception& e) {
    why = location + " wrote no index: " + e.what();
    return false;
  }
  return true;
}

std::vector<std::string> shard_classes(const std::vector<ShardLocation>& shards,
                                       const ShardOptions& options) {
  if (shards.empty()) return {};
  const ShardLocation& first = shards.front();
  if (options.index.empty() && !has_index_name(first)) return {};
  const std::shared_ptr<const Storage> storage =
      options.storage ? options.storage : system_storage();
  const std::unique_ptr<StorageReader> reader = storage->reader(options);
  ShardIndex index;
  std::string why;
  const ShardLocation where =
      options.index.empty() ? index_location_for(first) : parse_shard_location(options.index);
  const bool lenient = options.index.empty() && first.kind == ShardLocation::Kind::kPipe;
  if (!load_index(*reader, where, first.name(), lenient, index, why)) return {};
  return index.classes;
}

}  // namespace conveyor::detail
