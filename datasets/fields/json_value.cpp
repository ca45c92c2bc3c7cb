// JSON values from the data (json_value.h): a strict scanner of RFC 8259's grammar, recursive
// only as deep as the caller's bound, and readers of one scalar or a list of numbers.
#include "fields/json_value.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <system_error>

#include "conveyor/internal/printable.h"

namespace conveyor::detail {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_space(std::string_view text, size_t at) {
  while (at < text.size() && is_space(text[at])) ++at;
  return at;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The four hex digits at text[at..at+4), or -1.
int32_t hex4(std::string_view text, size_t at) {
  if (text.size() - at < 4) return -1;
  int32_t value = 0;
  for (size_t i = 0; i < 4; ++i) {
    const int digit = hex_value(text[at + i]);
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Whether the JSON number `number` (well formed) is 1 or more in magnitude: told apart by its
// first nonzero digit's decimal order, for a number that from_chars finds out of double's range
// (an overflow if so, an underflow to zero if not).
bool at_least_one(std::string_view number) {
  size_t at = number[0] == '-' ? 1 : 0;
  const size_t int_start = at;
  while (at < number.size() && is_digit(number[at])) ++at;
  const size_t int_end = at;
  int64_t order = 0;
  bool found = false;
  if (number[int_start] != '0') {
    order = static_cast<int64_t>(int_end - int_start) - 1;
    found = true;
  }
  if (at < number.size() && number[at] == '.') {
    ++at;
    for (int64_t place = -1; at < number.size() && is_digit(number[at]); ++at, --place) {
      if (!found && number[at] != '0') {
        order = place;
        found = true;
      }
    }
  }
  if (!found) return false;  // zero
  if (at < number.size()) {  // the exponent, saturated far past any double's
    ++at;
    const bool negative = number[at] == '-';
    if (number[at] == '+' || number[at] == '-') ++at;
    int64_t exponent = 0;
    for (; at < number.size(); ++at) {
      exponent = std::min<int64_t>(exponent * 10 + (number[at] - '0'), 1'000'000'000);
    }
    order += negative ? -exponent : exponent;
  }
  return order >= 0;
}

// `number` (well formed) as the nearest double: false when it overflows double's range (as
// nlohmann's parser refuses it); an underflow is zero.
bool to_double(std::string_view number, double& out) {
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), out);
  if (error == std::errc::result_out_of_range && !at_least_one(number)) {
    out = number[0] == '-' ? -0.0 : 0.0;
    return true;
  }
  return error == std::errc() && end == number.data() + number.size();
}

// The grammar's scanner: each method takes the position where its production starts and returns
// the position after it, or throws.
class Scanner {
 public:
  Scanner(std::string_view text, size_t max_depth) : text_(text), max_depth_(max_depth) {
    if (max_depth > kMaxJsonCheckDepth) {
      throw std::invalid_argument("json: a depth bound of " + std::to_string(max_depth) +
                                  " is more than " + std::to_string(kMaxJsonCheckDepth));
    }
  }

  // `depth`: the arrays and objects around the value.
  size_t value(size_t at, size_t depth) const {
    if (at >= text_.size()) fail(at, "the text ends where a value is expected");
    switch (text_[at]) {
      case '{':
        return container(at, depth, '}');
      case '[':
        return container(at, depth, ']');
      case '"':
        return string(at);
      case 't':
        return literal(at, "true");
      case 'f':
        return literal(at, "false");
      case 'n':
        return literal(at, "null");
      default:
        if (text_[at] == '-' || is_digit(text_[at])) return number(at);
        fail(at, quoted(text_.substr(at, 1)) + " where a value is expected");
    }
  }

  // A string from its opening quote; each escape checked, each byte of UTF-8 checked.
  size_t string(size_t at) const {
    const size_t start = at++;
    while (true) {
      if (at >= text_.size()) fail(start, "a string without its closing quote");
      const auto c = static_cast<uint8_t>(text_[at]);
      if (c == '"') return at + 1;
      if (c == '\\') {
        at = escape(at);
      } else if (c < 0x20) {
        fail(at, "a control character in a string (escape it)");
      } else if (c >= 0x80) {
        const size_t length = printable_detail::utf8_length(text_, at);
        if (length == 0) fail(at, "a string that is not valid UTF-8");
        at += length;
      } else {
        ++at;
      }
    }
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  size_t number(size_t at) const {
    const size_t start = at;
    bool exponent = false;
    if (at < text_.size() && text_[at] == '-') ++at;
    if (at >= text_.size() || !is_digit(text_[at])) fail(start, "a number without digits");
    if (text_[at] == '0') {
      ++at;
    } else {
      while (at < text_.size() && is_digit(text_[at])) ++at;
    }
    if (at < text_.size() && text_[at] == '.') {
      ++at;
      if (at >= text_.size() || !is_digit(text_[at])) fail(at, "a number without digits after '.'");
      while (at < text_.size() && is_digit(text_[at])) ++at;
    }
    if (at < text_.size() && (text_[at] == 'e' || text_[at] == 'E')) {
      ++at;
      if (at < text_.size() && (text_[at] == '+' || text_[at] == '-')) ++at;
      if (at >= text_.size() || !is_digit(text_[at]))
        fail(at, "a number's exponent without digits");
      while (at < text_.size() && is_digit(text_[at])) ++at;
      exponent = true;
    }
    // Only a number with an exponent or of 300 digits can pass double's range.
    double value = 0;
    if ((exponent || at - start > 300) && !to_double(text_.substr(start, at - start), value)) {
      fail(start, "a number beyond double's range");
    }
    return at;
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw std::runtime_error("json: " + what + ", at byte " + std::to_string(at));
  }

 private:
  size_t container(size_t at, size_t depth, char close) const {
    if (depth >= max_depth_) {
      fail(at, "arrays and objects nested more than " + std::to_string(max_depth_) + " deep");
    }
    const bool object = close == '}';
    at = skip_space(text_, at + 1);
    if (at < text_.size() && text_[at] == close) return at + 1;
    while (true) {
      if (object) {
        if (at >= text_.size() || text_[at] != '"') fail(at, "an object's key is not a string");
        at = skip_space(text_, string(at));
        if (at >= text_.size() || text_[at] != ':') fail(at, "':' expected after an object's key");
        at = skip_space(text_, at + 1);
      }
      at = skip_space(text_, value(at, depth + 1));
      if (at < text_.size() && text_[at] == ',') {
        at = skip_space(text_, at + 1);
        continue;
      }
      if (at < text_.size() && text_[at] == close) return at + 1;
      fail(at, std::string("',' or '") + close + "' expected");
    }
  }

  // An escape from its backslash.
  size_t escape(size_t at) const {
    if (at + 1 >= text_.size()) fail(at, "a string ends in its escape");
    const char c = text_[at + 1];
    if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
        c == 't') {
      return at + 2;
    }
    if (c != 'u') fail(at, "an unknown escape '\\" + printable(text_.substr(at + 1, 1)) + "'");
    const int32_t unit = hex4(text_, at + 2);
    if (unit < 0) fail(at, "\\u without four hex digits");
    if (unit >= 0xDC00 && unit <= 0xDFFF) fail(at, "a low surrogate escape without a high one");
    if (unit < 0xD800 || unit > 0xDBFF) return at + 6;
    if (text_.substr(at + 6, 2) != "\\u") fail(at, "a high surrogate escape without a low one");
    const int32_t low = hex4(text_, at + 8);
    if (low < 0xDC00 || low > 0xDFFF) fail(at, "a high surrogate escape without a low one");
    return at + 12;
  }

  size_t literal(size_t at, std::string_view word) const {
    if (text_.substr(at, word.size()) != word) {
      fail(at, quoted(text_.substr(at, word.size())) + " where a value is expected");
    }
    return at + word.size();
  }

  std::string_view text_;
  size_t max_depth_;
};

// The one value of `text` with its surrounding whitespace, as [begin, end); false when `text`
// is not one well-formed value whose scanner `scan` accepts (scan: Scanner, position -> end).
template <typename Scan>
bool one_value(std::string_view text, size_t& begin, size_t& end, Scan scan) {
  begin = skip_space(text, 0);
  try {
    end = scan(Scanner(text, 0), begin);
  } catch (const std::runtime_error&) {
    return false;
  }
  return skip_space(text, end) == text.size();
}

void append_utf8(std::string& out, uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

}  // namespace

void check_json(std::string_view text, size_t max_depth) {
  const Scanner scanner(text, max_depth);
  const size_t end = skip_space(text, scanner.value(skip_space(text, 0), 0));
  if (end != text.size()) scanner.fail(end, "text after the value");
}

size_t skip_json_value(std::string_view text, size_t at, size_t max_depth) {
  return Scanner(text, max_depth).value(at, 0);
}

bool json_string(std::string_view text, std::string& out) {
  size_t begin = 0;
  size_t end = 0;
  if (!one_value(text, begin, end, [&](const Scanner& s, size_t at) {
        if (at >= text.size() || text[at] != '"') s.fail(at, "not a string");
        return s.string(at);
      })) {
    return false;
  }
  out.clear();
  for (size_t at = begin + 1; at + 1 < end; ++at) {
    if (text[at] != '\\') {
      out += text[at];
      continue;
    }
    const char c = text[++at];
    switch (c) {
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        uint32_t code = static_cast<uint32_t>(hex4(text, at + 1));
        at += 4;
        if (code >= 0xD800 && code <= 0xDBFF) {  // the scanner checked the low half follows
          const auto low = static_cast<uint32_t>(hex4(text, at + 3));
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          at += 6;
        }
        append_utf8(out, code);
        break;
      }
      default:  // '"', '\\', '/'
        out += c;
    }
  }
  return true;
}

namespace {

// The text of the one JSON number `text` holds (white space around it allowed), or false.
bool one_number(std::string_view text, std::string_view& number) {
  size_t begin = 0;
  size_t end = 0;
  if (!one_value(text, begin, end, [&](const Scanner& s, size_t at) {
        if (at >= text.size() || (text[at] != '-' && !is_digit(text[at]))) {
          s.fail(at, "not a number");
        }
        return s.number(at);
      })) {
    return false;
  }
  number = text.substr(begin, end - begin);
  return true;
}

}  // namespace

bool json_integer(std::string_view text, int64_t& out) {
  std::string_view number;
  if (!one_number(text, number)) return false;
  if (number.find_first_of(".eE") != std::string_view::npos) return false;
  const auto [stop, error] = std::from_chars(number.data(), number.data() + number.size(), out);
  return error == std::errc() && stop == number.data() + number.size();
}

bool json_number(std::string_view text, double& out) {
  std::string_view number;
  return one_number(text, number) && to_double(number, out);
}

namespace {

constexpr size_t kNotAList = std::string_view::npos;

// The list of numbers that opens at text[at] ('['), appended to `out`: the position just after
// its ']', or kNotAList when it is not one. Throws as json_number_list past max_items numbers.
size_t append_number_list(std::string_view text, size_t at, std::vector<double>& out,
                          size_t max_items) {
  const Scanner scanner(text, 0);
  if (at >= text.size() || text[at] != '[') return kNotAList;
  at = skip_space(text, at + 1);
  if (at < text.size() && text[at] == ']') return at + 1;
  while (true) {
    if (at >= text.size() || (text[at] != '-' && !is_digit(text[at]))) return kNotAList;
    size_t end = 0;
    try {
      end = scanner.number(at);
    } catch (const std::runtime_error&) {
      return kNotAList;
    }
    double value = 0;
    if (!to_double(text.substr(at, end - at), value)) return kNotAList;
    if (out.size() == max_items) {
      throw std::length_error("json: a list of more than " + std::to_string(max_items) +
                              " numbers");
    }
    out.push_back(value);
    at = skip_space(text, end);
    if (at < text.size() && text[at] == ',') {
      at = skip_space(text, at + 1);
      continue;
    }
    if (at < text.size() && text[at] == ']') return at + 1;
    return kNotAList;
  }
}

}  // namespace

bool json_number_list(std::string_view text, std::vector<double>& out, size_t max_items) {
  out.clear();
  const size_t end = append_number_list(text, skip_space(text, 0), out, max_items);
  return end != kNotAList && skip_space(text, end) == text.size();
}

bool json_number_rows(std::string_view text, std::vector<double>& out, size_t& columns,
                      size_t max_items) {
  out.clear();
  columns = 0;
  size_t at = skip_space(text, 0);
  if (at >= text.size() || text[at] != '[') return false;
  at = skip_space(text, at + 1);
  if (at < text.size() && text[at] == ']') return skip_space(text, at + 1) == text.size();
  for (size_t row = 0;; ++row) {
    const size_t before = out.size();
    const size_t end = append_number_list(text, at, out, max_items);
    if (end == kNotAList) return false;
    if (row == 0) columns = out.size() - before;
    if (out.size() - before != columns) return false;
    at = skip_space(text, end);
    if (at < text.size() && text[at] == ',') {
      at = skip_space(text, at + 1);
      continue;
    }
    if (at < text.size() && text[at] == ']') return skip_space(text, at + 1) == text.size();
    return false;
  }
}

}  // namespace conveyor::detail
