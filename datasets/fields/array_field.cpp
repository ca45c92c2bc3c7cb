// The array field (conveyor/fields.h): an .npy member (its dtype and shape the declared ones;
// object arrays refused, never unpickled) or a JSON list of numbers (a manifest cell), fixed or
// ragged in its first dimension; with multi_hot, a list of class indices made a multi-hot row.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fields/field_writer.h"
#include "fields/json_value.h"
#include "fields/npy.h"

namespace conveyor::detail {

namespace {

constexpr uint8_t kNpyMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

bool is_npy(const Member& member) {
  return member.encoding == MemberEncoding::kFile && member.size >= sizeof kNpyMagic &&
         std::memcmp(member.data, kNpyMagic, sizeof kNpyMagic) == 0;
}

std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Stores `v` as element `i` of `out`, of `dtype`; false when it does not fit (an integer type
// given a fraction or a value out of its range, a bool given other than 0 or 1).
template <typename T>
bool store_integer(double v, std::byte* out, size_t i) {
  if (!(std::floor(v) == v) || v < static_cast<double>(std::numeric_limits<T>::lowest()) ||
      v > static_cast<double>(std::numeric_limits<T>::max())) {
    return false;
  }
  const T t = static_cast<T>(v);
  std::memcpy(out + i * sizeof(T), &t, sizeof t);
  return true;
}

template <typename T>
bool store_float(double v, std::byte* out, size_t i) {
  const T t = static_cast<T>(static_cast<float>(v));
  std::memcpy(out + i * sizeof(T), &t, sizeof t);
  return true;
}

bool store(c10::ScalarType dtype, double v, std::byte* out, size_t i) {
  switch (dtype) {
    case c10::ScalarType::Bool: {
      if (v != 0 && v != 1) return false;
      const bool b = v != 0;
      std::memcpy(out + i, &b, 1);
      return true;
    }
    case c10::ScalarType::Byte:
      return store_integer<uint8_t>(v, out, i);
    case c10::ScalarType::Char:
      return store_integer<int8_t>(v, out, i);
    case c10::ScalarType::Short:
      return store_integer<int16_t>(v, out, i);
    case c10::ScalarType::Int:
      return store_integer<int32_t>(v, out, i);
    case c10::ScalarType::Long:
      // doubles hold integers exactly up to 2^53; larger list values are refused as out of range
      if (std::fabs(v) > 9007199254740992.0) return false;
      return store_integer<int64_t>(v, out, i);
    case c10::ScalarType::Half:
      return store_float<c10::Half>(v, out, i);
    case c10::ScalarType::BFloat16:
      return store_float<c10::BFloat16>(v, out, i);
    case c10::ScalarType::Float: {
      const float f = static_cast<float>(v);
      std::memcpy(out + i * sizeof f, &f, sizeof f);
      return true;
    }
    case c10::ScalarType::Double:
      std::memcpy(out + i * sizeof v, &v, sizeof v);
      return true;
    default:
      return false;
  }
}

class ArrayWriter final : public FieldWriter {
 public:
  ArrayWriter(std::string name, const Field& field, FieldSpec spec)
      : name_(std::move(name)), multi_hot_(field.multi_hot), spec_(std::move(spec)) {
    declared_ = field.shape;
  }

  void write(const Member& member, const SampleContext&, std::byte* row) override {
    if (member.encoding == MemberEncoding::kArray) {
      write_typed(member, "an array", member.dtype, c10::IntArrayRef(member.shape, member.ndim),
                  member.data, member.size, row);
    } else if (is_npy(member)) {
      write_npy(member, row);
    } else {
      write_list(member, row);
    }
  }

 private:
  std::runtime_error error(const Member& member, const std::string& why) const {
    return std::runtime_error(field_label(name_) + ": member \"" + std::string(member.name) +
                              "\" " + why);
  }

  void write_npy(const Member& member, std::byte* row) {
    NpyArray a;
    try {
      a = parse_npy(member.data, member.size);
    } catch (const std::exception& e) {
      throw error(member, std::string("is not a readable .npy: ") + e.what());
    }
    write_typed(member, "an .npy", a.dtype, a.shape, a.data, a.bytes, row);
  }

  // An array of `dtype` and `shape` (an .npy's, a MemberReader's), `bytes` of it at `data`.
  void write_typed(const Member& member, const char* what, c10::ScalarType dtype,
                   c10::IntArrayRef shape, const uint8_t* data, size_t bytes, std::byte* row) {
    if (dtype != spec_.dtype) {
      throw error(member, std::string("holds ") + c10::toString(dtype) + ", not the declared " +
                              c10::toString(spec_.dtype));
    }
    if (multi_hot_) {
      throw error(member,
                  std::string("is ") + what + ", and a multi_hot field reads a list of indices");
    }
    if (!spec_.ragged()) {
      if (!shape.equals(spec_.sample_shape)) {
        throw error(member, "has shape " + shape_text(shape) + ", not the declared " +
                                shape_text(spec_.sample_shape));
      }
      std::memcpy(row, data, bytes);
      return;
    }
    // A ragged field of shape [-1] takes an array of any shape, flattened (its items are the
    // elements); otherwise the items' shape is the declared one.
    size_t items = bytes / c10::elementSize(dtype);
    if (!spec_.sample_shape.empty()) {
      if (shape.empty() || !shape.slice(1).equals(spec_.sample_shape)) {
        throw error(member, "has shape " + shape_text(shape) + ", not the declared " +
                                shape_text(declared_));
      }
      items = static_cast<size_t>(shape[0]);
    }
    if (items > spec_.max_items) {
      throw error(member, "holds " + std::to_string(items) + " items (" + std::to_string(bytes) +
                              " bytes), over the field's bound of " +
                              std::to_string(spec_.max_items) + " items (max_bytes " +
                              std::to_string(spec_.max_items * spec_.item_bytes()) + ")");
    }
    RaggedRow out(row);
    if (bytes > 0) std::memcpy(out.items(), data, bytes);
    out.set_count(static_cast<int64_t>(items));
  }

  void write_list(const Member& member, std::byte* row) {
    if (member.encoding == MemberEncoding::kInteger) {
      values_.assign(1, static_cast<double>(member.integer));
    } else if (member.encoding == MemberEncoding::kFloating) {
      values_.assign(1, member.floating);
    } else {
      const std::string_view text(reinterpret_cast<const char*>(member.data), member.size);
      const size_t item_values = spec_.item_bytes() / c10::elementSize(spec_.dtype);
      const size_t most = multi_hot_       ? static_cast<size_t>(spec_.sample_shape[0])
                          : spec_.ragged() ? spec_.max_items * item_values
                                           : spec_.item_bytes() / c10::elementSize(spec_.dtype);
      bool list = false;
      try {
        list = json_number_list(text, values_, most);
      } catch (const std::exception& e) {
        throw error(member, std::string("lists more numbers than the field holds (") +
                                std::to_string(most) + (spec_.ragged() ? ", max_bytes" : "") +
                                "): " + e.what());
      }
      if (!list) throw error(member, "is neither an .npy file nor a JSON list of numbers");
    }
    if (multi_hot_) {
      const int64_t classes = spec_.sample_shape[0];
      std::memset(row, 0, spec_.item_bytes());
      for (double v : values_) {
        if (!(std::floor(v) == v) || v < 0 || v >= static_cast<double>(classes)) {
          throw error(member, "lists " + std::to_string(v) + ", not a class index in [0, " +
                                  std::to_string(classes) + ")");
        }
        store(spec_.dtype, 1.0, row, static_cast<size_t>(v));
      }
      return;
    }
    const size_t item_values = spec_.item_bytes() / c10::elementSize(spec_.dtype);
    std::byte* out = row;
    size_t items = 0;
    if (spec_.ragged()) {
      if (item_values == 0 || values_.size() % item_values != 0) {
        throw error(member, "lists " + std::to_string(values_.size()) +
                                " numbers, not a whole number of items of shape " +
                                shape_text(spec_.sample_shape));
      }
      items = values_.size() / item_values;
      out = RaggedRow(row).items();
    } else if (values_.size() != item_values) {
      throw error(member, "lists " + std::to_string(values_.size()) + " numbers, not the " +
                              std::to_string(item_values) + " of shape " +
                              shape_text(spec_.sample_shape));
    }
    for (size_t i = 0; i < values_.size(); ++i) {
      if (!store(spec_.dtype, values_[i], out, i)) {
        throw error(member, "lists " + std::to_string(values_[i]) + ", which is not a " +
                                c10::toString(spec_.dtype));
      }
    }
    if (spec_.ragged()) RaggedRow(row).set_count(static_cast<int64_t>(items));
  }

  std::string name_;
  bool multi_hot_;
  FieldSpec spec_;
  std::vector<int64_t> declared_;
  std::vector<double> values_;  // a list's numbers, reused
};

}  // namespace

std::unique_ptr<FieldWriter> make_array_writer(const std::string& name, const Field& field,
                                               const FieldSpec& spec) {
  return std::make_unique<ArrayWriter>(name, field, spec);
}

}  // namespace conveyor::detail
