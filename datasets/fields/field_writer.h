// datasets/fields/field_writer.h (build-only): how one field of a sample is made from its member.
//
// One FieldWriter per field per worker (it may keep state: an image writer's decoder and
// scratch). make_field_writer() is the one table from Field::Kind to its writer; each kind's
// writer lives in its own file (image_field.cpp, scalar_fields.cpp, array_field.cpp,
// text_fields.cpp). Adding a kind: its enumerator in conveyor/fields.h, its spec in field.cpp, its
// writer file and its entry in the table. A kind that follows an image's geometry (a mask)
// implements write_following(); FieldSource hands it its leader's published plan, or, for a
// follower of a group of views, that plan with only the group's views (ViewPlan::group). A follower
// with no member (the plan) is handed an empty member. Each geometric follower is one writer file
// (mask_field.cpp, box_field.cpp, point_field.cpp, plan_field.cpp) over a pure function of one
// ViewPlan (conveyor/geometry.h).
//
// Requires: write() gets a member the field's keys name, and `row` with spec.sample_bytes()
// writable bytes (a RaggedRow for a ragged spec). Guarantees: write() fills the whole row (a
// ragged row's count and items), or throws a std::runtime_error whose message starts with
// `field "NAME"` and says what is wrong (naming the option for a bound); it never writes past the
// row, whatever the member holds. Thread safety: one thread per writer.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/fields.h"
#include "conveyor/image_plan.h"
#include "sources/sample_kind.h"

namespace conveyor::detail {

// The rows of a member that a boxes writer kept.
struct KeptRows {
  size_t rows = 0;  // the member's rows
  // The rows kept, view after view (a view's ascending); a row kept by several views is listed
  // once for each.
  std::vector<size_t> kept;
};

class FieldWriter {
 public:
  virtual ~FieldWriter() = default;
  virtual void write(const Member& member, const SampleContext& ctx, std::byte* row) = 0;
  // A field of several batch fields (an image with views: one per group) writes them all from
  // one member: rows[0 .. Field::specs().size()). The default writes rows[0] with write().
  virtual void write_rows(const Member& member, const SampleContext& ctx, std::byte* const* rows) {
    write(member, ctx, rows[0]);
  }
  // What an image writer measured of its last write(); zero for the other kinds.
  struct Timing {
    uint64_t decode_ns = 0;
    uint64_t transform_ns = 0;
    int scale = 0;  // the DCT scale numerator used, 1..8; 0 when nothing was decoded
  };
  virtual Timing last_timing() const { return {}; }

  // Geometry (conveyor/image_plan.h). A leader (an image) publishes the plan its last write()
  // executed, for the fields that follow it in the same sample; null for every other kind.
  virtual const ImagePlan* published_plan() const { return nullptr; }
  // A follower (a mask, boxes, points, the plan itself) is written with its leader's plan for
  // the sample instead of write(): the views it follows, in view order (all of an image without
  // views; one group's of an image with views). rows[0 .. Field::specs().size()) as for
  // write_rows(): boxes and points of a group of views write their per-view counts to rows[1].
  // The default throws std::logic_error (not a follower).
  virtual void write_following(const Member& member, const SampleContext& ctx,
                               const ImagePlan& plan, std::byte* const* rows);

  // Rows (conveyor/geometry.h). A boxes writer publishes which of its member's rows its last
  // write kept, for FieldSource to drop the same rows of the fields paired with it; null for
  // every other kind.
  virtual const KeptRows* published_kept_rows() const { return nullptr; }
};

// The writer of field `name` described by `field` (whose spec() is `spec`); `views`: for a
// follower of a group of views, the group's count; 0 for every other field.
std::unique_ptr<FieldWriter> make_field_writer(const std::string& name, const Field& field,
                                               const FieldSpec& spec, size_t views = 0);

// The group of `leader`'s views that follower `field` (named `name`) follows: its index in
// leader.transform.views, or nullopt for an image without views. Throws std::invalid_argument
// naming the field, and listing the groups, when the image has views and `field.follows` names
// none of them.
std::optional<size_t> followed_group(const std::string& name, const Field& field,
                                     const Field& leader);

// The prefix of every message about field `name`: `field "NAME"`.
std::string field_label(const std::string& name);

// The text of a member that holds a scalar or short text (decimal text, a JSON value's text),
// for messages: printable and bounded.
std::string member_text(const Member& member);

// What a member is, for messages: "a file of 12 bytes", "the integer 3", "the number 0.5",
// "an array of float [3, 4]".
std::string member_kind(const Member& member);

// Throws `field "NAME": member "M" is KIND, not WANTED` (a member the field cannot read: a
// MemberReader's array given to an image field, say).
[[noreturn]] void throw_unreadable(const std::string& name, const Member& member,
                                   const std::string& wanted);

// A kInteger or kFloating member's value as the shortest decimal text that reads back as it.
std::string number_text(const Member& member);

// Each kind's writer (one file each).
std::unique_ptr<FieldWriter> make_image_writer(const std::string& name, const Field& field);
std::unique_ptr<FieldWriter> make_integer_writer(const std::string& name);
std::unique_ptr<FieldWriter> make_floating_writer(const std::string& name);
std::unique_ptr<FieldWriter> make_array_writer(const std::string& name, const Field& field,
                                               const FieldSpec& spec);
std::unique_ptr<FieldWriter> make_bytes_writer(const std::string& name, const FieldSpec& spec);
std::unique_ptr<FieldWriter> make_text_writer(const std::string& name, const FieldSpec& spec);
std::unique_ptr<FieldWriter> make_json_writer(const std::string& name, const FieldSpec& spec);
std::unique_ptr<FieldWriter> make_mask_writer(const std::string& name, const Field& field,
                                              const FieldSpec& spec);
std::unique_ptr<FieldWriter> make_box_writer(const std::string& name, const Field& field,
                                             const FieldSpec& spec, size_t views);
std::unique_ptr<FieldWriter> make_point_writer(const std::string& name, const Field& field,
                                               const FieldSpec& spec, size_t views);
std::unique_ptr<FieldWriter> make_plan_writer(const std::string& name, const FieldSpec& spec);

// Whether a field of `kind` follows an image's plan (a mask, boxes, points, the plan).
bool follows_an_image(Field::Kind kind);

}  // namespace conveyor::detail
