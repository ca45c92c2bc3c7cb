// ImageSource::tar_shards: WebDataset tar shards on local disk or over HTTP(S), read at random
// through the index that conveyor-prepare writes beside them (PREFIX.index.json): one pread() or
// one HTTP Range request per sample.
#include "shards.h"

#include "http.h"
#include "shard_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace conveyor {

namespace {
constexpr uint64_t kMaxMemberBytes = uint64_t{1} << 28;  // a .jpg member larger is refused
}  // namespace

// ---------------------------------------------------------------------------------------------
// Brace notation

namespace {

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Splits `body` (the text between a pair of braces) at its top-level commas.
std::vector<std::string> split_top_level(const std::string& body) {
  std::vector<std::string> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '{') ++depth;
    if (body[i] == '}') --depth;
    if (body[i] == ',' && depth == 0) {
      parts.push_back(body.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(body.substr(start));
  return parts;
}

// The alternatives one brace body stands for: a numeric range, a comma list, or itself.
std::vector<std::string> brace_alternatives(const std::string& pattern, const std::string& body) {
  const size_t dots = body.find("..");
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string a = body.substr(0, dots);
    const std::string b = body.substr(dots + 2);
    if (all_digits(a) && all_digits(b)) {
      if (a.size() > 18 || b.size() > 18) {
        throw std::invalid_argument("shard pattern " + pattern + ": range bound too large");
      }
      const long long from = std::stoll(a);
      const long long to = std::stoll(b);
      const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
      const size_t width = padded ? std::max(a.size(), b.size()) : 0;
      const long long step = from <= to ? 1 : -1;
      if ((to - from) * step >= 10'000'000) {
        throw std::invalid_argument("shard pattern " + pattern + ": range of over 10^7 names");
      }
      std::vector<std::string> out;
      for (long long v = from;; v += step) {
        std::string text = std::to_string(v);
        if (text.size() < width) text.insert(0, width - text.size(), '0');
        out.push_back(std::move(text));
        if (v == to) break;
      }
      return out;
    }
  }
  std::vector<std::string> parts = split_top_level(body);
  if (parts.size() < 2) return {"{" + body + "}"};  // as bash and braceexpand: kept as text
  std::vector<std::string> out;
  for (const auto& part : parts) {
    for (auto& e : expand_shard_braces(part)) out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_shard_braces(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    if (pattern.find('}') != std::string::npos) {
      throw std::invalid_argument("shard pattern " + pattern + ": '}' without '{'");
    }
    return {pattern};
  }
  if (pattern.substr(0, open).find('}') != std::string::npos) {
    throw std::invalid_argument("shard pattern " + pattern + ": '}' without '{'");
  }
  int depth = 0;
  size_t close = std::string::npos;
  for (size_t i = open; i < pattern.size(); ++i) {
    if (pattern[i] == '{') ++depth;
    if (pattern[i] == '}' && --depth == 0) {
      close = i;
      break;
    }
  }
  if (close == std::string::npos) {
    throw std::invalid_argument("shard pattern " + pattern + ": '{' without '}'");
  }
  const std::string prefix = pattern.substr(0, open);
  const std::vector<std::string> rest = expand_shard_braces(pattern.substr(close + 1));
  std::vector<std::string> out;
  for (const auto& alternative :
       brace_alternatives(pattern, pattern.substr(open + 1, close - open - 1))) {
    for (const auto& tail : rest) out.push_back(prefix + alternative + tail);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The index (PREFIX.index.json), as tools/prepare.cpp writes it:
//   {"format": "conveyor-wds-index", "version": 1, "classes": ["name", ...],
//    "shards": [{"file": "PREFIX-000000.tar", "bytes": N, "samples": N}, ...],
//    "samples": [{"shard": "PREFIX-000000.tar", "key": "00000000", "offset": N, "size": N,
//                 "label": N}, ...]}
// Keys the reader does not know are skipped.

namespace {

// A strict JSON reader over one document held in memory, just enough for the index: strings,
// integers, arrays, objects; anything else is skipped as a value or rejected with the position.
class JsonReader {
 public:
  JsonReader(std::string text, std::string file) : text_(std::move(text)), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("tar_shards: index " + file_ + ": " + what + " at byte " +
                             std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  void expect_end() {
    skip_space();
    if (pos_ != text_.size()) fail("text after the document");
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    return text_[pos_];
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated string");
      c = text_[pos_++];
      switch (c) {
        case '"':
        case '\\':
        case '/':
          out.push_back(c);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          uint32_t code = hex4();
          if (code >= 0xD800 && code < 0xDC00) {
            if (text_.compare(pos_, 2, "\\u") != 0) fail("unpaired surrogate");
            pos_ += 2;
            const uint32_t low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("unpaired surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  int64_t integer() {
    skip_space();
    const size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    const std::string digits = text_.substr(start, pos_ - start);
    if (digits.empty() || digits == "-") fail("expected an integer");
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      fail("expected an integer");
    }
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(digits.c_str(), &end, 10);
    if (errno != 0) fail("integer out of range");
    return v;
  }

  void skip_value() {
    if (++depth_ > kMaxDepth) fail("values nested too deep");
    skip_value_at_depth();
    --depth_;
  }
  void skip_value_at_depth() {
    const char c = peek();
    if (c == '"') {
      string();
    } else if (c == '{') {
      for_each_member([&](const std::string&) { skip_value(); });
    } else if (c == '[') {
      for_each_element([&] { skip_value(); });
    } else if (text_.compare(pos_, 4, "true") == 0 || text_.compare(pos_, 4, "null") == 0) {
      pos_ += 4;
    } else if (text_.compare(pos_, 5, "false") == 0) {
      pos_ += 5;
    } else {
      // A number: integer part, fraction, exponent.
      const size_t start = pos_;
      while (pos_ < text_.size() && std::strchr("+-0123456789.eE", text_[pos_]) != nullptr) ++pos_;
      if (pos_ == start) fail("expected a value");
    }
  }

  template <class F>
  void for_each_member(F&& f) {
    expect('{');
    if (consume('}')) return;
    do {
      const std::string key = string();
      expect(':');
      f(key);
    } while (consume(','));
    expect('}');
  }

  template <class F>
  void for_each_element(F&& f) {
    expect('[');
    if (consume(']')) return;
    do {
      f();
    } while (consume(','));
    expect(']');
  }

 private:
  uint32_t hex4() {
    if (pos_ + 4 > text_.size()) fail("bad \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail("bad \\u escape");
      }
    }
    return v;
  }
  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  static constexpr int kMaxDepth = 64;
  std::string text_;
  std::string file_;
  size_t pos_ = 0;
  int depth_ = 0;
};

struct IndexSample {
  std::string key;
  uint64_t offset = 0;
  uint64_t size = 0;
  int64_t label = 0;
};

struct ShardIndex {
  std::string path;
  std::vector<std::string> classes;
  std::map<std::string, uint64_t> shard_bytes;  // file name -> size the index was written for
  std::map<std::string, std::vector<IndexSample>> samples;  // file name -> samples in order
};

ShardIndex parse_index(std::string text, const std::string& path) {
  JsonReader json(std::move(text), path);
  ShardIndex index;
  index.path = path;
  bool format_seen = false;
  auto non_negative = [&](const char* what) {
    const int64_t v = json.integer();
    if (v < 0) json.fail(std::string(what) + " is negative");
    return static_cast<uint64_t>(v);
  };
  json.for_each_member([&](const std::string& key) {
    if (key == "format") {
      if (json.string() != "conveyor-wds-index") json.fail("format is not conveyor-wds-index");
      format_seen = true;
    } else if (key == "version") {
      if (json.integer() != 1) json.fail("unsupported version (this reader knows 1)");
    } else if (key == "classes") {
      json.for_each_element([&] { index.classes.push_back(json.string()); });
    } else if (key == "shards") {
      json.for_each_element([&] {
        std::string file;
        uint64_t bytes = 0;
        bool has_bytes = false;
        json.for_each_member([&](const std::string& field) {
          if (field == "file") {
            file = json.string();
          } else if (field == "bytes") {
            bytes = non_negative("bytes");
            has_bytes = true;
          } else {
            json.skip_value();
          }
        });
        if (file.empty() || !has_bytes) json.fail("a shard without file or bytes");
        index.shard_bytes[file] = bytes;
      });
    } else if (key == "samples") {
      json.for_each_element([&] {
        std::string shard;
        IndexSample s;
        int fields = 0;
        json.for_each_member([&](const std::string& field) {
          if (field == "shard") {
            shard = json.string();
            fields |= 1;
          } else if (field == "key") {
            s.key = json.string();
            fields |= 2;
          } else if (field == "offset") {
            s.offset = non_negative("offset");
            fields |= 4;
          } else if (field == "size") {
            s.size = non_negative("size");
            fields |= 8;
          } else if (field == "label") {
            s.label = json.integer();
            fields |= 16;
          } else {
            json.skip_value();
          }
        });
        if (fields != 31) json.fail("a sample without shard, key, offset, size or label");
        index.samples[shard].push_back(std::move(s));
      });
    } else {
      json.skip_value();
    }
  });
  json.expect_end();
  if (!format_seen) json.fail("no \"format\": \"conveyor-wds-index\"");
  for (const auto& [shard, samples] : index.samples) {
    if (!index.shard_bytes.count(shard)) {
      throw std::runtime_error("tar_shards: index " + path + ": samples in " + shard +
                               ", which its \"shards\" does not list");
    }
  }
  return index;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shard names: the one parser behind tar_shards, conveyor-prepare's SRC and conveyor-bench --data.

std::string ShardLocation::name() const {
  return kind == Kind::kPipe ? "pipe:" + location : location;
}

ShardLocation parse_shard_location(const std::string& shard) {
  if (shard.rfind("pipe:", 0) == 0) {
    std::string command = shard.substr(5);
    const size_t first = command.find_first_not_of(" \t");
    if (first == std::string::npos) {
      throw std::invalid_argument("tar_shards: " + shard + ": pipe: needs a command");
    }
    return {ShardLocation::Kind::kPipe, command.substr(first)};
  }
  const size_t scheme = shard.find("://");
  if (scheme == std::string::npos) return {ShardLocation::Kind::kLocal, shard};
  std::string name = shard.substr(0, scheme);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name == "http" || name == "https") return {ShardLocation::Kind::kHttp, shard};
  if (name == "s3" || name == "gs") {
    const std::string command = name == "s3" ? "aws s3 cp " + shard + " -" : "gsutil cat " + shard;
    throw std::invalid_argument("tar_shards: " + shard + ": unsupported URL scheme '" + name +
                                "': read it through its command line tool, \"pipe:" + command +
                                "\" (or a pre-signed https:// URL)");
  }
  if (name != "file") {
    throw std::invalid_argument("tar_shards: " + shard + ": unsupported URL scheme '" + name +
                                "' (local paths, file://, http:// and https:// URLs, and "
                                "pipe:COMMAND)");
  }
  std::string rest = shard.substr(scheme + 3);
  if (rest.rfind("localhost/", 0) == 0) rest.erase(0, 9);
  if (rest.empty() || rest[0] != '/') {
    throw std::invalid_argument("tar_shards: " + shard +
                                ": a file:// URL needs an absolute path (file:///path)");
  }
  std::string out;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == '%' && i + 2 < rest.size() &&
        std::isxdigit(static_cast<unsigned char>(rest[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(rest[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(rest.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(rest[i]);
    }
  }
  return {ShardLocation::Kind::kLocal, out};
}

std::vector<ShardLocation> expand_shard_locations(const std::vector<std::string>& patterns) {
  std::vector<ShardLocation> out;
  for (const auto& pattern : patterns) {
    for (const auto& shard : expand_shard_braces(pattern)) {
      out.push_back(parse_shard_location(shard));
    }
  }
  return out;
}

std::vector<std::string> split_shard_patterns(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  int depth = 0;
  char quote = 0;
  for (char c : text) {
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && depth > 0) {
      --depth;
    } else if (c == ',' && depth == 0) {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
      continue;
    }
    current += c;
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

bool names_tar_shards(const std::string& text) {
  auto starts = [&](const char* prefix) { return text.rfind(prefix, 0) == 0; };
  const bool tar = text.size() >= 4 && text.compare(text.size() - 4, 4, ".tar") == 0;
  const bool braces = text.find('{') != std::string::npos && text.find(".tar") != std::string::npos;
  return tar || braces || starts("pipe:") || starts("http://") || starts("https://") ||
         starts("file://");
}

namespace {

using Kind = ShardLocation::Kind;

// A pipe: command's shard word: the last whitespace-separated word that ends in .tar (without
// the shell's ; & | ) after it, nor quotes around it), as [begin, end) in the command. False when
// there is none.
bool pipe_shard_word(const std::string& command, size_t& begin, size_t& end) {
  bool found = false;
  size_t i = 0;
  while (i < command.size()) {
    while (i < command.size() && std::isspace(static_cast<unsigned char>(command[i]))) ++i;
    size_t b = i;
    while (i < command.size() && !std::isspace(static_cast<unsigned char>(command[i]))) ++i;
    size_t e = i;
    while (e > b && command[e - 1] != '\0' && std::strchr(";&|)", command[e - 1]) != nullptr) --e;
    if (e - b >= 2 && (command[b] == '\'' || command[b] == '"') && command[e - 1] == command[b]) {
      ++b;
      --e;
    }
    if (e - b > 4 && command.compare(e - 4, 4, ".tar") == 0) {
      begin = b;
      end = e;
      found = true;
    }
  }
  return found;
}

// The shard's file name, as its index lists it: the last path segment (of a URL, without its
// query string or fragment; of a command, of its shard word). Empty for a command without one.
std::string file_name_of(const ShardLocation& shard) {
  if (shard.kind == Kind::kLocal) {
    return std::filesystem::path(shard.location).filename().string();
  }
  std::string path = shard.location;
  if (shard.kind == Kind::kPipe) {
    size_t begin = 0, end = 0;
    if (!pipe_shard_word(shard.location, begin, end)) return {};
    path = shard.location.substr(begin, end - begin);
  } else {
    path = path.substr(0, path.find_first_of("?#"));
  }
  return path.substr(path.rfind('/') + 1);
}

// PREFIX-NNNNNN.tar -> PREFIX.index.json in the same folder (for a URL: beside it, without the
// shard's query string; for a command: the same command with its shard word's file name
// replaced), as a name parse_shard_location reads.
std::string index_location_for(const ShardLocation& shard) {
  const std::string name = file_name_of(shard);
  const size_t dash = name.rfind('-');
  const bool ok = name.size() > 4 && name.compare(name.size() - 4, 4, ".tar") == 0 &&
                  dash != std::string::npos && dash > 0 &&
                  all_digits(name.substr(dash + 1, name.size() - 4 - dash - 1));
  if (!ok) {
    throw std::invalid_argument("tar_shards: " + shard.name() +
                                ": a shard must be named PREFIX-NNNNNN.tar so that its index "
                                "PREFIX.index.json can be found (or give ShardOptions::index)");
  }
  const std::string index_name = name.substr(0, dash) + ".index.json";
  switch (shard.kind) {
    case Kind::kLocal:
      return (std::filesystem::path(shard.location).parent_path() / index_name).string();
    case Kind::kHttp: {
      const std::string url = shard.location.substr(0, shard.location.find_first_of("?#"));
      return url.substr(0, url.rfind('/') + 1) + index_name;
    }
    case Kind::kPipe: {
      size_t begin = 0, end = 0;
      pipe_shard_word(shard.location, begin, end);
      std::string command = shard.location;
      command.replace(end - name.size(), name.size(), index_name);
      return "pipe:" + command;
    }
  }
  return {};
}

// One worker's reader: pread() for local shards, and its own HTTP connection (made on its first
// remote read) for remote ones.
class ShardReaderOfSet final : public detail::ShardReader {
 public:
  ShardReaderOfSet(const std::vector<std::string>& locations,
                   const std::vector<detail::ShardFile>& files, const ShardOptions& options)
      : locations_(locations), files_(files), options_(options) {}

  void will_read(const std::vector<detail::MemberRange>& members) override {
    if (options_.requests_in_flight <= 1) return;
    ranges_.clear();
    for (const auto& m : members) {
      if (files_.at(m.shard).get() < 0) ranges_.push_back({&locations_[m.shard], m.offset, m.size});
    }
    if (ranges_.empty()) return;
    if (!ahead_) {
      ahead_ = std::make_unique<detail::HttpReadAhead>(options_, options_.requests_in_flight);
    }
    ahead_->start(ranges_);
  }

  void read(uint32_t shard, uint64_t offset, uint64_t size, std::vector<uint8_t>& out) override {
    const std::string& where = locations_.at(shard);
    if (size > std::numeric_limits<size_t>::max() / 2) {
      throw std::runtime_error(where + ": member too large");
    }
    const int fd = files_.at(shard).get();
    if (fd < 0) {
      if (ahead_ && ahead_->take({&where, offset, size}, out)) return;
      // Not read ahead, or not whole: read it (again) with retries; errors name the URL.
      if (!http_) http_ = std::make_unique<detail::HttpClient>(options_);
      http_->get_range(where, offset, size, out);
      return;
    }
    const auto bytes = static_cast<size_t>(size);
    if (out.capacity() < bytes) out.reserve(bytes + bytes / 4);
    out.resize(bytes);
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n =
          ::pread(fd, out.data() + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error(where + ": read failed: " + std::strerror(errno));
      }
      if (n == 0) {
        throw std::runtime_error(where + ": the shard ends at byte " +
                                 std::to_string(offset + done) + ", inside the member (bytes " +
                                 std::to_string(offset) + ".." + std::to_string(offset + size) +
                                 "); truncated since the index was written?");
      }
      done += static_cast<size_t>(n);
    }
  }

 private:
  const std::vector<std::string>& locations_;
  const std::vector<detail::ShardFile>& files_;
  const ShardOptions& options_;
  std::unique_ptr<detail::HttpClient> http_;
  std::unique_ptr<detail::HttpReadAhead> ahead_;  // made on the first hint with remote members
  std::vector<detail::HttpReadAhead::Range> ranges_;
};

}  // namespace

std::unique_ptr<detail::ShardReader> ImageSource::Shards::open_reader() const {
  return std::make_unique<ShardReaderOfSet>(locations, files, options);
}

namespace {

constexpr size_t kMaxIndexBytes = size_t{1} << 30;  // an index a command writes, at most

// Reads the index at `index_location` (a path, URL or pipe: command). Returns false when there
// is none (no file, HTTP 404; for a command beside pipe: shards, `lenient`: one that fails or
// writes no index, with `why` set); throws naming `shard` when it cannot be read or parsed.
bool load_index(const std::string& index_location, const std::string& shard,
                const ShardOptions& options, std::unique_ptr<detail::HttpClient>& http,
                bool lenient, ShardIndex& index, std::string& why) {
  const ShardLocation where = parse_shard_location(index_location);
  std::string text;
  if (where.kind == Kind::kHttp) {
    if (!http) http = std::make_unique<detail::HttpClient>(options);
    std::vector<uint8_t> bytes;
    try {
      if (!http->get_if_exists(where.location, bytes)) return false;
    } catch (const std::exception& e) {
      throw std::runtime_error("tar_shards: " + shard + ": cannot read its index: " + e.what());
    }
    text.assign(bytes.begin(), bytes.end());
  } else if (where.kind == Kind::kPipe) {
    std::vector<uint8_t> bytes;
    std::string failure;
    if (!detail::read_command_output(where.location, options, kMaxIndexBytes, bytes, failure)) {
      if (lenient) {
        why = failure;
        return false;
      }
      throw std::runtime_error("tar_shards: " + shard + ": cannot read its index: " + failure);
    }
    text.assign(bytes.begin(), bytes.end());
    if (lenient) {
      try {
        index = parse_index(std::move(text), index_location);
        return true;
      } catch (const std::exception& e) {
        why = index_location + " wrote no index: " + e.what();
        return false;
      }
    }
  } else {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(where.location, ec)) return false;
    std::ifstream in(where.location, std::ios::binary);
    if (!in) throw std::runtime_error("tar_shards: cannot open index " + where.location);
    std::ostringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  index = parse_index(std::move(text), index_location);
  return true;
}

// The shard's name fits PREFIX-NNNNNN.tar, so that an index can be looked for beside it.
// The first line of `text`.
std::string one_line_of(const std::string& text) { return text.substr(0, text.find('\n')); }

bool has_index_name(const ShardLocation& shard) {
  try {
    index_location_for(shard);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

}  // namespace

std::vector<std::string> detail::shard_classes(const std::vector<ShardLocation>& shards,
                                               const ShardOptions& options) {
  if (shards.empty()) return {};
  const ShardLocation& first = shards.front();
  if (options.index.empty() && !has_index_name(first)) return {};
  std::unique_ptr<detail::HttpClient> http;
  ShardIndex index;
  std::string why;
  const std::string where = options.index.empty() ? index_location_for(first) : options.index;
  const bool lenient = options.index.empty() && first.kind == Kind::kPipe;
  if (!load_index(where, first.name(), options, http, lenient, index, why)) return {};
  return index.classes;
}

std::unique_ptr<ImageSource> ImageSource::tar_shards(const std::vector<std::string>& shards,
                                                     ImageTransform transform,
                                                     const ShardOptions& options) {
  if (options.retries < 0) throw std::invalid_argument("tar_shards: retries must be >= 0");
  if (options.world_size == 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("tar_shards: rank " + std::to_string(options.rank) +
                                " is not in [0, " + std::to_string(options.world_size) + ")");
  }
  const std::vector<ShardLocation> locations = expand_shard_locations(shards);
  if (locations.empty()) throw std::invalid_argument("tar_shards: no shards given");

  // Each shard's index, where there is one.
  std::unique_ptr<detail::HttpClient> http;  // for remote indexes, made on first use
  std::map<std::string, std::unique_ptr<ShardIndex>> indexes;  // by location; null: none there
  std::vector<const ShardIndex*> index_of(locations.size(), nullptr);
  std::vector<std::string> index_location(locations.size());
  std::string no_index;  // why a command beside pipe: shards gave none, for the error below
  bool pipes = false;
  for (size_t i = 0; i < locations.size(); ++i) {
    const ShardLocation& shard = locations[i];
    pipes = pipes || shard.kind == Kind::kPipe;
    if (options.index.empty() && !has_index_name(shard)) continue;  // streamed
    index_location[i] = options.index.empty() ? index_location_for(shard) : options.index;
    auto found = indexes.find(index_location[i]);
    if (found == indexes.end()) {
      auto index = std::make_unique<ShardIndex>();
      const bool lenient = options.index.empty() && shard.kind == Kind::kPipe;
      std::string why;
      if (!load_index(index_location[i], shard.name(), options, http, lenient, *index, why)) {
        if (!options.index.empty()) {
          throw std::runtime_error("tar_shards: no index at " + options.index +
                                   " (ShardOptions::index)");
        }
        if (no_index.empty()) no_index = why;
        index.reset();
      }
      found = indexes.emplace(index_location[i], std::move(index)).first;
    }
    index_of[i] = found->second.get();
  }
  // A command's output can only be streamed.
  const bool streaming = options.streaming || pipes ||
                         std::find(index_of.begin(), index_of.end(), nullptr) != index_of.end();

  const std::vector<std::string>* classes = nullptr;
  for (size_t i = 0; i < locations.size(); ++i) {
    const ShardIndex* index = index_of[i];
    if (index == nullptr) continue;
    const std::string where = locations[i].name();
    if (classes == nullptr) {
      classes = &index->classes;
    } else if (*classes != index->classes) {
      throw std::invalid_argument("tar_shards: " + where + ": its index " + index_location[i] +
                                  " names other classes than the first indexed shard's");
    }
    if (index->shard_bytes.count(file_name_of(locations[i])) == 0) {
      throw std::runtime_error("tar_shards: " + where + " is not listed in its index " +
                               index_location[i]);
    }
  }

  if (streaming) {
    std::vector<detail::StreamShard> stream_shards;
    std::vector<size_t> counts;
    bool counts_known = true;
    for (size_t i = 0; i < locations.size(); ++i) {
      detail::StreamShard s{locations[i], 0};
      if (index_of[i] != nullptr) {
        const auto samples = index_of[i]->samples.find(file_name_of(locations[i]));
        s.samples = samples == index_of[i]->samples.end() ? 0 : samples->second.size();
      } else if (locations[i].kind == Kind::kLocal) {
        s.samples = detail::count_tar_samples(locations[i].location);
      } else {
        counts_known = false;
      }
      counts.push_back(s.samples);
      stream_shards.push_back(std::move(s));
    }
    if (locations.size() < options.world_size) {
      throw std::invalid_argument("tar_shards (streaming): " + std::to_string(locations.size()) +
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
            (no_index.empty() ? std::string() : " (" + one_line_of(no_index) + ")"));
      }
      positions = detail::ShardStream::equal_positions(counts, options.world_size);
    }
    if (positions == 0) throw std::runtime_error("tar_shards: the shards hold no samples");
    std::unique_ptr<ImageSource> source(
        new ImageSource({}, classes ? *classes : std::vector<std::string>{}, {}, transform));
    source->stream_ = std::make_shared<Stream>(std::move(stream_shards), options, positions);
    return source;
  }

  // A server that ignores Range would fail every sample: said once, here, with what works.
  for (const ShardLocation& shard : locations) {
    if (shard.kind != Kind::kHttp) continue;
    if (!http) http = std::make_unique<detail::HttpClient>(options);
    if (http->range_support(shard.location) == detail::HttpClient::RangeSupport::kIgnored) {
      throw std::runtime_error(
          "tar_shards: " + shard.location +
          ": the server ignored a Range request (HTTP 200 with the whole resource). Random "
          "access reads each sample with a Range request; streaming reads each shard with one "
          "plain GET and works with this server: set ShardOptions::streaming "
          "(conveyor-bench --streaming)");
    }
    break;  // one request: the first remote shard's server
  }

  auto shared = std::make_shared<Shards>();
  shared->options = options;
  std::vector<ImageItem> items;
  for (size_t i = 0; i < locations.size(); ++i) {
    const ShardLocation& shard = locations[i];
    const std::string& where = shard.location;
    const ShardIndex& index = *index_of[i];
    const std::string name = file_name_of(shard);
    const uint64_t indexed_bytes = index.shard_bytes.at(name);
    detail::ShardFile file;
    if (shard.kind == Kind::kLocal) {
      file = detail::ShardFile(::open(where.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
      if (file.get() < 0) {
        throw std::runtime_error("tar_shards: cannot open shard " + where + ": " +
                                 std::strerror(errno));
      }
      struct stat st {};
      if (::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw std::runtime_error("tar_shards: shard " + where + " is not a regular file");
      }
      // Shorter than the index says: truncated, and only the members it cuts fail, when read.
      // Longer: rewritten, and the offsets cannot be trusted.
      if (static_cast<uint64_t>(st.st_size) > indexed_bytes) {
        throw std::runtime_error("tar_shards: shard " + where + " is " +
                                 std::to_string(st.st_size) + " bytes but its index " +
                                 index_location[i] + " says " + std::to_string(indexed_bytes) +
                                 " (rewritten since the index was written?)");
      }
    }
    if (shared->files.size() >= std::numeric_limits<uint32_t>::max()) {
      throw std::invalid_argument("tar_shards: too many shards");
    }
    const auto shard_number = static_cast<uint32_t>(shared->files.size());
    shared->locations.push_back(where);
    shared->files.push_back(std::move(file));
    shared->remote = shared->remote || shard.kind == Kind::kHttp;
    const auto samples = index.samples.find(name);
    if (samples == index.samples.end()) continue;  // a shard may hold no sample
    for (const IndexSample& s : samples->second) {
      if (s.size > kMaxMemberBytes) {
        throw std::runtime_error("tar_shards: index " + index_location[i] + ": sample " + s.key +
                                 ".jpg is " + std::to_string(s.size) +
                                 " bytes, more than any JPEG this loader reads");
      }
      if (s.size == 0 || s.offset > indexed_bytes || s.size > indexed_bytes - s.offset) {
        throw std::runtime_error("tar_shards: index " + index_location[i] + ": sample " + s.key +
                                 ".jpg lies outside shard " + where);
      }
      shared->members.push_back({shard_number, s.offset, s.size});
      items.push_back({where + " (member " + s.key + ".jpg)", s.label});
    }
  }
  if (items.empty()) throw std::runtime_error("tar_shards: the shards hold no samples");
  std::unique_ptr<ImageSource> source(new ImageSource(
      std::move(items), classes ? *classes : std::vector<std::string>{}, {}, transform));
  source->shards_ = std::move(shared);
  return source;
}

}  // namespace conveyor
