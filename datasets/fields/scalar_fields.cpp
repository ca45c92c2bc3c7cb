// The integer and floating fields (conveyor/fields.h): decimal text (a WebDataset cls, a CSV
// cell), a JSON number (a JSON Lines cell), or a number the kind knows (an ImageFolder's class).
#include <charconv>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "fields/field_writer.h"

namespace conveyor::detail {

namespace {

// A scalar member's text is at most this long (a 64-bit number and some white space).
constexpr size_t kMaxScalarBytes = 64;

// The member's text without leading and trailing ASCII white space.
std::string_view trimmed(const Member& member) {
  std::string_view text(reinterpret_cast<const char*>(member.data), member.size);
  const auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

template <typename T>
T parse_scalar(const std::string& name, const Member& member, const char* what) {
  if (member.encoding == MemberEncoding::kInteger) return static_cast<T>(member.integer);
  if (member.encoding == MemberEncoding::kFloating) {
    // A floating field takes it; an integer field refuses it rather than round it.
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(member.floating);
    throw_unreadable(name, member, what);
  }
  if (member.encoding == MemberEncoding::kArray) throw_unreadable(name, member, what);
  if (member.size > kMaxScalarBytes) {
    throw std::runtime_error(field_label(name) + ": member \"" + std::string(member.name) +
                             "\" is " + std::to_string(member.size) + " bytes, not " + what);
  }
  std::string_view text = trimmed(member);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);  // from_chars takes no '+'
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    throw std::runtime_error(field_label(name) + ": member \"" + std::string(member.name) +
                             "\" is " + member_text(member) + ", not " + what);
  }
  return value;
}

class IntegerWriter final : public FieldWriter {
 public:
  explicit IntegerWriter(std::string name) : name_(std::move(name)) {}
  void write(const Member& member, const SampleContext&, std::byte* row) override {
    const int64_t v = parse_scalar<int64_t>(name_, member, "an integer (decimal text)");
    std::memcpy(row, &v, sizeof v);
  }

 private:
  std::string name_;
};

class FloatingWriter final : public FieldWriter {
 public:
  explicit FloatingWriter(std::string name) : name_(std::move(name)) {}
  void write(const Member& member, const SampleContext&, std::byte* row) override {
    const float v = static_cast<float>(parse_scalar<double>(name_, member, "a number"));
    std::memcpy(row, &v, sizeof v);
  }

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<FieldWriter> make_integer_writer(const std::string& name) {
  return std::make_unique<IntegerWriter>(name);
}

std::unique_ptr<FieldWriter> make_floating_writer(const std::string& name) {
  return std::make_unique<FloatingWriter>(name);
}

}  // namespace conveyor::detail
