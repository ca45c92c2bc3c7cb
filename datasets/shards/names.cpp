// Shard names (conveyor/datasets.h and names.h): the one parser behind tar_shards,
// conveyor-prepare's SRC and conveyor-bench's --data: WebDataset's brace notation, the forms of a
// location, comma-separated patterns, and where a shard's index lies.
#include "shards/names.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor {

// ---------------------------------------------------------------------------------------------
// Brace notation

namespace {

// What shard names may expand to, in all: at most this many names and this much text. A fuzzed
// 6 kB argument such as "{0..999999}/{0..999999}..." stayed within the names but not the text.
constexpr size_t kMaxNames = 1'000'000;
constexpr size_t kMaxBytes = size_t{64} << 20;

size_t text_size(const std::vector<std::string>& names) {
  size_t bytes = 0;
  for (const auto& n : names) bytes += n.size();
  return bytes;
}

// The one check of that limit.
void check_expansion(const std::string& pattern, unsigned long long names,
                     unsigned long long bytes) {
  if (names <= kMaxNames && bytes <= kMaxBytes) return;
  throw std::invalid_argument("shard pattern " + pattern.substr(0, 200) +
                              (pattern.size() > 200 ? "..." : "") + ": expands to more than " +
                              std::to_string(kMaxNames) + " names or " +
                              std::to_string(kMaxBytes >> 20) + " MiB of names");
}

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
      const unsigned long long count = static_cast<unsigned long long>((to - from) * step) + 1;
      check_expansion(pattern, count, count * std::max(a.size(), b.size()));
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
  size_t bytes = 0;
  for (const auto& part : parts) {
    std::vector<std::string> expanded = expand_shard_braces(part);
    bytes += text_size(expanded);
    check_expansion(pattern, out.size() + expanded.size(), bytes);
    for (auto& e : expanded) out.push_back(std::move(e));
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
  const std::vector<std::string> alternatives =
      brace_alternatives(pattern, pattern.substr(open + 1, close - open - 1));
  // Both lists are within the limit, so neither product below overflows.
  const unsigned long long names =
      static_cast<unsigned long long>(alternatives.size()) * rest.size();
  check_expansion(pattern, names, 0);
  check_expansion(pattern, names,
                  names * prefix.size() + text_size(alternatives) * rest.size() +
                      text_size(rest) * alternatives.size());
  std::vector<std::string> out;
  out.reserve(alternatives.size() * rest.size());
  for (const auto& alternative : alternatives) {
    for (const auto& tail : rest) out.push_back(prefix + alternative + tail);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Shard names: the one parser behind tar_shards, conveyor-prepare's SRC and conveyor-bench --data.

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
  size_t bytes = 0;
  for (const auto& pattern : patterns) {
    const std::vector<std::string> shards = expand_shard_braces(pattern);
    bytes += text_size(shards);
    check_expansion(pattern, out.size() + shards.size(), bytes);  // the limit is for all of them
    for (const auto& shard : shards) out.push_back(parse_shard_location(shard));
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

ShardLocation literal_shard_location(const std::string& name) {
  auto starts = [&](const char* prefix) {
    return name.size() >= std::strlen(prefix) &&
           std::equal(prefix, prefix + std::strlen(prefix), name.begin(), [](char a, char b) {
             return a == std::tolower(static_cast<unsigned char>(b));
           });
  };
  if (starts("http://") || starts("https://")) return {ShardLocation::Kind::kHttp, name};
  return {ShardLocation::Kind::kLocal, name};
}

namespace {

// The command-line rule: an argument that names an existing file or folder is that path.
bool names_existing_path(const std::string& text) {
  std::error_code ec;
  return !text.empty() && std::filesystem::exists(text, ec);
}

}  // namespace

std::vector<ShardLocation> shard_argument_locations(const std::string& text) {
  if (names_existing_path(text)) return {{ShardLocation::Kind::kLocal, text}};
  return expand_shard_locations(split_shard_patterns(text));
}

bool names_tar_shards(const std::string& text) {
  const bool tar = text.size() >= 4 && text.compare(text.size() - 4, 4, ".tar") == 0;
  if (names_existing_path(text)) {
    std::error_code ec;
    return tar && !std::filesystem::is_directory(text, ec);
  }
  auto starts = [&](const char* prefix) { return text.rfind(prefix, 0) == 0; };
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

}  // namespace

// The shard's file name, as its index lists it: the last path segment (of a URL, without its
// query string or fragment; of a command, of its shard word). Empty for a command without one.
std::string detail::file_name_of(const ShardLocation& shard) {
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
// replaced), of the shard's own kind: a local shard's index is a local path, whatever its name.
ShardLocation detail::index_location_for(const ShardLocation& shard) {
  const std::string name = detail::file_name_of(shard);
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
      return {Kind::kLocal,
              (std::filesystem::path(shard.location).parent_path() / index_name).string()};
    case Kind::kHttp: {
      const std::string url = shard.location.substr(0, shard.location.find_first_of("?#"));
      return {Kind::kHttp, url.substr(0, url.rfind('/') + 1) + index_name};
    }
    case Kind::kPipe: {
      size_t begin = 0, end = 0;
      pipe_shard_word(shard.location, begin, end);
      std::string command = shard.location;
      command.replace(end - name.size(), name.size(), index_name);
      return {Kind::kPipe, command};
    }
  }
  return {};
}

namespace {

// `name` for a message: quoted, control bytes and backslashes as \xNN, at most 200 bytes.
std::string quoted(const std::string& name) {
  std::string out = "'";
  for (size_t i = 0; i < name.size() && i < 200; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (name.size() > 200 ? "...'" : "'");
}

}  // namespace

void detail::check_path_segment(const std::string& name, const std::string& what) {
  const char* why = nullptr;
  if (name.empty()) {
    why = "is empty";
  } else if (name == "." || name == "..") {
    why = "is not a name (. or ..)";
  } else if (name.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
    why = "holds '/', '\\' or NUL (a name from data must be one path segment)";
  }
  if (why != nullptr) throw std::invalid_argument(what + " " + quoted(name) + " " + why);
}

std::filesystem::path detail::path_under(const std::filesystem::path& root, const std::string& name,
                                         const std::string& what) {
  check_path_segment(name, what);
  const std::filesystem::path joined = root / name;
  std::filesystem::path base = root.lexically_normal();
  if (!base.has_filename() && base.has_parent_path()) base = base.parent_path();  // "dst/"
  const std::filesystem::path relative = joined.lexically_normal().lexically_relative(base);
  if (relative.empty() || relative == "." || *relative.begin() == "..") {
    throw std::invalid_argument(what + " " + quoted(name) + ": " + joined.string() +
                                " is not under " + root.string());
  }
  return joined;
}

bool detail::has_index_name(const ShardLocation& shard) {
  try {
    index_location_for(shard);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

}  // namespace conveyor
