// The bytes, text and json fields (conveyor/fields.h): ragged uint8 rows, host_only. Bytes are
// the member as it is; text is checked UTF-8 (a JSON Lines cell's string unquoted); json is a
// checked JSON value's text (well formed, nested at most Field::kMaxJsonDepth).
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fields/field_writer.h"
#include "fields/json_value.h"

namespace conveyor::detail {

namespace {

// Where the first byte that is not well-formed UTF-8 is (RFC 3629: no overlongs, no surrogates,
// nothing past U+10FFFF), or npos.
size_t invalid_utf8_at(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t min = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80, cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800, cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000, cp = c & 0x07u;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

// Writes `size` bytes into a ragged uint8 row of at most spec.max_items, or throws naming the
// bound and its option.
void write_bytes(const std::string& name, const FieldSpec& spec, const Member& member,
                 const uint8_t* data, size_t size, std::byte* row) {
  if (size > spec.max_items) {
    throw std::runtime_error(field_label(name) + ": member \"" + std::string(member.name) +
                             "\" is " + std::to_string(size) +
                             " bytes, over the field's bound of " + std::to_string(spec.max_items) +
                             " (max_bytes)");
  }
  RaggedRow out(row);
  if (size > 0) std::memcpy(out.items(), data, size);
  out.set_count(static_cast<int64_t>(size));
}

bool is_number(const Member& member) {
  return member.encoding == MemberEncoding::kInteger ||
         member.encoding == MemberEncoding::kFloating;
}

// A number the kind knows (an ImageFolder's class, a reader's float), as its decimal text.
void write_number(const std::string& name, const FieldSpec& spec, const Member& member,
                  std::byte* row) {
  const std::string text = number_text(member);
  write_bytes(name, spec, member, reinterpret_cast<const uint8_t*>(text.data()), text.size(), row);
}

class BytesWriter final : public FieldWriter {
 public:
  static constexpr const char* kWanted = "bytes";
  BytesWriter(std::string name, FieldSpec spec) : name_(std::move(name)), spec_(std::move(spec)) {}
  void write(const Member& member, const SampleContext&, std::byte* row) override {
    if (is_number(member)) {
      write_number(name_, spec_, member, row);
      return;
    }
    if (member.encoding == MemberEncoding::kArray) throw_unreadable(name_, member, kWanted);
    write_bytes(name_, spec_, member, member.data, member.size, row);
  }

 private:
  std::string name_;
  FieldSpec spec_;
};

class TextWriter final : public FieldWriter {
 public:
  static constexpr const char* kWanted = "text";
  TextWriter(std::string name, FieldSpec spec) : name_(std::move(name)), spec_(std::move(spec)) {}
  void write(const Member& member, const SampleContext&, std::byte* row) override {
    if (is_number(member)) {
      write_number(name_, spec_, member, row);
      return;
    }
    if (member.encoding == MemberEncoding::kArray) throw_unreadable(name_, member, kWanted);
    if (member.encoding == MemberEncoding::kJson) {
      // A JSON Lines cell: a string is its text; another value (a number) is its JSON text.
      const std::string_view cell(reinterpret_cast<const char*>(member.data), member.size);
      if (!json_string(cell, unquoted_)) unquoted_.assign(cell);
      check_utf8(member, reinterpret_cast<const uint8_t*>(unquoted_.data()), unquoted_.size());
      write_bytes(name_, spec_, member, reinterpret_cast<const uint8_t*>(unquoted_.data()),
                  unquoted_.size(), row);
      return;
    }
    check_utf8(member, member.data, member.size);
    write_bytes(name_, spec_, member, member.data, member.size, row);
  }

 private:
  void check_utf8(const Member& member, const uint8_t* data, size_t size) const {
    const size_t bad = invalid_utf8_at(data, size);
    if (bad != std::string::npos) {
      throw std::runtime_error(field_label(name_) + ": member \"" + std::string(member.name) +
                               "\" is not UTF-8 text (byte " + std::to_string(bad) + ")");
    }
  }
  std::string name_;
  FieldSpec spec_;
  std::string unquoted_;  // reused
};

class JsonWriter final : public FieldWriter {
 public:
  static constexpr const char* kWanted = "JSON text";
  JsonWriter(std::string name, FieldSpec spec) : name_(std::move(name)), spec_(std::move(spec)) {}
  void write(const Member& member, const SampleContext&, std::byte* row) override {
    if (member.encoding == MemberEncoding::kFloating && !std::isfinite(member.floating)) {
      throw_unreadable(name_, member, "a JSON number (JSON has no NaN or infinity)");
    }
    if (is_number(member)) {
      write_number(name_, spec_, member, row);
      return;
    }
    if (member.encoding == MemberEncoding::kArray) throw_unreadable(name_, member, kWanted);
    // The bound first: a value over it is refused before it is parsed.
    if (member.size > spec_.max_items) {
      write_bytes(name_, spec_, member, member.data, member.size, row);  // throws
    }
    const std::string_view text(reinterpret_cast<const char*>(member.data), member.size);
    try {
      check_json(text, Field::kMaxJsonDepth);
    } catch (const std::exception& e) {
      throw std::runtime_error(field_label(name_) + ": member \"" + std::string(member.name) +
                               "\" is not JSON: " + e.what());
    }
    write_bytes(name_, spec_, member, member.data, member.size, row);
  }

 private:
  std::string name_;
  FieldSpec spec_;
};

}  // namespace

std::unique_ptr<FieldWriter> make_bytes_writer(const std::string& name, const FieldSpec& spec) {
  return std::make_unique<BytesWriter>(name, spec);
}

std::unique_ptr<FieldWriter> make_text_writer(const std::string& name, const FieldSpec& spec) {
  return std::make_unique<TextWriter>(name, spec);
}

std::unique_ptr<FieldWriter> make_json_writer(const std::string& name, const FieldSpec& spec) {
  return std::make_unique<JsonWriter>(name, spec);
}

}  // namespace conveyor::detail
