// numpy's .npy format (npy.h): the header's dict literal read by a small strict reader.
#include "fields/npy.h"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "conveyor/internal/printable.h"

namespace conveyor::detail {

namespace {

constexpr std::string_view kMagic("\x93NUMPY", 6);

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("npy: " + what); }

// The header's text: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } and the
// padding after it. Whitespace may stand between any two tokens, as in Python.
class HeaderReader {
 public:
  explicit HeaderReader(std::string_view text) : text_(text) {}

  struct Header {
    std::string_view descr;
    bool fortran_order = false;
    std::vector<int64_t> shape;
  };

  Header read() {
    Header header;
    bool has_descr = false;
    bool has_order = false;
    bool has_shape = false;
    expect('{', "the header is not a dict ('{' expected)");
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string_view key = quoted("a key");
      skip_space();
      expect(':', "':' expected after the key '" + printable(key) + "'");
      skip_space();
      if (key == "descr") {
        once(has_descr, key);
        if (peek() == '[') fail("a structured dtype (descr is a list) is not read");
        header.descr = quoted("the descr");
      } else if (key == "fortran_order") {
        once(has_order, key);
        header.fortran_order = boolean();
      } else if (key == "shape") {
        once(has_shape, key);
        header.shape = tuple();
      } else {
        fail("the header has a key '" + printable(key) +
             "' (a header has only 'descr', 'fortran_order' and 'shape')");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != '}') fail("',' or '}' expected in the header, not " + shown());
    }
    ++at_;  // '}'
    while (at_ < text_.size()) {
      if (text_[at_] != ' ' && text_[at_] != '\n' && text_[at_] != '\t' && text_[at_] != '\r') {
        fail("text after the header's dict: " + shown());
      }
      ++at_;
    }
    if (!has_descr || !has_order || !has_shape) {
      fail(std::string("the header lacks '") +
           (!has_descr   ? "descr"
            : !has_order ? "fortran_order"
                         : "shape") +
           "'");
    }
    return header;
  }

 private:
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }

  std::string shown() const {
    if (at_ >= text_.size()) return "the header's end";
    return detail::quoted(text_.substr(at_, 16));
  }

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r')) {
      ++at_;
    }
  }

  void expect(char c, const std::string& what) {
    skip_space();
    if (peek() != c) fail(what + ", found " + shown());
    ++at_;
  }

  static void once(bool& seen, std::string_view key) {
    if (seen) fail("the header gives '" + std::string(key) + "' twice");
    seen = true;
  }

  // A string in ' or " without escapes (a header's strings never need one).
  std::string_view quoted(const char* what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(std::string(what) + " is not a string: " + shown());
    const size_t start = ++at_;
    while (at_ < text_.size() && text_[at_] != quote) {
      const auto c = static_cast<unsigned char>(text_[at_]);
      if (c == '\\' || c < 0x20 || c >= 0x7F) {
        fail(std::string(what) + " holds an escape or a byte that is not printable ASCII");
      }
      ++at_;
    }
    if (at_ >= text_.size()) fail(std::string(what) + " has no closing quote");
    return text_.substr(start, at_++ - start);
  }

  bool boolean() {
    const std::string_view rest = text_.substr(at_);
    if (rest.substr(0, 4) == "True") {
      at_ += 4;
      return true;
    }
    if (rest.substr(0, 5) == "False") {
      at_ += 5;
      return false;
    }
    fail("fortran_order is not True or False: " + shown());
  }

  // A tuple of decimal integers: (), (3,), (3, 4) or (3, 4,).
  std::vector<int64_t> tuple() {
    std::vector<int64_t> shape;
    expect('(', "the shape is not a tuple ('(' expected)");
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (shape.size() == kMaxNpyDims) {
        fail("the shape has more than " + std::to_string(kMaxNpyDims) + " dimensions");
      }
      shape.push_back(dimension());
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != ')') fail("',' or ')' expected in the shape, not " + shown());
      if (shape.size() == 1) fail("the shape (N) is not a tuple: (N,) is");
    }
    ++at_;  // ')'
    return shape;
  }

  int64_t dimension() {
    if (peek() == '-') fail("the shape has a negative dimension");
    if (peek() < '0' || peek() > '9') fail("a dimension is not a decimal integer: " + shown());
    int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) {
        fail("a dimension of the shape does not fit in 64 bits");
      }
      value = value * 10 + digit;
      ++at_;
    }
    if (peek() == 'L' || peek() == '.' || peek() == 'e' || peek() == 'x' || peek() == '_') {
      fail("a dimension is not a decimal integer: " + shown());
    }
    return value;
  }

  std::string_view text_;
  size_t at_ = 0;
};

struct Dtype {
  c10::ScalarType type;
  size_t size;
};

Dtype dtype_of(std::string_view descr) {
  if (descr == "O" || (descr.size() >= 2 && descr[1] == 'O')) {
    fail("dtype object ('" + printable(descr) +
         "'): its data is a pickle, and Conveyor never unpickles (numpy's allow_pickle=False); "
         "save the array with a numeric dtype");
  }
  if (descr.empty() || (descr[0] != '<' && descr[0] != '|' && descr[0] != '>')) {
    fail("descr '" + printable(descr) + "' has no byte order ('<', '|' or '>')");
  }
  const std::string_view type = descr.substr(1);
  struct Known {
    std::string_view name;
    c10::ScalarType type;
    size_t size;
  };
  static constexpr Known kKnown[] = {
      {"b1", c10::ScalarType::Bool, 1},         {"i1", c10::ScalarType::Char, 1},
      {"i2", c10::ScalarType::Short, 2},        {"i4", c10::ScalarType::Int, 4},
      {"i8", c10::ScalarType::Long, 8},         {"u1", c10::ScalarType::Byte, 1},
      {"u2", c10::ScalarType::UInt16, 2},       {"u4", c10::ScalarType::UInt32, 4},
      {"u8", c10::ScalarType::UInt64, 8},       {"f2", c10::ScalarType::Half, 2},
      {"f4", c10::ScalarType::Float, 4},        {"f8", c10::ScalarType::Double, 8},
      {"c8", c10::ScalarType::ComplexFloat, 8}, {"c16", c10::ScalarType::ComplexDouble, 16},
  };
  for (const Known& known : kKnown) {
    if (type != known.name) continue;
    if (descr[0] == '>' && known.size > 1) {
      fail("descr '" + std::string(descr) +
           "' is big-endian, which is not read (save it little-endian: "
           "arr.astype(arr.dtype.newbyteorder('<')))");
    }
    if (descr[0] == '|' && known.size > 1) {
      fail("descr '" + std::string(descr) + "': '|' (no byte order) for a multi-byte type");
    }
    return {known.type, known.size};
  }
  fail("descr '" + printable(descr) +
       "' has no torch dtype (read: b1, i1-i8, u1-u8, f2, f4, f8, c8, c16)");
}

uint32_t little_endian(const uint8_t* p, size_t bytes) {
  uint32_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= uint32_t{p[i]} << (8 * i);
  return value;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

NpyArray parse_npy(const uint8_t* data, size_t size) {
  if (size < kMagic.size() + 2 || std::memcmp(data, kMagic.data(), kMagic.size()) != 0) {
    fail("not a .npy file (no \\x93NUMPY magic)");
  }
  const uint8_t major = data[6];
  const uint8_t minor = data[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail("format version " + std::to_string(major) + "." + std::to_string(minor) +
         " is not read (1.0, 2.0 and 3.0 are)");
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix = 8 + length_bytes;
  if (size < prefix) fail("the file ends inside the header's length");
  const size_t header_size = little_endian(data + 8, length_bytes);
  if (header_size > size - prefix) {
    fail("the header claims " + std::to_string(header_size) + " bytes, the file has " +
         std::to_string(size - prefix) + " after the magic");
  }
  const std::string_view text(reinterpret_cast<const char*>(data + prefix), header_size);
  HeaderReader::Header header = HeaderReader(text).read();

  const Dtype dtype = dtype_of(header.descr);
  if (header.fortran_order) {
    fail(
        "fortran_order True is not read (it would need a transposing copy): save "
        "np.ascontiguousarray(arr)");
  }
  // The array's bytes, checked for overflow at each step: a product of int64 dimensions may
  // exceed size_t long before its last factor.
  size_t bytes = dtype.size;
  bool zero = false;
  for (int64_t dim : header.shape) zero = zero || dim == 0;
  if (zero) {
    bytes = 0;
  } else {
    for (int64_t dim : header.shape) {
      if (static_cast<uint64_t>(dim) > std::numeric_limits<size_t>::max() / bytes) {
        fail("the shape " + shape_text(header.shape) + " of " + std::to_string(dtype.size) +
             "-byte items is more bytes than can be addressed");
      }
      bytes *= static_cast<size_t>(dim);
    }
  }
  const size_t have = size - prefix - header_size;
  if (have != bytes) {
    fail("the shape " + shape_text(header.shape) + " of '" + std::string(header.descr) +
         "' needs " + std::to_string(bytes) + " bytes of data, the file has " +
         std::to_string(have) + (have < bytes ? " (truncated)" : " (bytes after the array)"));
  }
  NpyArray array;
  array.dtype = dtype.type;
  array.shape = std::move(header.shape);
  array.data = data + prefix + header_size;
  array.bytes = bytes;
  return array;
}

}  // namespace conveyor::detail
