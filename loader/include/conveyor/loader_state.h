// conveyor/loader_state.h: a loader's checkpoint as plain values.
// Part of the loader's public interface (conveyor/loader.h includes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace conveyor {

// A loader's checkpoint as plain values (DataLoader::state(), DataLoader::load_state()).
//
// What it is for: saving and loading a loader's position without executing anything. A state
// is a map from names to values (64-bit integers, strings, lists of 64-bit integers); its byte
// form (serialize(), parse()) is a small text format that parse() reads with strict bounds, so
// a state from a file, a peer or a download is data, never code. A torch archive
// (DataLoader::save(), load()) carries the same values, but loading one runs torch::jit::load,
// which may run code from the file (docs/resume.md).
//
// The byte form, version 1 (every number decimal ASCII, every line ending in '\n'):
//   conveyor-loader-state 1
//   <key> i <int64>                       one integer: an optional '-', then 1 to 19 digits
//   <key> s <length>:<length bytes>       one string: any bytes, as many as <length> says
//   <key> l <count>[ <int64>]...          a list: <count> integers, each after one space
// in any order of keys, each key once. A key is 1 to kMaxKeyBytes bytes of [A-Za-z0-9_].
//
// Requires nothing. Guarantees: set_*() and parse() refuse, with std::invalid_argument naming
// the key (quoted, bounded and escaped), a key that is not a name, a string over
// kMaxStringBytes, more than kMaxEntries entries, and parse() also anything not in the format
// above: an unknown type, a number out of int64's range or with stray characters, a length past
// the end of the bytes, a repeated key, bytes after the last line. Nothing is allocated for a
// length or count before the bytes it claims are known to be there.
// Thread safety: a value type; const calls are safe from several threads.
class LoaderState {
 public:
  using Value = std::variant<int64_t, std::string, std::vector<int64_t>>;
  static constexpr size_t kMaxKeyBytes = 64;
  static constexpr size_t kMaxStringBytes = 4096;
  static constexpr size_t kMaxEntries = 256;

  // Sets `key` (replacing its value, if any).
  void set_int(std::string_view key, int64_t value);
  void set_string(std::string_view key, std::string_view value);
  void set_list(std::string_view key, std::vector<int64_t> value);
  // The value of `key`, or null.
  const Value* find(const std::string& key) const;
  const std::map<std::string, Value>& values() const { return values_; }
  bool operator==(const LoaderState& other) const { return values_ == other.values_; }
  bool operator!=(const LoaderState& other) const { return !(*this == other); }

  // The byte form above; parse(serialize()) == *this.
  std::string serialize() const;
  static LoaderState parse(std::string_view bytes);

 private:
  void set(std::string_view key, Value value);
  std::map<std::string, Value> values_;
};

}  // namespace conveyor
