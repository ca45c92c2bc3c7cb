// The shard index (index.h), read and written through nlohmann/json.
#include "shards/index.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "conveyor/internal/printable.h"
#include "shards/names.h"

namespace conveyor::detail {

namespace {

using Json = nlohmann::ordered_json;  // keys written in the order the format shows

constexpr const char* kFormat = "conveyor-wds-index";
constexpr int kVersion = 2;  // written; 1 and 2 are read

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

uint32_t ShardIndex::member_id(std::string_view name) const {
  const auto it = member_ids.find(name);
  return it == member_ids.end() ? kNoMember : it->second;
}

uint32_t ShardIndex::name_member(std::string_view name) {
  const auto [it, added] =
      member_ids.emplace(std::string(name), static_cast<uint32_t>(member_names.size()));
  if (added) member_names.emplace_back(name);
  return it->second;
}

void ShardIndex::add_sample(IndexedShard& shard, IndexedSample sample,
                            std::span<const IndexedMember> members) {
  sample.members_begin = shard.members.size();
  sample.members_count = static_cast<uint32_t>(members.size());
  sample.offset = 0;
  sample.size = 0;
  for (const IndexedMember& m : members) {
    if (is_image_extension(member_names.at(m.name))) {
      sample.offset = m.offset;
      sample.size = m.size;
      break;
    }
  }
  shard.members.insert(shard.members.end(), members.begin(), members.end());
  shard.samples.push_back(std::move(sample));
}

namespace {

// Reads the index's text through nlohmann's parser with a callback that bounds the nesting depth
// as each array or object opens (so that no deeper one is ever built), and takes each object of
// the root's "samples" array out of the document as soon as it is parsed: the samples, nearly all
// of an index, are held once, as IndexedSample, instead of as JSON objects too.
class IndexParser {
 public:
  explicit IndexParser(const std::string& where) : where_(where) {}

  // The document without its samples' objects (the root's "samples" array is left empty).
  Json parse(const std::string& text) {
    const Json::parser_callback_t callback = [this](int depth, Json::parse_event_t event,
                                                    Json& parsed) {
      return on_event(depth, event, parsed);
    };
    try {
      return Json::parse(text, callback);
    } catch (const Json::parse_error& e) {
      fail(where_, std::string("not JSON: ") + e.what());
    }
  }

  // The samples taken out, in the text's order, each with its shard's name. Their members are
  // in `members` (members_begin counts from there), named by ids into `member_names`; which
  // fields each gave is kept until the version is known (it may come after "samples").
  struct Sample {
    size_t shard = 0;  // into shard_names
    IndexedSample sample;
    bool has_members = false, has_offset = false, has_size = false;
  };
  std::vector<Sample> samples;
  std::vector<std::string> shard_names;  // the "shard" of the samples, each once
  std::vector<IndexedMember> members;
  ShardIndex* names = nullptr;  // where member names get their ids

 private:
  // Depths as nlohmann counts them: the root is 0, the "samples" array 1, a sample object 2.
  bool on_event(int depth, Json::parse_event_t event, Json& parsed) {
    using Event = Json::parse_event_t;
    const bool opens = event == Event::array_start || event == Event::object_start;
    if (opens && depth >= static_cast<int>(kMaxIndexDepth)) {
      fail(where_, "arrays and objects nested more than " + std::to_string(kMaxIndexDepth) +
                       " deep (an index has 3 levels)");
    }
    if (depth == 1 && event == Event::key) {
      samples_key_ = parsed == "samples";
      if (samples_key_ && samples_seen_) fail(where_, "\"samples\" is given twice");
      samples_seen_ = samples_seen_ || samples_key_;
    } else if (depth == 1 && event == Event::array_start) {
      in_samples_ = samples_key_;
    } else if (depth == 1 && event == Event::array_end) {
      in_samples_ = false;
    } else if (in_samples_ && depth == 2 && event != Event::object_end &&
               event != Event::object_start) {
      // A sample that is not an object: refused here, so that the array stays empty and the
      // parser's removal of each object taken out costs nothing.
      fail(where_, "a sample that is not an object");
    } else if (in_samples_ && depth == 2 && event == Event::object_end) {
      take_sample(parsed);
      return false;  // not kept in the document
    }
    return true;
  }

  void take_sample(const Json& s) {
    const std::string shard = string_of(s, "shard", where_, "a sample");
    Sample taken;
    IndexedSample& sample = taken.sample;
    sample.key = string_of(s, "key", where_, "a sample");
    if (s.contains("offset")) {
      taken.has_offset = true;
      sample.offset = static_cast<uint64_t>(integer_of(s, "offset", where_, "a sample"));
    }
    if (s.contains("size")) {
      taken.has_size = true;
      sample.size = static_cast<uint64_t>(integer_of(s, "size", where_, "a sample"));
    }
    sample.has_label = s.contains("label");
    if (sample.has_label) sample.label = integer_of(s, "label", where_, "a sample", true);
    if (s.contains("members")) {
      taken.has_members = true;
      take_members(s["members"], sample);
    }
    const auto [it, added] = shard_ids_.emplace(shard, shard_names.size());
    if (added) shard_names.push_back(shard);
    taken.shard = it->second;
    samples.push_back(std::move(taken));
  }

  // A sample's "members": [[NAME, OFFSET, SIZE], ...], checked against the bounds of index.h
  // (all but the shard's bytes, which parse_index checks once the shards are read).
  void take_members(const Json& list, IndexedSample& sample) {
    const std::string context = "sample " + printable(sample.key) + "'s";
    if (!list.is_array()) fail(where_, context + " \"members\" is not an array");
    if (list.size() > kMaxSampleMembers) {
      fail(where_, context + " \"members\" lists " + std::to_string(list.size()) +
                       " members (at most " + std::to_string(kMaxSampleMembers) + ")");
    }
    sample.members_begin = members.size();
    sample.members_count = static_cast<uint32_t>(list.size());
    for (const Json& m : list) {
      if (!m.is_array() || m.size() != 3 || !m[0].is_string()) {
        fail(where_, context + " member is not [NAME, OFFSET, SIZE]");
      }
      const std::string& name = m[0].get_ref<const std::string&>();
      check_member_name(name, context);
      const auto number = [&](const Json& v, const char* what) {
        if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
          fail(where_, context + " member " + printable(name) + "'s " + what +
                           " is not an integer in range");
        }
        if (v.get<int64_t>() < 0) {
          fail(where_, context + " member " + printable(name) + "'s " + what + " is negative");
        }
        return v.get<uint64_t>();
      };
      IndexedMember member{0, number(m[1], "offset"), number(m[2], "size")};
      if (member.size > kMaxMemberBytes) {
        fail(where_, context + " member " + printable(name) + " is " + std::to_string(member.size) +
                         " bytes (at most " + std::to_string(kMaxMemberBytes) + ")");
      }
      member.name = names->name_member(name);
      for (size_t i = sample.members_begin; i < members.size(); ++i) {
        if (members[i].name == member.name) {
          fail(where_, context + " member " + printable(name) + " is listed twice");
        }
      }
      members.push_back(member);
    }
  }

  // A member name: not empty, at most kMaxMemberPathBytes, no control bytes.
  void check_member_name(const std::string& name, const std::string& context) const {
    const bool control = std::any_of(name.begin(), name.end(), [](char c) {
      const auto b = static_cast<unsigned char>(c);
      return b < 0x20 || b == 0x7f;
    });
    if (name.empty() || name.size() > kMaxMemberPathBytes || control) {
      fail(where_, context + " member name '" + printable(name) +
                       "' is not one (empty, control bytes, or over " +
                       std::to_string(kMaxMemberPathBytes) + " bytes)");
    }
  }

  const std::string& where_;
  bool samples_key_ = false;   // the root's key being read is "samples"
  bool samples_seen_ = false;  // the root had a "samples" key
  bool in_samples_ = false;    // inside the root's "samples" array
  std::map<std::string, size_t> shard_ids_;
};

}  // namespace

ShardIndex parse_index(const std::string& text, const std::string& where) {
  ShardIndex index;
  IndexParser parser(where);
  parser.names = &index;
  Json doc = parser.parse(text);
  if (!doc.is_object()) fail(where, "not a JSON object");
  if (!doc.contains("format") || doc["format"] != kFormat) {
    fail(where, std::string("no \"format\": \"") + kFormat + "\"");
  }
  const int64_t version = integer_of(doc, "version", where, "the index", true);
  if (version != 1 && version != kVersion) {
    fail(where, "unsupported version (this reader knows 1 and " + std::to_string(kVersion) + ")");
  }
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
      fail(where, "shard " + printable(shard.file) + " is listed twice");
    }
    index.shards.push_back(std::move(shard));
  }
  (void)array_of(doc, "samples", where);  // its objects were taken out as they were parsed
  std::vector<IndexedShard*> shard_of;    // per name in parser.shard_names
  for (const std::string& name : parser.shard_names) {
    const auto found = position.find(name);
    if (found == position.end()) {
      fail(where, "samples in " + printable(name) + ", which its \"shards\" does not list");
    }
    shard_of.push_back(&index.shards[found->second]);
  }
  const uint32_t v1_image = version == 1 ? index.name_member("jpg") : ShardIndex::kNoMember;
  std::vector<IndexedMember> members;
  for (IndexParser::Sample& s : parser.samples) {
    IndexedShard& shard = *shard_of[s.shard];
    IndexedSample& sample = s.sample;
    const std::string context = "sample " + printable(sample.key);
    members.clear();
    if (version == 1) {  // its one member, the image, and its label
      for (const char* field : {"offset", "size", "label"}) {
        const bool given = field[0] == 'o'   ? s.has_offset
                           : field[0] == 's' ? s.has_size
                                             : sample.has_label;
        if (!given) fail(where, std::string("a sample without \"") + field + "\"");
      }
      members.push_back({v1_image, sample.offset, sample.size});
    } else {
      if (!s.has_members) fail(where, context + " without \"members\" (version 2)");
      const auto first = parser.members.begin() + static_cast<ptrdiff_t>(sample.members_begin);
      members.assign(first, first + sample.members_count);
    }
    for (const IndexedMember& m : members) {
      if (m.offset > shard.bytes || m.size > shard.bytes - m.offset) {
        fail(where, context + "'s member " + printable(index.member_names[m.name]) + " (bytes " +
                        std::to_string(m.offset) + " + " + std::to_string(m.size) +
                        ") lies outside shard " + printable(shard.file) + " (" +
                        std::to_string(shard.bytes) + " bytes)");
      }
    }
    const uint64_t offset = sample.offset, size = sample.size;
    index.add_sample(shard, std::move(sample), members);
    const IndexedSample& added = shard.samples.back();
    if ((s.has_offset && added.offset != offset) || (s.has_size && added.size != size)) {
      fail(where, context + "'s \"offset\" and \"size\" are not those of its image member");
    }
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
      Json members = Json::array();
      bool image = false;
      for (const IndexedMember& m : shard.members_of(s)) {
        const std::string& name = index.member_names.at(m.name);
        image = image || is_image_extension(name);
        members.push_back(Json::array({name, m.offset, m.size}));
      }
      Json sample = {{"shard", shard.file}, {"key", s.key}, {"members", std::move(members)}};
      if (image) {
        sample["offset"] = s.offset;
        sample["size"] = s.size;
      }
      if (s.has_label) sample["label"] = s.label;
      samples.push_back(std::move(sample));
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
  std::vector<uint8_t>().swap(bytes);  // the text is held once while it is parsed
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
