// LoaderState: a loader's checkpoint as plain values, and its byte form (conveyor/loader.h
// documents the format). The parser reads untrusted bytes: every length and count is checked
// against the bytes left before anything is allocated for it.
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "conveyor/internal/printable.h"
#include "conveyor/loader.h"

namespace conveyor {
namespace {

constexpr std::string_view kHeader = "conveyor-loader-state 1\n";

bool is_key_byte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

void check_key(std::string_view key) {
  bool name = !key.empty() && key.size() <= LoaderState::kMaxKeyBytes;
  for (size_t i = 0; name && i < key.size(); ++i) name = is_key_byte(key[i]);
  if (!name) {
    throw std::invalid_argument(
        "conveyor: a loader state's key '" + detail::printable(key) + "' is not a name of 1 to " +
        std::to_string(LoaderState::kMaxKeyBytes) + " letters, digits and '_'");
  }
}

// Reads LoaderState's byte form, front to back.
class Parser {
 public:
  explicit Parser(std::string_view bytes) : bytes_(bytes) {}

  LoaderState parse() {
    if (bytes_.substr(0, kHeader.size()) != kHeader) {
      fail("it does not start with '" + detail::printable(kHeader) + "'");
    }
    at_ = kHeader.size();
    LoaderState state;
    while (at_ < bytes_.size()) {
      const std::string key = read_key();
      if (state.find(key) != nullptr) fail("'" + key + "' comes twice");
      const char type = next_byte("a type after '" + key + "'");
      expect(' ', "after the type of '" + key + "'");
      if (type == 'i') {
        state.set_int(key, read_int(key));
      } else if (type == 's') {
        const uint64_t length = read_count(key);
        expect(':', "after the length of '" + key + "'");
        if (length > LoaderState::kMaxStringBytes) {
          fail("'" + key + "' is a string of " + std::to_string(length) +
               " bytes; a state's strings are at most " +
               std::to_string(LoaderState::kMaxStringBytes));
        }
        if (length > bytes_.size() - at_) {
          fail("'" + key + "' claims " + std::to_string(length) + " bytes but " +
               std::to_string(bytes_.size() - at_) + " are left");
        }
        state.set_string(key, bytes_.substr(at_, length));
        at_ += length;
      } else if (type == 'l') {
        const uint64_t count = read_count(key);
        // Each integer takes two bytes at least (a space and a digit).
        if (count > (bytes_.size() - at_) / 2) {
          fail("'" + key + "' claims " + std::to_string(count) + " integers but " +
               std::to_string(bytes_.size() - at_) + " bytes are left");
        }
        std::vector<int64_t> list;
        list.reserve(count);
        for (uint64_t i = 0; i < count; ++i) {
          expect(' ', "before integer " + std::to_string(i) + " of '" + key + "'");
          list.push_back(read_int(key));
        }
        state.set_list(key, std::move(list));
      } else {
        fail("'" + key + "' has the unknown type " + quoted(type) + " (i, s or l)");
      }
      expect('\n', "at the end of '" + key + "'");
    }
    return state;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("conveyor: a loader state's bytes are malformed at byte " +
                                std::to_string(at_) + " of " + std::to_string(bytes_.size()) +
                                ": " + what);
  }

  char next_byte(const std::string& what) {
    if (at_ >= bytes_.size()) fail("they end where " + what + " should be");
    return bytes_[at_++];
  }

  void expect(char wanted, const std::string& where) {
    const size_t at = at_;
    const char got = next_byte(quoted(wanted) + " " + where);
    if (got != wanted) {
      at_ = at;
      fail(quoted(wanted) + " should come " + where + ", not " + quoted(got));
    }
  }

  // 'c', escaped. (Built by appends: GCC 12's -Wrestrict misreads "'" + a short string at -O3.)
  static std::string quoted(char c) {
    std::string out(1, '\'');
    out += detail::printable(std::string_view(&c, 1));
    out += '\'';
    return out;
  }

  std::string read_key() {
    const size_t start = at_;
    while (at_ < bytes_.size() && is_key_byte(bytes_[at_]) &&
           at_ - start <= LoaderState::kMaxKeyBytes) {
      ++at_;
    }
    const std::string_view key = bytes_.substr(start, at_ - start);
    if (key.empty() || key.size() > LoaderState::kMaxKeyBytes) {
      at_ = start;
      fail("a key of 1 to " + std::to_string(LoaderState::kMaxKeyBytes) +
           " letters, digits and '_' should start here");
    }
    expect(' ', "after the key '" + std::string(key) + "'");
    return std::string(key);
  }

  // Up to 20 digits, no leading zero, as an unsigned number; `negative` allowed before them.
  uint64_t read_digits(const std::string& key, bool& negative, bool sign_allowed) {
    const size_t start = at_;
    negative = sign_allowed && at_ < bytes_.size() && bytes_[at_] == '-';
    if (negative) ++at_;
    const size_t digits = at_;
    uint64_t value = 0;
    while (at_ < bytes_.size() && bytes_[at_] >= '0' && bytes_[at_] <= '9') {
      const auto digit = static_cast<uint64_t>(bytes_[at_] - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
        at_ = start;
        fail("a number of '" + key + "' is out of range");
      }
      value = value * 10 + digit;
      ++at_;
    }
    if (at_ == digits || (at_ - digits > 1 && bytes_[digits] == '0')) {
      at_ = start;
      fail("a decimal number (without leading zeros) of '" + key + "' should start here");
    }
    return value;
  }

  int64_t read_int(const std::string& key) {
    const size_t start = at_;
    bool negative = false;
    const uint64_t magnitude = read_digits(key, negative, true);
    const auto max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (magnitude > max + (negative ? 1 : 0)) {
      at_ = start;
      fail("an integer of '" + key + "' is outside int64's range");
    }
    if (!negative) return static_cast<int64_t>(magnitude);
    return magnitude == max + 1 ? std::numeric_limits<int64_t>::min()
                                : -static_cast<int64_t>(magnitude);
  }

  uint64_t read_count(const std::string& key) {
    bool negative = false;
    return read_digits(key, negative, false);
  }

  std::string_view bytes_;
  size_t at_ = 0;
};

}  // namespace

void LoaderState::set(std::string_view key, Value value) {
  check_key(key);
  auto existing = values_.find(std::string(key));
  if (existing != values_.end()) {
    existing->second = std::move(value);
    return;
  }
  if (values_.size() >= kMaxEntries) {
    throw std::invalid_argument("conveyor: a loader state holds at most " +
                                std::to_string(kMaxEntries) + " values; '" + std::string(key) +
                                "' is one more");
  }
  values_.emplace(std::string(key), std::move(value));
}

void LoaderState::set_int(std::string_view key, int64_t value) { set(key, value); }

void LoaderState::set_string(std::string_view key, std::string_view value) {
  check_key(key);
  if (value.size() > kMaxStringBytes) {
    throw std::invalid_argument(
        "conveyor: the loader state's '" + std::string(key) + "' is a string of " +
        std::to_string(value.size()) + " bytes ('" + detail::printable(value, 40) +
        "'); a state's strings are at most " + std::to_string(kMaxStringBytes));
  }
  set(key, std::string(value));
}

void LoaderState::set_list(std::string_view key, std::vector<int64_t> value) {
  set(key, std::move(value));
}

const LoaderState::Value* LoaderState::find(const std::string& key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::string LoaderState::serialize() const {
  std::string out(kHeader);
  for (const auto& [key, value] : values_) {
    out += key;
    if (const auto* number = std::get_if<int64_t>(&value)) {
      out += " i ";
      out += std::to_string(*number);
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      out += " s ";
      out += std::to_string(text->size());
      out += ':';
      out += *text;
    } else {
      const auto& list = std::get<std::vector<int64_t>>(value);
      out += " l ";
      out += std::to_string(list.size());
      for (const int64_t v : list) {
        out += ' ';
        out += std::to_string(v);
      }
    }
    out += '\n';
  }
  return out;
}

LoaderState LoaderState::parse(std::string_view bytes) { return Parser(bytes).parse(); }

}  // namespace conveyor
