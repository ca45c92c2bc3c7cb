// Field (conveyor/fields.h): each kind's description and layout, and the table from kind to writer.
#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
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

namespace {

struct ModeName {
  ImageOutput::Mode mode;
  const char* name;
};
constexpr ModeName kModeNames[] = {{ImageOutput::Mode::kRGB, "RGB"},
                                   {ImageOutput::Mode::kRGBA, "RGBA"},
                                   {ImageOutput::Mode::kL, "L"}};

}  // namespace

int ImageOutput::channels() const {
  switch (mode) {
    case Mode::kRGBA:
      return 4;
    case Mode::kL:
      return 1;
    case Mode::kRGB:
      break;
  }
  return 3;
}

const char* ImageOutput::mode_name(Mode mode) {
  for (const ModeName& m : kModeNames) {
    if (m.mode == mode) return m.name;
  }
  return "unknown";
}

ImageOutput::Mode ImageOutput::parse_mode(std::string_view name) {
  std::string names;
  for (const ModeName& m : kModeNames) {
    if (name == m.name) return m.mode;
    names += std::string(names.empty() ? "" : ", ") + "\"" + m.name + "\"";
  }
  throw std::invalid_argument("an image mode is one of " + names + ", not \"" +
                              detail::printable(std::string(name)) + "\"");
}

void ImageOutput::check(const std::string& what) const {
  if (dtype != c10::ScalarType::Byte && dtype != c10::ScalarType::UInt16) {
    throw std::invalid_argument(what + ": an image's dtype is uint8 or uint16, not " +
                                c10::toString(dtype));
  }
  if (std::string(mode_name(mode)) == "unknown") {
    throw std::invalid_argument(what + ": an unknown image mode");
  }
}

Field Field::image(std::string keys, ImageTransform transform, ImageOutput output) {
  Field f = make(Kind::kImage, std::move(keys));
  f.transform = transform;
  f.output = output;
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
  // A field that follows an image: its leader must be one (every follower's first check). The
  // views it follows: a group's count and size for an image with views; 0 views (the image's
  // one view, without a views dimension) and the image's size otherwise.
  struct Followed {
    int64_t views = 0;
    int64_t size = 0;
  };
  const auto check_leader = [&] {
    if (follows.empty()) throw bad("follows an image field: `follows` is empty");
    if (leader == nullptr || leader->kind != Kind::kImage) {
      throw bad("follows \"" + detail::printable(follows) +
                "\", which is not an image field of the same source");
    }
    Followed out{0, leader->transform.size};
    if (const std::optional<size_t> g = detail::followed_group(name, *this, *leader)) {
      out.views = leader->transform.views[*g].count;
      out.size = leader->transform.views[*g].transform.size;
    }
    if (out.size <= 0) throw bad("the image's transform size must be positive");
    return out;
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
  // A ragged follower of `views` views holds each view's items: max_bytes bounds the member,
  // and the row holds `views` times its items.
  const auto per_view = [](FieldSpec ragged, int64_t views) {
    if (views > 0) ragged.max_items *= static_cast<size_t>(views);
    return ragged;
  };
  switch (kind) {
    case Kind::kImage: {
      if (transform.size <= 0) throw bad("the transform's size must be positive");
      output.check(detail::field_label(name));
      const int64_t s = transform.size;
      const int64_t c = output.channels();
      spec.dtype = output.dtype;
      spec.sample_shape = transform.layout == ImageLayout::kCHW ? std::vector<int64_t>{c, s, s}
                                                                : std::vector<int64_t>{s, s, c};
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
      const Followed followed = check_leader();
      spec.dtype = dtype;
      spec.sample_shape = {followed.size, followed.size};
      if (followed.views > 0) spec.sample_shape.insert(spec.sample_shape.begin(), followed.views);
      return spec;
    }
    case Kind::kBoxes: {
      const Followed followed = check_leader();
      if (!(box_rule.min_size >= 0) || !(box_rule.min_visibility >= 0) ||
          !(box_rule.min_visibility <= 1)) {
        throw bad("min_size must be >= 0 and min_visibility in [0, 1]");
      }
      return per_view(ragged_floats(4), followed.views);
    }
    case Kind::kPoints: {
      const Followed followed = check_leader();
      if (point_columns != 0 && point_columns != 2 && point_columns != 3) {
        throw bad("point_columns is 2 (x, y), 3 (x, y, visibility) or 0 (no flat lists), not " +
                  std::to_string(point_columns));
      }
      return per_view(ragged_floats(3), followed.views);
    }
    case Kind::kPlan: {
      const Followed followed = check_leader();
      spec.dtype = c10::ScalarType::Int;
      spec.sample_shape = {std::max<int64_t>(followed.views, 1),
                           static_cast<int64_t>(kPlanRowValues)};
      return spec;
    }
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
  if (kind != Kind::kImage || transform.views.empty()) {
    std::vector<FieldSpec> out{spec(name, leader)};
    if (kind != Kind::kBoxes && kind != Kind::kPoints) return out;
    if (const std::optional<size_t> g = detail::followed_group(name, *this, *leader)) {
      FieldSpec counts;
      counts.name = name + kPerViewSuffix;
      counts.dtype = c10::ScalarType::Long;
      counts.sample_shape = {leader->transform.views[*g].count};
      out.push_back(std::move(counts));
    }
    return out;
  }
  if (!output.is_default()) {
    throw std::invalid_argument(detail::field_label(name) + ": an image with views is RGB uint8 " +
                                "for now, not mode \"" + ImageOutput::mode_name(output.mode) +
                                "\" " + c10::toString(output.dtype) +
                                " (drop the views or the mode and dtype)");
  }
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
                                  std::byte* const*) {
  throw std::logic_error("conveyor: write_following() on a field writer that follows nothing");
}

bool follows_an_image(Field::Kind kind) {
  return kind == Field::Kind::kMask || kind == Field::Kind::kBoxes ||
         kind == Field::Kind::kPoints || kind == Field::Kind::kPlan;
}

std::optional<size_t> followed_group(const std::string& name, const Field& field,
                                     const Field& leader) {
  if (leader.transform.views.empty()) return std::nullopt;
  const std::vector<ViewGroup> groups = view_groups(leader.transform);  // checks them
  std::string names;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].name == field.follows) return g;
    names += std::string(g ? ", " : "") + "\"" + printable(groups[g].name) + "\"";
  }
  throw std::invalid_argument(field_label(name) + " follows \"" + printable(field.follows) +
                              "\", an image with views: it follows one group of them, named in "
                              "`follows`: " +
                              names);
}

std::unique_ptr<FieldWriter> make_field_writer(const std::string& name, const Field& field,
                                               const FieldSpec& spec, size_t views) {
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
      return make_box_writer(name, field, spec, views);
    case Field::Kind::kPoints:
      return make_point_writer(name, field, spec, views);
    case Field::Kind::kPlan:
      return make_plan_writer(name, spec);
  }
  throw std::invalid_argument(field_label(name) + ": an unknown kind");
}

}  // namespace detail
}  // namespace conveyor
