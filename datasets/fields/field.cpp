// Field (conveyor/fields.h): each kind's description and layout, and the table from kind to writer.
#include <array>
#include <charconv>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "conveyor/fields.h"
#include "conveyor/geometry.h"
#include "conveyor/internal/printable.h"
#include "fields/field_writer.h"

namespace conveyor {

namespace {

Field make(Field::Kind kind, std::string keys) {
  Field f;
  f.kind = kind;
  f.keys = std::move(keys);
  return f;
}

}  // namespace

Field Field::image(std::string keys, ImageTransform transform) {
  Field f = make(Kind::kImage, std::move(keys));
  f.transform = transform;
  return f;
}

Field Field::integer(std::string keys) { return make(Kind::kInteger, std::move(keys)); }

Field Field::floating(std::string keys) { return make(Kind::kFloating, std::move(keys)); }

Field Field::array(std::string keys, c10::ScalarType dtype, std::vector<int64_t> shape,
                   size_t max_bytes) {
  Field f = make(Kind::kArray, std::move(keys));
  f.dtype = dtype;
  f.shape = std::move(shape);
  f.max_bytes = max_bytes;
  return f;
}

Field Field::multi_hot_array(std::string keys, int64_t classes, c10::ScalarType dtype) {
  Field f = array(std::move(keys), dtype, {classes});
  f.multi_hot = true;
  return f;
}

Field Field::bytes(std::string keys, size_t max_bytes) {
  Field f = make(Kind::kBytes, std::move(keys));
  f.max_bytes = max_bytes;
  return f;
}

Field Field::text(std::string keys, size_t max_bytes) {
  Field f = make(Kind::kText, std::move(keys));
  f.max_bytes = max_bytes;
  return f;
}

Field Field::json(std::string keys, size_t max_bytes) {
  Field f = make(Kind::kJson, std::move(keys));
  f.max_bytes = max_bytes;
  return f;
}

Field Field::mask(std::string keys, std::string follows, c10::ScalarType dtype) {
  Field f = make(Kind::kMask, std::move(keys));
  f.follows = std::move(follows);
  f.dtype = dtype;
  return f;
}

Field Field::boxes(std::string keys, std::string follows, std::vector<std::string> paired,
                   BoxRule rule, size_t max_bytes) {
  Field f = make(Kind::kBoxes, std::move(keys));
  f.follows = std::move(follows);
  f.paired = std::move(paired);
  f.box_rule = rule;
  f.max_bytes = max_bytes;
  return f;
}

Field Field::points(std::string keys, std::string follows, int point_columns, size_t max_bytes) {
  Field f = make(Kind::kPoints, std::move(keys));
  f.follows = std::move(follows);
  f.point_columns = point_columns;
  f.max_bytes = max_bytes;
  return f;
}

Field Field::plan(std::string follows) {
  Field f = make(Kind::kPlan, "");
  f.follows = std::move(follows);
  return f;
}

std::vector<std::string> Field::key_list() const {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= keys.size()) {
    size_t end = keys.find(';', begin);
    if (end == std::string::npos) end = keys.size();
    std::string key = keys.substr(begin, end - begin);
    for (char& c : key) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    if (!key.empty()) out.push_back(std::move(key));
    begin = end + 1;
  }
  return out;
}

FieldSpec Field::spec(const std::string& name, const Field* leader) const {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument(detail::field_label(name) + ": " + why);
  };
  if (name.empty()) throw std::invalid_argument("a field needs a name");
  if (kind != Kind::kPlan && key_list().empty()) {
    throw bad("no member or column named (keys is empty)");
  }
  FieldSpec spec;
  spec.name = name;
  const size_t max = max_bytes == 0 ? kDefaultMaxBytes : max_bytes;
  // A field that follows an image: its leader must be one (every follower's first check).
  const auto check_leader = [&] {
    if (follows.empty()) throw bad("follows an image field: `follows` is empty");
    if (leader == nullptr || leader->kind != Kind::kImage) {
      throw bad("follows \"" + detail::printable(follows) +
                "\", which is not an image field of the same source");
    }
    if (!leader->transform.views.empty()) {
      throw bad("follows \"" + detail::printable(follows) +
                "\", an image with views: masks, boxes, points and plans follow an image of one "
                "view, for now");
    }
    if (leader->transform.size <= 0) throw bad("the image's transform size must be positive");
  };
  // A ragged field of items of `item_values` float32 values (boxes, points).
  const auto ragged_floats = [&](int64_t item_values) {
    spec.dtype = c10::ScalarType::Float;
    spec.sample_shape = {item_values};
    const size_t item = spec.item_bytes();
    if (max < item) {
      throw bad("max_bytes " + std::to_string(max) + " holds no item of " + std::to_string(item) +
                " bytes");
    }
    spec.max_items = max / item;
    return spec;
  };
  switch (kind) {
    case Kind::kImage: {
      if (transform.size <= 0) throw bad("the transform's size must be positive");
      const int64_t s = transform.size;
      spec.dtype = c10::ScalarType::Byte;
      spec.sample_shape = transform.layout == ImageLayout::kCHW ? std::vector<int64_t>{3, s, s}
                                                                : std::vector<int64_t>{s, s, 3};
      return spec;
    }
    case Kind::kInteger:
      spec.dtype = c10::ScalarType::Long;
      return spec;
    case Kind::kFloating:
      spec.dtype = c10::ScalarType::Float;
      return spec;
    case Kind::kArray: {
      spec.dtype = dtype;
      if (multi_hot && (shape.size() != 1 || shape[0] <= 0)) {
        throw bad("multi_hot needs a 1-d shape of at least one class");
      }
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] > 0 || (d == 0 && shape[d] == -1)) continue;
        throw bad("shape dimension " + std::to_string(d) + " is " + std::to_string(shape[d]) +
                  " (every dimension is positive; only the first may be -1, varying)");
      }
      if (!shape.empty() && shape[0] == -1) {
        spec.sample_shape.assign(shape.begin() + 1, shape.end());
        const size_t item = spec.item_bytes();
        if (max < item) {
          throw bad("max_bytes " + std::to_string(max) + " holds no item of " +
                    std::to_string(item) + " bytes");
        }
        spec.max_items = max / item;
        return spec;
      }
      spec.sample_shape = shape;
      if (spec.item_bytes() > (size_t{1} << 30)) throw bad("a sample over 1 GiB");
      return spec;
    }
    case Kind::kMask: {
      if (dtype != c10::ScalarType::Byte && dtype != c10::ScalarType::Short &&
          dtype != c10::ScalarType::Int) {
        throw bad("a mask's dtype is uint8, int16 or int32 (int16 or int32 for 16-bit masks)");
      }
      check_leader();
      spec.dtype = dtype;
      spec.sample_shape = {leader->transform.size, leader->transform.size};
      return spec;
    }
    case Kind::kBoxes:
      check_leader();
      if (!(box_rule.min_size >= 0) || !(box_rule.min_visibility >= 0) ||
          !(box_rule.min_visibility <= 1)) {
        throw bad("min_size must be >= 0 and min_visibility in [0, 1]");
      }
      return ragged_floats(4);
    case Kind::kPoints:
      check_leader();
      if (point_columns != 0 && point_columns != 2 && point_columns != 3) {
        throw bad("point_columns is 2 (x, y), 3 (x, y, visibility) or 0 (no flat lists), not " +
                  std::to_string(point_columns));
      }
      return ragged_floats(3);
    case Kind::kPlan:
      check_leader();
      spec.dtype = c10::ScalarType::Int;
      // One view per image today: a plan of several views makes this [views, 7].
      spec.sample_shape = {1, static_cast<int64_t>(kPlanRowValues)};
      return spec;
    case Kind::kBytes:
    case Kind::kText:
    case Kind::kJson:
      spec.dtype = c10::ScalarType::Byte;
      spec.max_items = max;
      spec.host_only = true;
      return spec;
  }
  throw bad("an unknown kind");
}

std::vector<FieldSpec> Field::specs(const std::string& name, const Field* leader) const {
  if (kind != Kind::kImage || transform.views.empty()) return {spec(name, leader)};
  std::vector<FieldSpec> out;
  for (const ViewGroup& group : view_groups(transform)) {
    Field one = *this;
    one.transform = group.transform;
    one.transform.layout = transform.layout;
    FieldSpec spec = one.spec(group.name, leader);
    spec.sample_shape.insert(spec.sample_shape.begin(), group.count);
    out.push_back(std::move(spec));
  }
  return out;
}

namespace detail {

std::string field_label(const std::string& name) { return "field \"" + printable(name) + "\""; }

std::string member_text(const Member& member) {
  if (member.encoding == MemberEncoding::kInteger || member.encoding == MemberEncoding::kFloating) {
    return number_text(member);
  }
  if (member.encoding == MemberEncoding::kArray) return member_kind(member);
  return quoted(std::string_view(reinterpret_cast<const char*>(member.data), member.size));
}

std::string number_text(const Member& member) {
  if (member.encoding == MemberEncoding::kInteger) return std::to_string(member.integer);
  std::array<char, 32> text{};
  const auto [end, error] = std::to_chars(text.data(), text.data() + text.size(), member.floating);
  if (error != std::errc()) return std::to_string(member.floating);
  return std::string(text.data(), end);
}

std::string member_kind(const Member& member) {
  switch (member.encoding) {
    case MemberEncoding::kInteger:
      return "the integer " + number_text(member);
    case MemberEncoding::kFloating:
      return "the number " + number_text(member);
    case MemberEncoding::kArray: {
      std::string shape = "[";
      for (size_t i = 0; i < member.ndim; ++i) {
        shape += (i ? ", " : "") + std::to_string(member.shape[i]);
      }
      return std::string("an array of ") + c10::toString(member.dtype) + " " + shape + "]";
    }
    case MemberEncoding::kJson:
      return "the JSON value " + member_text(member);
    case MemberEncoding::kFile:
      break;
  }
  return "a file of " + std::to_string(member.size) + " bytes";
}

void throw_unreadable(const std::string& name, const Member& member, const std::string& wanted) {
  throw std::runtime_error(field_label(name) + ": member \"" + printable(member.name) + "\" is " +
                           member_kind(member) + ", not " + wanted);
}

void FieldWriter::write_following(const Member&, const SampleContext&, const ImagePlan&,
                                  std::byte*) {
  throw std::logic_error("conveyor: write_following() on a field writer that follows nothing");
}

bool follows_an_image(Field::Kind kind) {
  return kind == Field::Kind::kMask || kind == Field::Kind::kBoxes ||
         kind == Field::Kind::kPoints || kind == Field::Kind::kPlan;
}

std::unique_ptr<FieldWriter> make_field_writer(const std::string& name, const Field& field,
                                               const FieldSpec& spec) {
  switch (field.kind) {
    case Field::Kind::kImage:
      return make_image_writer(name, field);
    case Field::Kind::kInteger:
      return make_integer_writer(name);
    case Field::Kind::kFloating:
      return make_floating_writer(name);
    case Field::Kind::kArray:
      return make_array_writer(name, field, spec);
    case Field::Kind::kBytes:
      return make_bytes_writer(name, spec);
    case Field::Kind::kText:
      return make_text_writer(name, spec);
    case Field::Kind::kJson:
      return make_json_writer(name, spec);
    case Field::Kind::kMask:
      return make_mask_writer(name, field, spec);
    case Field::Kind::kBoxes:
      return make_box_writer(name, field, spec);
    case Field::Kind::kPoints:
      return make_point_writer(name, field, spec);
    case Field::Kind::kPlan:
      return make_plan_writer(name, spec);
  }
  throw std::invalid_argument(field_label(name) + ": an unknown kind");
}

}  // namespace detail
}  // namespace conveyor
