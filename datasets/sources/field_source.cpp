// FieldSource (conveyor/fields.h): what every source of named fields shares. The kind
// (sample_kind.h) says what sample i's members are; this file finds each field's member and has
// its writer (fields/field_writer.h) write it into the row, and counts where the time went.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "conveyor/fields.h"
#include "conveyor/internal/printable.h"
#include "conveyor/internal/trace.h"
#include "fields/field_writer.h"
#include "sources/sample_kind.h"

namespace conveyor {

using Clock = std::chrono::steady_clock;

size_t FieldSpec::item_bytes() const {
  size_t n = c10::elementSize(dtype);
  for (int64_t d : sample_shape) n *= static_cast<size_t>(d);
  return n;
}

size_t FieldSpec::sample_bytes() const {
  return ragged() ? sizeof(int64_t) + max_items * item_bytes() : item_bytes();
}

int64_t RaggedRow::count() const {
  int64_t n = 0;
  std::memcpy(&n, row_, sizeof n);
  return n;
}

void RaggedRow::set_count(int64_t items) { std::memcpy(row_, &items, sizeof items); }

std::string SampleSource::describe(size_t index) const { return "sample " + std::to_string(index); }

std::vector<FieldSpec> SampleSource::learn_fields(size_t) {
  throw std::logic_error("conveyor: learn_fields() on a source whose fields() are known");
}

SampleSource::Encoded SampleSource::read_encoded(const SampleContext& ctx, std::vector<uint8_t>&,
                                                 std::byte* const*) {
  throw std::logic_error("conveyor: read_encoded() of sample " + std::to_string(ctx.index) +
                         " on a source without an encoded image field");
}

struct FieldSource::Worker {
  std::vector<std::unique_ptr<detail::FieldWriter>> writers;  // per field
  detail::SampleMembers members;
  ImagePlan followed;                  // a group's views of the sample's plan, reused
  std::vector<std::byte> paired_rows;  // a paired field's rows before a boxes field kept them
  std::array<std::atomic<uint64_t>, 9> scales{};
  // Nanoseconds in write_sample(): reading, decoding, transforming.
  std::atomic<uint64_t> read_ns{0}, decode_ns{0}, transform_ns{0};
};

FieldSource::FieldSource(std::unique_ptr<Kind> kind, Fields fields)
    : kind_(std::move(kind)), fields_(std::move(fields)) {
  if (fields_.empty() || fields_.size() > 16) {
    throw std::invalid_argument("a source has 1 to 16 fields, not " +
                                std::to_string(fields_.size()));
  }
  std::set<std::string> names;
  for (auto& [name, field] : fields_) {
    if (!names.insert(name).second) {
      throw std::invalid_argument(detail::field_label(name) + " is named twice");
    }
    // ImageTransform::entropy_index's default: one index per image field, shared by the workers.
    ImageTransform& t = field.transform;
    if (field.kind == Field::Kind::kImage && t.own_entropy_decoder && !t.entropy_index) {
      t.entropy_index = std::make_shared<JpegEntropyIndex>();
    }
  }
  for (const auto& [name, field] : fields_) {
    std::optional<size_t> leader;
    if (detail::follows_an_image(field.kind)) {
      for (size_t l = 0; l < fields_.size(); ++l) {
        if (fields_[l].first == field.follows) leader = l;
      }
      // A follower that names a group of an image with views follows that image.
      for (size_t l = 0; l < fields_.size() && !leader; ++l) {
        for (const ViewGroup& g : fields_[l].second.transform.views) {
          if (fields_[l].second.kind == Field::Kind::kImage && g.name == field.follows) leader = l;
        }
      }
    }
    first_row_.push_back(specs_.size());
    for (FieldSpec& spec : field.specs(name, leader ? &fields_[*leader].second : nullptr)) {
      specs_.push_back(std::move(spec));
    }
    writer_specs_.push_back(specs_[first_row_.back()]);
    keys_.push_back(field.key_list());
    leader_of_.push_back(leader);
    // specs() has checked the leader and the group a follower names.
    group_of_.push_back(leader ? detail::followed_group(name, field, fields_[*leader].second)
                               : std::nullopt);
    views_of_.push_back(
        group_of_.back()
            ? static_cast<size_t>(fields_[*leader].second.transform.views[*group_of_.back()].count)
            : 0);
  }
  // Each boxes field's paired fields: ragged arrays, each paired once.
  paired_.resize(fields_.size());
  std::set<size_t> taken;
  for (size_t f = 0; f < fields_.size(); ++f) {
    const Field& field = fields_[f].second;
    if (field.kind != Field::Kind::kBoxes) continue;
    for (const std::string& name : field.paired) {
      size_t p = 0;
      while (p < fields_.size() && fields_[p].first != name) ++p;
      const std::string label =
          detail::field_label(fields_[f].first) + " pairs with \"" + detail::printable(name) + "\"";
      if (p == fields_.size()) {
        throw std::invalid_argument(label +
                                    ", which is not a field of the source (boxes "
                                    "without labels: paired=())");
      }
      if (fields_[p].second.kind != Field::Kind::kArray || !specs_[first_row_[p]].ragged()) {
        throw std::invalid_argument(label +
                                    ", which is not a ragged array (shape (-1, ...): one row "
                                    "per box)");
      }
      if (!taken.insert(p).second) {
        throw std::invalid_argument(label + ", which another boxes field pairs with already");
      }
      paired_[f].push_back(p);
      // Boxes of a group of views: the paired field's row holds its rows once per view.
      if (views_of_[f] > 0) specs_[first_row_[p]].max_items *= views_of_[f];
    }
  }
  // A view group's field is named after its group: no two batch fields may share a name.
  std::set<std::string> batch_names;
  for (const FieldSpec& spec : specs_) {
    if (!batch_names.insert(spec.name).second) {
      throw std::invalid_argument(detail::field_label(spec.name) +
                                  " is named twice (a view group is a field of its name)");
    }
  }
  if (specs_.size() > 16) {
    throw std::invalid_argument("a source has 1 to 16 fields (view groups included), not " +
                                std::to_string(specs_.size()));
  }
  // Leaders (and fields that follow nothing) first, in the declared order; then the followers.
  for (int followers = 0; followers < 2; ++followers) {
    for (size_t f = 0; f < fields_.size(); ++f) {
      if (leader_of_[f].has_value() == (followers == 1)) write_order_.push_back(f);
    }
  }
  kind_->want(fields_);
}

FieldSource::~FieldSource() = default;

size_t FieldSource::size() const { return kind_->size(); }
std::vector<FieldSpec> FieldSource::fields() const { return specs_; }
const std::vector<std::string>& FieldSource::classes() const { return kind_->classes(); }
std::string FieldSource::describe(size_t index) const { return kind_->describe(index); }

void FieldSource::prepare(size_t workers) {
  while (workers_.size() < workers) {
    auto w = std::make_unique<Worker>();
    for (size_t f = 0; f < fields_.size(); ++f) {
      w->writers.push_back(detail::make_field_writer(fields_[f].first, fields_[f].second,
                                                     writer_specs_[f], views_of_[f]));
    }
    workers_.push_back(std::move(w));
  }
  kind_->prepare(workers);
}

void FieldSource::will_write(size_t worker, const size_t* indices, size_t count) {
  kind_->will_read(worker, indices, count);
}

const detail::Member& FieldSource::member_of(const detail::SampleMembers& members,
                                             size_t field) const {
  for (const std::string& key : keys_[field]) {
    if (const detail::Member* m = members.find(key)) return *m;
  }
  throw std::runtime_error(detail::field_label(fields_[field].first) + ": the sample has no \"" +
                           detail::printable(fields_[field].second.keys) + "\" member");
}

void FieldSource::write_fields(Worker& w, const SampleContext& ctx, std::byte* const* rows,
                               std::optional<size_t> skip) {
  for (const size_t f : write_order_) {
    if (skip && *skip == f) continue;
    static const detail::Member kNoMember{};
    const detail::Member& member =
        keys_[f].empty() ? kNoMember : member_of(w.members, f);  // a plan reads no member
    const auto started = Clock::now();
    if (const std::optional<size_t> leader = leader_of_[f]) {
      // The leader was written just before (write_order_), for this sample: its plan is this one.
      const ImagePlan* plan = w.writers[*leader]->published_plan();
      if (plan == nullptr || (skip && *skip == *leader)) {
        throw std::logic_error("conveyor: " + detail::field_label(fields_[f].first) +
                               " follows a field that published no plan");
      }
      if (const std::optional<size_t> group = group_of_[f]) {
        // The group's views, in view order; `followed` keeps its capacity from sample to sample.
        w.followed.width = plan->width;
        w.followed.height = plan->height;
        w.followed.views.clear();
        for (const ViewPlan& view : plan->views) {
          if (view.group == static_cast<int>(*group)) w.followed.views.push_back(view);
        }
        plan = &w.followed;
      }
      w.writers[f]->write_following(member, ctx, *plan, rows + first_row_[f]);
    } else {
      w.writers[f]->write_rows(member, ctx, rows + first_row_[f]);
    }
    const detail::FieldWriter::Timing t = w.writers[f]->last_timing();
    if (t.scale > 0) {
      w.decode_ns.fetch_add(t.decode_ns, std::memory_order_relaxed);
      w.transform_ns.fetch_add(t.transform_ns, std::memory_order_relaxed);
      w.scales[static_cast<size_t>(t.scale)].fetch_add(1, std::memory_order_relaxed);
    } else {
      w.decode_ns.fetch_add(static_cast<uint64_t>((Clock::now() - started).count()),
                            std::memory_order_relaxed);
    }
  }
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (paired_[f].empty()) continue;
    const detail::KeptRows* kept = w.writers[f]->published_kept_rows();
    if (kept == nullptr) {
      throw std::logic_error("conveyor: " + detail::field_label(fields_[f].first) +
                             " published no rows");
    }
    for (const size_t p : paired_[f]) {
      keep_paired_rows(f, p, *kept, rows[first_row_[p]], w.paired_rows);
    }
  }
}

void FieldSource::keep_paired_rows(size_t boxes, size_t paired, const detail::KeptRows& kept,
                                   std::byte* row, std::vector<std::byte>& scratch) const {
  RaggedRow items(row);
  if (items.count() != static_cast<int64_t>(kept.rows)) {
    throw std::runtime_error(
        detail::field_label(fields_[paired].first) + " has " + std::to_string(items.count()) +
        " rows and its boxes (" + detail::field_label(fields_[boxes].first) + ") " +
        std::to_string(kept.rows) + ": a field paired with boxes has one row per box");
  }
  const size_t bytes = specs_[first_row_[paired]].item_bytes();
  if (views_of_[boxes] == 0) {
    // One view: the rows kept are ascending, each moves to or before where it is.
    for (size_t i = 0; i < kept.kept.size(); ++i) {
      if (kept.kept[i] != i) {
        std::memmove(items.items() + i * bytes, items.items() + kept.kept[i] * bytes, bytes);
      }
    }
  } else {
    // Views: a row may be kept by several views; copy the member's rows aside, then lay out each
    // view's (the row has room for views * rows, FieldSource's spec).
    scratch.assign(items.items(), items.items() + kept.rows * bytes);
    for (size_t i = 0; i < kept.kept.size(); ++i) {
      std::memcpy(items.items() + i * bytes, scratch.data() + kept.kept[i] * bytes, bytes);
    }
  }
  items.set_count(static_cast<int64_t>(kept.kept.size()));
}

void FieldSource::read_members(Worker& w, const SampleContext& ctx) {
  std::optional<trace::Range> reading(std::in_place, trace::Name::kRead);  // for a profiler
  const auto started = Clock::now();
  kind_->read(ctx, w.members);
  w.read_ns.fetch_add(static_cast<uint64_t>((Clock::now() - started).count()),
                      std::memory_order_relaxed);
}

void FieldSource::write_sample(const SampleContext& ctx, std::byte* const* fields) {
  Worker& w = *workers_.at(ctx.worker);
  read_members(w, ctx);
  write_fields(w, ctx, fields, std::nullopt);
}

std::optional<SampleSource::EncodedImageField> FieldSource::encoded_image_field() const {
  for (const std::optional<size_t>& leader : leader_of_) {
    if (leader) return std::nullopt;  // a follower needs its image's plan: the CPU decodes both
  }
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (fields_[f].second.kind == Field::Kind::kImage) {
      // GPU decode makes RGB uint8 rows only: any other output is decoded on the CPU.
      if (!fields_[f].second.output.is_default()) return std::nullopt;
      return EncodedImageField{first_row_[f], fields_[f].second.transform};
    }
  }
  return std::nullopt;
}

SampleSource::Encoded FieldSource::read_encoded(const SampleContext& ctx,
                                                std::vector<uint8_t>& buffer,
                                                std::byte* const* fields) {
  const std::optional<EncodedImageField> image = encoded_image_field();
  if (!image || !image->transform.views.empty()) {
    return SampleSource::read_encoded(ctx, buffer, fields);  // throws
  }
  Worker& w = *workers_.at(ctx.worker);
  read_members(w, ctx);
  // Without views each field is one batch field: the image's batch field is its field.
  const size_t image_field = static_cast<size_t>(
      std::find(first_row_.begin(), first_row_.end(), image->field) - first_row_.begin());
  const detail::Member& member = member_of(w.members, image_field);
  if (member.encoding != detail::MemberEncoding::kFile) {
    throw std::runtime_error(detail::field_label(fields_[image_field].first) +
                             ": its member is not an image file");
  }
  // The bytes outlive this worker's next read: the caller holds several at once.
  buffer.assign(member.data, member.data + member.size);
  write_fields(w, ctx, fields, image_field);
  return {buffer.data(), buffer.size()};
}

std::vector<uint64_t> FieldSource::scale_histogram() const {
  std::vector<uint64_t> h(9, 0);
  for (const auto& w : workers_) {
    for (size_t i = 0; i < 9; ++i) h[i] += w->scales[i].load(std::memory_order_relaxed);
  }
  return h;
}

FieldSource::WorkTime FieldSource::work_time() const {
  WorkTime t;
  for (const auto& w : workers_) {
    t.read_seconds += 1e-9 * static_cast<double>(w->read_ns.load(std::memory_order_relaxed));
    t.decode_seconds += 1e-9 * static_cast<double>(w->decode_ns.load(std::memory_order_relaxed));
    t.transform_seconds +=
        1e-9 * static_cast<double>(w->transform_ns.load(std::memory_order_relaxed));
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// ImageSource: a FieldSource of "image" and "label".

ImageSource::ImageSource(std::unique_ptr<Kind> kind, ImageTransform transform)
    : FieldSource(std::move(kind), {{"image", Field::image(Field::kDefaultImageKeys, transform)},
                                    {"label", Field::integer("cls")}}),
      transform_(transform) {}

ImageSource::~ImageSource() = default;

const std::vector<ImageItem>& ImageSource::items() const { return kind().items(); }

}  // namespace conveyor
