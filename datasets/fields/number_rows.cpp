// fields/number_rows.h: a member read as rows of numbers (boxes, points).
#include "fields/number_rows.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "conveyor/internal/printable.h"
#include "fields/field_writer.h"
#include "fields/json_value.h"
#include "fields/npy.h"

namespace conveyor::detail {

namespace {

constexpr uint8_t kNpyMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

template <typename T>
void widen(const uint8_t* data, size_t count, double* out) {
  for (size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof v);
    out[i] = static_cast<double>(v);
  }
}

// `count` values of `dtype` at `data` into `out`; false for a dtype that is not a number.
bool widen(c10::ScalarType dtype, const uint8_t* data, size_t count, double* out) {
  switch (dtype) {
    case c10::ScalarType::Bool:
    case c10::ScalarType::Byte:
      widen<uint8_t>(data, count, out);
      return true;
    case c10::ScalarType::Char:
      widen<int8_t>(data, count, out);
      return true;
    case c10::ScalarType::Short:
      widen<int16_t>(data, count, out);
      return true;
    case c10::ScalarType::Int:
      widen<int32_t>(data, count, out);
      return true;
    case c10::ScalarType::Long:
      widen<int64_t>(data, count, out);
      return true;
    case c10::ScalarType::Half:
      widen<c10::Half>(data, count, out);
      return true;
    case c10::ScalarType::BFloat16:
      widen<c10::BFloat16>(data, count, out);
      return true;
    case c10::ScalarType::Float:
      widen<float>(data, count, out);
      return true;
    case c10::ScalarType::Double:
      widen<double>(data, count, out);
      return true;
    default:
      return false;
  }
}

std::string shape_text(const int64_t* shape, size_t ndim) {
  std::string s = "[";
  for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string columns_text(const RowShape& shape) {
  return shape.min_columns == shape.max_columns
             ? std::to_string(shape.min_columns)
             : std::to_string(shape.min_columns) + " or " + std::to_string(shape.max_columns);
}

class Reader {
 public:
  Reader(const std::string& field, const Member& member, const RowShape& shape, NumberRows& out)
      : field_(field), member_(member), shape_(shape), out_(out) {}

  void read() {
    out_.rows = 0;
    out_.columns = 0;
    if (member_.encoding == MemberEncoding::kArray) {
      read_typed("an array", member_.dtype, member_.shape, member_.ndim, member_.data);
    } else if (member_.encoding == MemberEncoding::kFile && member_.size >= sizeof kNpyMagic &&
               std::memcmp(member_.data, kNpyMagic, sizeof kNpyMagic) == 0) {
      NpyArray a;
      try {
        a = parse_npy(member_.data, member_.size);
      } catch (const std::exception& e) {
        throw error(std::string("is not a readable .npy: ") + e.what());
      }
      read_typed("an .npy", a.dtype, a.shape.data(), a.shape.size(), a.data);
    } else if (member_.encoding == MemberEncoding::kFile ||
               member_.encoding == MemberEncoding::kJson) {
      read_list();
    } else {
      throw_unreadable(field_, member_, wanted());
    }
  }

 private:
  std::string wanted() const {
    return std::string("an .npy or a JSON list of ") + shape_.items + " of " +
           columns_text(shape_) + " numbers";
  }

  std::runtime_error error(const std::string& why) const {
    return std::runtime_error(field_label(field_) + ": member \"" + printable(member_.name) +
                              "\" " + why);
  }

  void check_rows(size_t rows) const {
    if (rows > shape_.max_rows) {
      throw error("holds " + std::to_string(rows) + " " + shape_.items + ", over the field's " +
                  "bound of " + std::to_string(shape_.max_rows) + " (max_bytes " +
                  std::to_string(shape_.max_bytes) + ")");
    }
  }

  void check_columns(size_t columns, const std::string& what) const {
    if (columns < shape_.min_columns || columns > shape_.max_columns) {
      throw error("is " + what + ", not " + shape_.items + " of " + columns_text(shape_) +
                  " numbers");
    }
  }

  void read_typed(const char* what, c10::ScalarType dtype, const int64_t* shape, size_t ndim,
                  const uint8_t* data) {
    const std::string described = std::string(what) + " of shape " + shape_text(shape, ndim);
    if (ndim == 1 && shape[0] == 0) return;  // no rows
    if (ndim != 2) check_columns(0, described);
    const size_t rows = static_cast<size_t>(shape[0]), columns = static_cast<size_t>(shape[1]);
    check_columns(columns, described);
    check_rows(rows);
    out_.values.resize(rows * columns);
    if (!widen(dtype, data, rows * columns, out_.values.data())) {
      throw error(std::string("holds ") + c10::toString(dtype) + ", not numbers");
    }
    out_.rows = rows;
    out_.columns = columns;
  }

  void read_list() {
    const std::string_view text(reinterpret_cast<const char*>(member_.data), member_.size);
    const size_t most = shape_.max_rows * shape_.max_columns;
    size_t columns = 0;
    bool read = false;
    try {
      read = json_number_rows(text, out_.values, columns, most);
      if (!read && shape_.flat_columns > 0 && json_number_list(text, out_.values, most)) {
        read = true;
        columns = shape_.flat_columns;
        if (out_.values.size() % columns != 0) {
          throw error("lists " + std::to_string(out_.values.size()) + " numbers, not " +
                      shape_.items + " of " + std::to_string(columns));
        }
      }
    } catch (const std::length_error&) {
      throw error(std::string("lists more numbers than the field holds (") +
                  std::to_string(shape_.max_rows) + " " + shape_.items + ", max_bytes " +
                  std::to_string(shape_.max_bytes) + ")");
    }
    if (!read) throw error("is not " + wanted());
    if (out_.values.empty()) return;
    check_columns(columns, "a list of lists of " + std::to_string(columns) + " numbers");
    out_.rows = out_.values.size() / columns;
    out_.columns = columns;
    check_rows(out_.rows);
  }

  const std::string& field_;
  const Member& member_;
  const RowShape& shape_;
  NumberRows& out_;
};

}  // namespace

void read_number_rows(const std::string& field, const Member& member, const RowShape& shape,
                      NumberRows& out) {
  Reader(field, member, shape, out).read();
}

}  // namespace conveyor::detail
