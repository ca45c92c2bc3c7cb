// conveyor/fields.h: a sample as a set of named fields, and the sources that read them.
//
// What it is for: describing what a training loop wants of each sample (an image, a caption, a
// JSON record, a class, a multi-hot target, stored logits, boxes), by name, and where each comes
// from in the data: a WebDataset member's extension ("jpg;png;webp", "txt", "cls", "boxes.npy")
// or a manifest's column. A FieldSource reads each sample's members and writes every field
// straight into its row of the batch (conveyor/loader.h), so a batch is a dict of tensors:
//
//   conveyor::Fields fields = {
//       {"image", conveyor::Field::image("jpg;png;jpeg;webp", conveyor::ImageTransform::train())},
//       {"caption", conveyor::Field::text("txt")},
//       {"label", conveyor::Field::integer("cls")},
//       {"boxes", conveyor::Field::array("boxes.npy", c10::kFloat, {-1, 4})}};
//   auto source = conveyor::FieldSource::tar_shards({"clip-{000000..000099}.tar"}, fields);
//
// Field kinds and what each makes of a member (a shard's file, or a manifest cell):
//   image    a JPEG, PNG or WebP, decoded and transformed into uint8 [3,S,S] (or [S,S,3]), as
//            ImageSource does; with an ImageOutput, [C,S,S] (or [S,S,C]) of C = 3, 4 or 1
//            channels (RGB, RGBA, L) and uint8 or uint16 samples;
//   integer  decimal text (WebDataset's cls, index, id) or a JSON integer: int64 [];
//   floating decimal text or a JSON number: float32 [];
//   array    an .npy file (numpy's format 1, 2 or 3; its dtype and shape must be the declared
//            ones) or a JSON list of numbers (a manifest cell); `shape` fixed, or with a first
//            dimension of -1 that varies from sample to sample (ragged: boxes [N, 4]); [-1]
//            alone takes an .npy of any shape, flattened (its items are its elements). With
//            multi_hot, a 1-d field whose member lists class indices: 1 at each, 0 elsewhere.
//   bytes    the member's bytes as they are (ragged uint8, host_only);
//   text     UTF-8 text (checked), ragged uint8, host_only; a JSON cell's string is unquoted;
//   json     a JSON value (checked: well formed, nested at most kMaxJsonDepth), its text as
//            ragged uint8, host_only;
//   mask     a segmentation mask that follows an image field (`follows`): a gray or palette PNG
//            of 1, 2, 4, 8 or 16 bits, interlaced or not, of the image's upright size, read as
//            its samples (a palette's indices are the class ids, never colours), cut with the
//            image's crop box, resized nearest-neighbour to the image's output size and flipped
//            with it: [S,S] of dtype uint8 (the default), int16 or int32 (a 16-bit mask needs
//            one of these; a sample over 32767 in an int16 mask is the sample's error, never
//            wrapped). See conveyor/image_plan.h.
//   boxes    boxes that follow an image field: [N, 4] XYXY in the upright image's pixels (an
//            .npy of any real or integer dtype, a JSON list of [x1, y1, x2, y2] lists or a flat
//            list of 4N numbers), mapped into the view's output pixels, clipped to it, mirrored
//            with it; a box the BoxRule drops takes the rows of its `paired` fields (ragged
//            arrays: its class labels) with it. Ragged float32 [N_i, 4] (conveyor/geometry.h).
//   points   points that follow an image field: [N, 2] (x, y) or [N, 3] (x, y, visibility),
//            mapped as boxes are and never clipped; a point outside the view gets visibility 0,
//            a point inside keeps its own (1 for an [N, 2] member). Ragged float32 [N_i, 3].
//   plan     no member: the image field's plan for the sample, a row per view of x, y, width,
//            height, flip (0 or 1), out_width, out_height: int32 [V, 7] (V = 1 for an image
//            without views).
// Views (ImageTransform::views): a mask, boxes, points or plan that follows an image with views
// names one of its groups in `follows` ("global"), and follows each view of that group, in view
// order (the image field's own name, or no group, is refused, listing the groups). For a group
// of V views: a mask is [V,S,S], a plan [V, 7]; boxes and points hold each view's items one view
// after the other (sample major, view minor), at most V times the member's rows, and add a
// batch field NAME + kPerViewSuffix, int64 [V]: the items of each view, so that the batch's
// values split into B*V rows (row b*V + v is sample b's view v). A boxes field's paired fields
// then hold their rows per view too, with the boxes' counts. Each view is mapped by the same
// function of one ViewPlan (conveyor/geometry.h) as an image without views.
// A ragged field (bytes, text, json, an array with a varying first dimension) holds at most
// `max_bytes` bytes per sample (0: the kind's default, kDefaultMaxBytes); the batch slots are
// sized from it once, so memory is bounded whatever the data.
//
// Requires: field names unique and non-empty, 1 to 16 fields; a mask's (boxes', points', a
// plan's) `follows` names an image field of the same source, or a group of its views; a boxes
// field's `paired` names ragged array fields of the same source, each paired with one boxes field
// at most (std::invalid_argument otherwise). A field that follows an image is written after it,
// whatever the declared order, from the plan the image's writer published for the sample
// (conveyor/image_plan.h). Guarantees: a sample that lacks a field's member, or whose member does
// not fit the field (not decimal text, not UTF-8, malformed JSON, an .npy of another dtype or shape
// or of dtype object (a pickle: never unpickled), more than max_bytes), throws a std::runtime_error
// naming the sample (its shard and key, or its manifest row), the field and, for a bound, the
// option (max_bytes); the loader turns it into a SampleError or, under ErrorPolicy::kSkip, a
// counted substitute. Nothing from the data is ever executed, and every size, shape and count is
// checked before anything is allocated for it. Augmentation randomness is a pure function of (seed,
// epoch, index), as for ImageSource.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <c10/util/ArrayRef.h>

#include "conveyor/sample_source.h"

namespace conveyor {

namespace detail {
struct Member;
struct SampleMembers;
struct KeptRows;
}  // namespace detail

// When a box that a view cuts is dropped (Field::boxes; the arithmetic: conveyor/geometry.h).
struct BoxRule {
  // The least width and height, in the view's output pixels, of the box after clipping to the
  // view. Default 1: torchvision v2's SanitizeBoundingBoxes' min_size=1 (whose min_area=1 then
  // holds too).
  double min_size = 1.0;
  // The least share (0..1) of the box's mapped area that the view keeps after clipping. Default 0
  // (no share required), as in SanitizeBoundingBoxes (which has no such rule) and Albumentations'
  // min_visibility; 0.25, say, drops a person cut down to its feet.
  double min_visibility = 0.0;
};

// What an image field's rows hold (Field::output): the channels and the sample type. The
// geometry (plan_image's boxes, the crop, the bilinear resize, EXIF orientation, the flip) is the
// same for every output, so a mask, boxes or points that follow the image follow it whatever its
// output.
struct ImageOutput {
  enum class Mode {
    // 3 channels, R, G, B (the default): alpha dropped, gray replicated, as Pillow's
    // convert("RGB").
    kRGB,
    // 4 channels, R, G, B, A: the file's alpha (a PNG's alpha channel or tRNS chunk, a WebP's
    // alpha), 255 where the file has none, as Pillow's convert("RGBA"). R, G, B are kRGB's rows
    // byte for byte.
    kRGBA,
    // 1 channel, gray: a gray file's own samples; a colour file's (alpha dropped) converted as
    // Pillow's convert("L"): (R * 19595 + G * 38470 + B * 7471 + 32768) >> 16, ITU-R 601-2's
    // R * 299/1000 + G * 587/1000 + B * 114/1000 rounded as Pillow rounds it. The conversion is
    // made before the resize, as Pillow's convert() then resize() would.
    kL,
  };
  Mode mode = Mode::kRGB;
  // The samples' type: uint8 (Byte, the default) or uint16 (UInt16). In uint16 a 16-bit file's
  // samples (PNG) are kept as they are, resized in 16 bits; an 8-bit file's rows are the uint8
  // rows with each value v written as v * 257 (255 -> 65535), exactly.
  c10::ScalarType dtype = c10::ScalarType::Byte;

  // The rows' channels: 3, 4 or 1 by the mode.
  int channels() const;
  // Whether this is the default output (RGB, uint8), which the fastest path and GPU decode make.
  bool is_default() const { return mode == Mode::kRGB && dtype == c10::ScalarType::Byte; }
  // A mode's name, "RGB", "RGBA" or "L" (Pillow's), and the one reading of it: throws
  // std::invalid_argument naming every name for any other text.
  static const char* mode_name(Mode mode);
  static Mode parse_mode(std::string_view name);
  // Throws std::invalid_argument for a dtype other than uint8 or uint16, naming `what`.
  void check(const std::string& what) const;
};

// One field of a sample: its kind, where it comes from, and its shape in the batch.
struct Field {
  enum class Kind {
    kImage,
    kInteger,
    kFloating,
    kArray,
    kBytes,
    kText,
    kJson,
    kMask,
    kBoxes,
    kPoints,
    kPlan
  };
  // The default max_bytes of a ragged field (bytes, text, json, a ragged array): 64 KiB.
  static constexpr size_t kDefaultMaxBytes = size_t{1} << 16;
  // The deepest nesting of a json field's arrays and objects.
  static constexpr size_t kMaxJsonDepth = 64;

  Kind kind = Kind::kBytes;
  // Shards: the member's extension (what follows the first dot of its name, in lower case), or
  // several separated by ';', the first that a sample has ("jpg;png;jpeg;webp"). Manifests: the
  // column's name.
  std::string keys;
  ImageTransform transform;                        // kImage
  ImageOutput output;                              // kImage: RGB uint8 unless asked
  c10::ScalarType dtype = c10::ScalarType::Float;  // kArray, kMask: the element type
  // kMask, kBoxes, kPoints, kPlan: the name of the image field whose geometry it follows.
  std::string follows;
  std::vector<int64_t> shape;  // kArray: the sample's shape; [0] may be -1 (ragged)
  bool multi_hot = false;      // kArray, 1-d: the member lists indices
  size_t max_bytes = 0;        // ragged kinds: per sample; 0: kDefaultMaxBytes
  BoxRule box_rule;            // kBoxes
  // kBoxes: the fields whose rows are dropped with a dropped box (ragged arrays of one row per
  // box: class labels, crowd flags, areas).
  std::vector<std::string> paired;
  // kPoints: the numbers per point of a flat JSON list (2: x, y; 3: x, y, visibility, as COCO's
  // keypoints); 0 (the default): a flat list is refused (an .npy or a list of lists says it).
  int point_columns = 0;

  // The batch field of each view's count of a boxes or points field that follows a group of
  // views: "boxes" + kPerViewSuffix = "boxes_per_view", int64 [V].
  static constexpr const char* kPerViewSuffix = "_per_view";

  // An image field's keys when none are given (ImageSource's "image", Python's conveyor.Image):
  // the members OpenCLIP reads, each decoded by its content (a PNG named .jpg is a PNG).
  static constexpr const char* kDefaultImageKeys = "jpg;jpeg;png;webp";

  static Field image(std::string keys, ImageTransform transform, ImageOutput output = {});
  static Field integer(std::string keys);
  static Field floating(std::string keys);
  static Field array(std::string keys, c10::ScalarType dtype, std::vector<int64_t> shape,
                     size_t max_bytes = 0);
  static Field multi_hot_array(std::string keys, int64_t classes,
                               c10::ScalarType dtype = c10::ScalarType::Float);
  static Field bytes(std::string keys, size_t max_bytes = 0);
  static Field text(std::string keys, size_t max_bytes = 0);
  static Field json(std::string keys, size_t max_bytes = 0);
  // A mask that follows image field `follows`; dtype uint8 (Byte), int16 (Short) or int32 (Int).
  static Field mask(std::string keys, std::string follows = "image",
                    c10::ScalarType dtype = c10::ScalarType::Byte);

  // Boxes that follow image field `follows`, dropped by `rule` with the rows of `paired`.
  static Field boxes(std::string keys, std::string follows = "image",
                     std::vector<std::string> paired = {"labels"}, BoxRule rule = {},
                     size_t max_bytes = 0);
  // Points that follow image field `follows` (point_columns: see the member).
  static Field points(std::string keys, std::string follows = "image", int point_columns = 0,
                      size_t max_bytes = 0);
  // The plan of image field `follows` for each sample (no member).
  static Field plan(std::string follows = "image");

  // The batch's layout of this field, named `name`. Throws std::invalid_argument naming the
  // field for a description that cannot be laid out (no keys, a shape with a zero or negative
  // dimension other than a leading -1, multi_hot on a shape that is not 1-d, max_bytes smaller
  // than one item). A mask's shape is its image's: spec() takes that image field (`leader`),
  // and throws for a mask (or boxes, points, a plan) without one, or with a leader that is not
  // an image. A follower of an image with views takes the shape of the group its `follows`
  // names (see "Views" above).
  FieldSpec spec(const std::string& name, const Field* leader = nullptr) const;
  // The batch fields this field becomes: {spec(name, leader)}, or for an image whose transform
  // has views (ImageTransform::views), one field per group, named after the group, uint8
  // [count, 3, S, S] (or [count, S, S, 3]) with S the group's size; `name` is then unused. Boxes
  // or points that follow a group of views add their per-view counts, NAME + kPerViewSuffix.
  // Throws as spec() does, and std::invalid_argument for views that view_groups() refuses or
  // views with an output other than the default (RGB uint8), naming the field.
  std::vector<FieldSpec> specs(const std::string& name, const Field* leader = nullptr) const;
  // The extensions (or the column) `keys` names, in order.
  std::vector<std::string> key_list() const;
};

// A sample's fields, in the batch's order.
using Fields = std::vector<std::pair<std::string, Field>>;

// Where FieldSource::manifest reads its rows.
struct ManifestOptions {
  // The manifest's format. kAuto (the default): from its extension: .csv, .tsv, .jsonl or
  // .ndjson (any case).
  enum class Format { kAuto, kCsv, kTsv, kJsonLines };
  Format format = Format::kAuto;
  // The files' listings and bytes. Null (the default): system_storage().
  std::shared_ptr<const Storage> storage;
};

// One sample's members as a MemberReader gives them (FieldSource::from_reader): each a name,
// matched to a field's keys without case ("jpg", "cls"), and a value, copied in. A field reads
// them as it reads a shard's members: bytes as a file's bytes (an encoded image, UTF-8 text, an
// .npy file, decimal text), an integer or a floating value as a number (an integer field refuses
// a floating one; a floating field takes both), an array by its dtype and shape (an array
// field's rules for an .npy apply: the declared dtype, the declared or ragged shape).
// Reused from sample to sample: once its buffers have grown to a sample's size, filling it
// allocates nothing. Not thread-safe: one per worker.
class MemberList {
 public:
  // The most dimensions of an array member.
  static constexpr size_t kMaxArrayDims = 64;

  MemberList();
  ~MemberList();
  MemberList(const MemberList&) = delete;
  MemberList& operator=(const MemberList&) = delete;

  // Each adds the member `name` (1 to 255 bytes; a name added twice: the first is read).
  // Throws std::invalid_argument naming the member for a name out of bounds.
  void add_bytes(std::string_view name, const void* data, size_t size);
  void add_integer(std::string_view name, int64_t value);
  void add_floating(std::string_view name, double value);
  // An array of `dtype` and `shape` in C order and the machine's byte order, of
  // product(shape) * elementSize(dtype) bytes; returns where they go, for the caller to fill
  // before the next add (a strided copy straight into the list). Throws std::invalid_argument
  // naming the member for more than kMaxArrayDims dimensions, a negative dimension, or bytes
  // that overflow.
  std::byte* add_array(std::string_view name, c10::ScalarType dtype, c10::IntArrayRef shape);
  // Drops every member (the reader's read() starts from an empty list).
  void clear();
  size_t size() const;

  // Where the members go (build-only: datasets/sources/sample_kind.h).
  struct Contents;
  Contents& contents() { return *contents_; }

 private:
  std::unique_ptr<Contents> contents_;
};

// Where a FieldSource::from_reader source's samples come from: code of the user's (a C++ store,
// a Python dataset's __getitem__: python/src/dataset_reader.cpp) that gives sample i's members;
// the fields decode and write them on the loader's workers.
// Requires: size() fixed while a loader reads; read() safe to call from the loader's workers at
// once (ctx.worker < the prepare()d count tells them apart).
class MemberReader {
 public:
  virtual ~MemberReader() = default;
  virtual size_t size() const = 0;
  // Called before a loader's first read(), with its number of workers.
  virtual void prepare(size_t workers) { (void)workers; }
  // Sample ctx.index's members into `out` (empty on entry). Throws a std::runtime_error saying
  // what went wrong (the loader adds the index and describe()), or LoadingInterrupted to stop the
  // loader whatever its ErrorPolicy.
  virtual void read(const SampleContext& ctx, MemberList& out) = 0;
  // A name for sample `index` in errors and skip lists; the default: "sample INDEX".
  virtual std::string describe(size_t index) const;
};

// Samples as named fields (see above), from WebDataset shards or a manifest. Per-worker state
// (decoders, read buffers), the worker rules and the errors are SampleSource's
// (conveyor/datasets.h).
class FieldSource : public SampleSource {
 public:
  // WebDataset tar shards with any members: what ImageSource::tar_shards reads, in both modes,
  // the same patterns and ShardOptions, the same rules for names from data, the same errors. In
  // random-access mode each sample is read with one ranged read of the members its fields use,
  // as the shard's index (version 2) lists them; a version 1 index lists only the image, so only
  // ImageSource's two fields can use it (re-index with conveyor-prepare --index-only). Shards
  // without an index are streamed.
  static std::unique_ptr<FieldSource> tar_shards(const std::vector<std::string>& patterns,
                                                 Fields fields,
                                                 const ShardOptions& options = ShardOptions());
  static std::unique_ptr<FieldSource> tar_shards(const std::vector<ShardLocation>& shards,
                                                 Fields fields,
                                                 const ShardOptions& options = ShardOptions());
  // A manifest: CSV (RFC 4180: a header row, quoted cells), TSV (a header row, no quoting) or
  // JSON Lines (one object per line), one sample a row. An image field's column names the file,
  // relative to the manifest's folder or absolute; every other field reads its column's cell.
  // Throws std::runtime_error naming the manifest and the line for a malformed row, a row
  // without a column that a field uses, a manifest of no rows.
  static std::unique_ptr<FieldSource> manifest(const std::filesystem::path& path, Fields fields,
                                               const ManifestOptions& options = ManifestOptions());

  // The samples a MemberReader gives (the user's own storage): size() is the reader's; each
  // field reads its member from what read() added. Throws std::invalid_argument for a null
  // reader.
  static std::unique_ptr<FieldSource> from_reader(std::shared_ptr<MemberReader> reader,
                                                  Fields fields);

  // Where a sample's members come from (build-only: datasets/sources/sample_kind.h).
  class Kind;

  ~FieldSource() override;
  size_t size() const override;
  std::vector<FieldSpec> fields() const override;
  void prepare(size_t workers) override;
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override;
  std::string describe(size_t index) const override;
  void will_write(size_t worker, const size_t* indices, size_t count) override;
  // The first image field, when it has one, for GPU decode (SampleSource::encoded_image_field).
  // None when a field follows an image (a mask): such samples are decoded on the CPU, where the
  // image's plan is published to its followers; none either when that image's output is not
  // the default RGB uint8 (ImageOutput), which only the CPU decode makes. An image with views is
  // named with its transform, whose views the loader's GPU decode leaves to the CPU, saying so in
  // its status.
  std::optional<EncodedImageField> encoded_image_field() const override;
  Encoded read_encoded(const SampleContext& ctx, std::vector<uint8_t>& buffer,
                       std::byte* const* fields) override;

  const Fields& field_descriptions() const { return fields_; }
  // The class names of the shards' index (conveyor-prepare), or an ImageFolder's; may be empty.
  const std::vector<std::string>& classes() const;
  // Samples decoded at each DCT scale numerator 1..8 (index 0 unused), summed over workers and
  // image fields.
  std::vector<uint64_t> scale_histogram() const;
  // Worker time spent in write_sample() so far, by stage, summed over workers: reading the
  // members, decoding images, and the transform after the decode (ImageWriter::Timing); the
  // other fields count as decoding. May be read from any thread while workers run.
  struct WorkTime {
    double read_seconds = 0;
    double decode_seconds = 0;
    double transform_seconds = 0;
  };
  WorkTime work_time() const;

 protected:
  FieldSource(std::unique_ptr<Kind> kind, Fields fields);
  const Kind& kind() const { return *kind_; }

 private:
  struct Worker;  // a worker's field writers, members and counters
  void read_members(Worker& w, const SampleContext& ctx);
  // The member of field `field` (the first of its keys that the sample has); throws naming the
  // field when the sample has none.
  const detail::Member& member_of(const detail::SampleMembers& members, size_t field) const;
  // Writes every field but `skip` from the worker's members.
  void write_fields(Worker& w, const SampleContext& ctx, std::byte* const* rows,
                    std::optional<size_t> skip);
  std::unique_ptr<Kind> kind_;
  Fields fields_;
  std::vector<FieldSpec> specs_;  // the batch's fields: each field's specs(), in order
  std::vector<std::vector<std::string>> keys_;    // per field: Field::key_list()
  std::vector<std::optional<size_t>> leader_of_;  // per field: the image field it follows
  std::vector<std::optional<size_t>> group_of_;   // per follower: the group of views it follows
  std::vector<size_t> views_of_;                  // per follower of a group: its count, else 0
  std::vector<FieldSpec> writer_specs_;           // per field: its first spec, for its writer
  std::vector<size_t> first_row_;                 // per field: its first batch field (specs_)
  std::vector<size_t> write_order_;               // leaders before the fields that follow them
  std::vector<std::vector<size_t>> paired_;       // per boxes field: the fields paired with it
  // Drops the rows of field `paired`'s row that boxes field `boxes` dropped (its writer's
  // published rows); throws naming both when their counts differ.
  void keep_paired_rows(size_t boxes, size_t paired, const detail::KeptRows& kept, std::byte* row,
                        std::vector<std::byte>& scratch) const;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace conveyor
