// conveyor/sample_source.h: the interface between a loader and where its samples come from.
//
// What it is for: a SampleSource writes one sample's fields straight into the bytes the loader
// hands it (a row of a batch slot), so nothing is allocated or copied per sample between the file
// and the batch. FieldSpec says how each field is laid out; ImageTransform how an image becomes a
// fixed-size row (ImageWriter); ShardOptions and FolderOptions where image and field sources
// read. The sources themselves: conveyor/datasets.h (images and labels) and conveyor/fields.h
// (named fields of any kind).

#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "conveyor/storage.h"

namespace conveyor {

// One field of a sample, as the loader lays it out in a batch slot.
//
// A fixed field (max_items == 0, the default): every sample holds one value of `sample_shape`
// ("image" uint8 [3,224,224], "label" int64 []), sample_bytes() bytes of the row.
//
// A ragged field (max_items > 0): each sample holds 0 .. max_items items, each of shape
// `sample_shape` (a caption: uint8 items of shape []; boxes: float32 items of shape [4]). Its row
// is a RaggedRow: an int64 count of items (native byte order), then the items, packed, with room
// for max_items of them: sample_bytes() = 8 + max_items * item_bytes(). So memory stays bounded
// whatever the data, and a worker writes a sample in place, allocating nothing. A source never
// writes more than max_items items: a sample over the bound is that sample's error (naming the
// field and the option that sets the bound), never a silent truncation. The batch holds a ragged
// field in the jagged layout (Batch::fields, Batch::offsets, conveyor/loader.h): `values`
// [total items, ...sample_shape] and `offsets` int64 [B + 1], sample r's items being
// values[offsets[r] .. offsets[r + 1]).
//
// host_only: the field stays in host memory when batches go to a CUDA device (text, bytes, JSON:
// what the host reads, never the GPU). Both tensors of such a ragged field are then CPU tensors.
struct FieldSpec {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  std::vector<int64_t> sample_shape;
  size_t max_items = 0;
  bool host_only = false;
  bool ragged() const { return max_items > 0; }
  // Bytes of one value of sample_shape: a fixed field's sample, a ragged field's item.
  size_t item_bytes() const;
  // Bytes of one sample's row: item_bytes() (fixed), or 8 + max_items * item_bytes() (ragged).
  size_t sample_bytes() const;
};

// A ragged field's row (FieldSpec): the count, then the items. Writers fill items() (at most
// max_items of them) and set_count(); readers read count() and items().
class RaggedRow {
 public:
  explicit RaggedRow(std::byte* row) : row_(row) {}
  int64_t count() const;
  void set_count(int64_t items);
  std::byte* items() const { return row_ + sizeof(int64_t); }

 private:
  std::byte* row_;
};

// What a worker knows about the sample it is writing.
struct SampleContext {
  size_t worker = 0;   // 0 .. workers-1, stable for the thread
  size_t index = 0;    // dataset index
  uint64_t seed = 0;   // loader seed
  uint64_t epoch = 0;  // current epoch
  // Which draw of the sample this is in the epoch: 0 unless the sampler repeats samples
  // (RASampler), then 0 .. num_repeats-1. Its per-sample random choices must depend on it.
  uint32_t repeat = 0;
  // The seed of this draw's per-sample streams (crop, flip, views): repeat_seed(seed, repeat),
  // which is `seed` for repeat 0. A source draws from SampleRng(draw_seed(), epoch, index[, view]).
  uint64_t draw_seed() const { return repeat_seed(seed, repeat); }
};

enum class ImageLayout { kCHW, kHWC };

// How each decoded image becomes a fixed-size uint8 RGB row.
struct ViewGroup;

struct ImageTransform {
  enum class Mode {
    kRandomResizedCrop,  // torchvision RandomResizedCrop(size, scale, ratio), training
    kResizeCenterCrop,   // Resize(resize) of the shorter side, then CenterCrop(size), evaluation
    kResize,             // the whole image resized to size x size (aspect not kept)
  };
  Mode mode = Mode::kRandomResizedCrop;
  int size = 224;           // output height and width
  int resize = 256;         // shorter side before the center crop (kResizeCenterCrop)
  double scale_min = 0.08;  // RandomResizedCrop area fraction range
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;  // RandomResizedCrop aspect ratio range
  double ratio_max = 4.0 / 3.0;
  double flip_probability = 0.5;  // horizontal flip (0 disables)
  ImageLayout layout = ImageLayout::kCHW;
  DecodeLimits limits;  // rejects decompression bombs before allocating
  // Honour the EXIF orientation tag: the crop is chosen in, and the output shows, the upright
  // image. Off by default, as torchvision's decode_jpeg and PIL's open leave it to the caller.
  bool exif_orientation = false;
  // The DCT scales the crop may be decoded at before the resize (DecodeOptions::dct_scales).
  unsigned dct_scales = kSimdDctScales;
  // Parse the MCUs outside the crop's columns without storing them
  // (DecodeOptions::discard_outside_crop). The same pixels either way; off only to compare.
  bool discard_outside_crop = true;
  // Decode JPEG scans with Conveyor's own baseline entropy decoder
  // (DecodeOptions::own_entropy_decoder). The same pixels either way; on by default, off only to
  // compare.
  bool own_entropy_decoder = true;
  // With own_entropy_decoder: the index of the files' entropy-coded data, shared by every decoder
  // made from copies of this transform (DecodeOptions::entropy_index, JpegEntropyIndex: later
  // epochs parse only the crop's MCUs). Null (the default): a source (ImageFolder, FileList, a
  // manifest, shards, a reader) gives each of its image fields one of
  // JpegEntropyIndex::kDefaultBudgetBytes, shared by its workers; an ImageWriter made directly
  // uses none. Give one of budget 0 to turn it off, or your own to choose its budget or to share
  // it between sources.
  std::shared_ptr<JpegEntropyIndex> entropy_index = nullptr;
  // Several views of each image (DINOv2's 2 global + 8 local crops, SimCLR's 2): named groups,
  // each of `count` views made by its own transform's geometry (mode, size, resize, scale, ratio,
  // flip_probability). Empty (the default): one view of this transform, as always. With groups,
  // an image field becomes one field per group, named after it, of shape [count, 3, S, S] (or
  // [count, S, S, 3]) with S its group's size; this transform's layout, limits,
  // exif_orientation, dct_scales, discard_outside_crop and own_entropy_decoder apply to every
  // view, and its own geometry is unused. plan_image() (conveyor/image_plan.h) numbers the views
  // 0..N-1 in group order, so one group of count 1 is that group's transform, bit for bit.
  std::vector<ViewGroup> views;
  // With views: decode the image once, the bounding box of every view's box at the finest DCT
  // scale any view needs, and resize each view from it (true, the default); or decode each view
  // on its own (false: each view is the bytes it has alone, at the cost of one decode per view).
  bool decode_views_once = true;

  static ImageTransform train(int size = 224);
  static ImageTransform eval(int size = 224, int resize = 256);
};

// A named group of views (ImageTransform::views): `count` views, each drawn by `transform`'s
// geometry from its own random stream. Requires a name that no other field or group has, count
// >= 1, transform.size >= 1 and no views of its own (ImageWriter and Field::spec throw
// std::invalid_argument naming the group otherwise).
struct ViewGroup {
  std::string name;
  int count = 1;
  ImageTransform transform;
};

// The views of `transform` by group: its groups, or one unnamed group of count 1 whose transform
// is `transform` itself when it has none.
std::vector<ViewGroup> view_groups(const ImageTransform& transform);

// Thrown by a source to stop its loader whatever the ErrorPolicy (the user's code asked to stop:
// a Python dataset's __getitem__ raised KeyboardInterrupt or SystemExit). The loader never
// skips or substitutes the sample: the batch fails with a SampleError whose original() is this.
class LoadingInterrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual size_t size() const = 0;
  // The fields every sample has. Empty only for a source that learns_fields(), until it has.
  virtual std::vector<FieldSpec> fields() const = 0;
  // A source whose fields are known only once it has read a sample (the drop-in's torch
  // datasets: the shapes are whatever get() returns) says so here, and fields() is empty until
  // learn_fields() has returned. The loader then learns them when the first epoch starts: on a
  // thread of its own, before any worker runs, it calls learn_fields() with the first sample of
  // the batch it waits for (under ErrorPolicy::kSkip, the following ones while it throws), and
  // waits for it at most LoaderOptions::timeout per wait. A failure is that sample's failure in
  // its batch, as a worker's would be, and the loader goes on with the next batch. Only one
  // learn_fields() runs at a time, and never with prepare() or write_sample(); size() and
  // describe() may be called meanwhile, from the thread that iterates the loader.
  virtual bool learns_fields() const { return false; }
  // Reads sample `index`, keeps its fields as fields() and returns them; throws what reading the
  // sample throws. The default throws std::logic_error (a source that does not learn).
  virtual std::vector<FieldSpec> learn_fields(size_t index);
  // Called once before the first write_sample, with the number of worker threads.
  virtual void prepare(size_t workers) { (void)workers; }
  // Writes sample ctx.index: `fields[i]` points to fields()[i].sample_bytes() writable bytes.
  virtual void write_sample(const SampleContext& ctx, std::byte* const* fields) = 0;
  // A human-readable name for a sample, for errors and skip lists (the file path for images).
  virtual std::string describe(size_t index) const;
  // A hint: worker `worker` is about to write these `count` samples, in this order (its chunk of
  // a batch). A source that reads over a network may start fetching them all at once. It never
  // changes what write_sample() writes; the default ignores it. Called from the worker's thread.
  virtual void will_write(size_t worker, const size_t* indices, size_t count) {
    (void)worker;
    (void)indices;
    (void)count;
  }

  // A capability, for a decoder outside the source (the loader's GPU decode,
  // LoaderOptions::gpu_decode): field `field` of every sample is a JPEG file decoded and
  // transformed as `transform` says (uint8, [3,S,S] for kCHW or [S,S,3] for kHWC, S =
  // transform.size), so such a decoder may write it from the file's bytes, which
  // read_encoded() gives, instead of write_sample(). Its rows must then equal what write_sample()
  // writes (up to the decoders' rounding).
  struct EncodedImageField {
    size_t field = 0;  // an index into fields()
    ImageTransform transform;
  };
  // The field a device decoder may write, if any. The default: none (GPU decode then leaves the
  // whole sample to write_sample(), and says why).
  virtual std::optional<EncodedImageField> encoded_image_field() const { return std::nullopt; }
  // Sample ctx.index's encoded bytes for the field encoded_image_field() names, not decoded, with
  // every other field written as write_sample() writes it (that field's pointer is not written).
  // The bytes are in `buffer` (its capacity reused) or in memory the source holds, valid until
  // `buffer` is used again or the source is destroyed. The same worker rules and errors as
  // write_sample() (the message names the sample). The default throws std::logic_error (a source
  // without the capability).
  struct Encoded {
    const uint8_t* data = nullptr;
    size_t size = 0;
  };
  virtual Encoded read_encoded(const SampleContext& ctx, std::vector<uint8_t>& buffer,
                               std::byte* const* fields);
};

struct ImagePlan;  // conveyor/image_plan.h

// A crop box in source pixels.
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
};

// The crop and flip that `transform` applies to sample `index` of an image of width x height in
// (seed, epoch): torchvision's RandomResizedCrop rules (10 tries, then the center-crop fallback).
// The box of plan_image()'s first view (conveyor/image_plan.h), which is where it is defined.
CropBox choose_crop(const ImageTransform& transform, int width, int height, uint64_t seed,
                    uint64_t epoch, size_t index);

// The bytes of one view of group `group` of view_groups(transform): size * size * 3.
size_t view_bytes(const ImageTransform& transform, size_t group);

struct ImageOutput;  // conveyor/fields.h

// Decodes the image file `bytes` and writes the transformed image to `out` (size*size*3 bytes;
// with views, every group's views back to back, in group order: write_groups()).
// The format is found by the bytes' content (JPEG, PNG; any other format, or bytes of none, throw
// naming what was found), and every format gets the same crop (choose_crop), resize and flip:
// 8-bit RGB, alpha dropped, gray replicated, 16-bit PNG samples rounded to the nearest 8-bit
// value. EXIF orientation (ImageTransform::exif_orientation) is read from JPEG files only.
// Per-thread state: one decoder per format met and scratch buffers, reused across calls.
class ImageWriter {
 public:
  explicit ImageWriter(ImageTransform transform);
  // Rows of `output`'s channels and dtype (conveyor/fields.h) instead of RGB uint8: C x S x S
  // samples of elementSize(output.dtype) bytes each (S x S x C in HWC), by the same geometry.
  // Throws std::invalid_argument for an output that ImageOutput::check() refuses, or for a
  // transform with views and an output other than the default.
  ImageWriter(ImageTransform transform, const ImageOutput& output);
  ~ImageWriter();
  ImageWriter(ImageWriter&&) noexcept;
  ImageWriter& operator=(ImageWriter&&) noexcept;
  void write(const uint8_t* bytes, size_t size, const SampleContext& ctx, std::byte* out);
  // The same, one row per group of view_groups(transform()): group_rows[g] receives group g's
  // count views of view_bytes(transform(), g) bytes each, back to back. Several views are
  // decoded once (ImageTransform::decode_views_once): the bounding box of their boxes, at the
  // finest DCT scale any of them needs alone; a view is then the bytes it has alone when its own
  // scale is that scale, and otherwise resized from finer pixels than alone (docs/design.md,
  // "Views", gives the measured difference).
  void write_groups(const uint8_t* bytes, size_t size, const SampleContext& ctx,
                    std::byte* const* group_rows);
  const ImageTransform& transform() const;
  // The DCT scale numerator (of 8) used by the last write, for statistics (with views decoded one
  // by one, the finest of theirs).
  int last_scale() const;
  // The plan the last write executed (plan_image() of the transform, the image's upright size and
  // the sample's context), which the fields that follow the image read. Empty before any write;
  // after a write that threw, the plan of that sample if its header was read.
  const ImagePlan& last_plan() const;
  // Where the last write's time went, for statistics: the decode of the crop (for a JPEG: header,
  // entropy decoding, IDCT, color conversion), and the rest (resize, EXIF rotation, flip, layout).
  struct Timing {
    std::chrono::nanoseconds decode{0};
    std::chrono::nanoseconds transform{0};
  };
  Timing last_timing() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One image sample: a file path (or in-memory bytes) and a class label.
struct ImageItem {
  std::string path;
  int64_t label = 0;
};

// Where ImageSource::image_folder and file_list read their files.
struct FolderOptions {
  // The folders' listings and the files' bytes. Null (the default): system_storage().
  std::shared_ptr<const Storage> storage;
};

// Where one shard is read from (StorageLocation, conveyor/storage.h): a local path, an
// http(s):// URL, or a command (pipe:COMMAND).
//
// What is trusted: only what a user typed (a command-line argument, a Python or C++ argument) is
// read as a pattern (braces, comma lists, file:// URLs, pipe:COMMAND). A name that comes from data
// (a folder listing, a glob, an index, a server) is never a pattern nor a command: it is taken
// literally (literal_shard_location), and a shard's index beside it is found by the same rule
// (a local shard's index is a local path, whatever the shard's name holds).
using ShardLocation = StorageLocation;

// How ImageSource::tar_shards finds the index and reaches remote shards. The defaults suit
// object storage (S3 or GCS, pre-signed URLs included) and a server on the same rack alike.
// RemoteOptions (conveyor/storage.h) holds the retries, backoff and deadlines of HTTP(S)
// requests and pipe: commands, and the requests each worker keeps in flight (random access).
struct ShardOptions : RemoteOptions {
  // Where the index is, for shards whose PREFIX.index.json cannot be found beside them (a
  // pre-signed URL, whose query string differs per object): a path or URL, read as a location
  // the user typed (parse_shard_location). Every shard given must be listed in it. Empty (the
  // default): PREFIX.index.json beside each shard.
  std::string index;
  // The shards', and their index's, bytes. Null (the default): system_storage().
  std::shared_ptr<const Storage> storage;

  // Streaming mode: each shard is read whole, in order, instead of one ranged read per sample.
  // Chosen when `streaming` is true, when a shard has no index, or for pipe: shards. The order is a
  // pure function of (the loader's seed, epoch): the shards are permuted per epoch and split over
  // the ranks (rank r takes every world_size-th), then the rank's samples pass through a shuffle
  // buffer of up to `shuffle_buffer` samples (1: the shards' own order; as WebDataset's shuffle,
  // output starts once 100 are in, and the buffer fills two in for one out). One reader thread per
  // source reads the shards; the loader's workers decode. Read it with the loader's default
  // sequential sampler (the order comes from the stream); every rank has the same number of samples
  // per epoch.
  bool streaming = false;
  size_t shuffle_buffer = 1000;
  size_t rank = 0;  // this process's rank, and the ranks that share the shards (streaming)
  size_t world_size = 1;
  // Samples per rank per epoch. 0 (the default): what every rank can fill in every epoch, the
  // sum of the floor(shards / world_size) smallest shards' sample counts, known from the index
  // or, for local shards without one, from a pass over their tar headers. Required for remote
  // shards without an index. A stream that runs short fails its last positions (on_error).
  size_t epoch_samples = 0;
  // Positions the stream holds below the highest one asked for (for concurrent and substitute
  // reads; at least the loader's slots x batch_size), and reads ahead of it. Memory is about
  // (shuffle_buffer + stream_window + stream_lookahead) encoded samples.
  size_t stream_window = 2048;
  size_t stream_lookahead = 512;
};

}  // namespace conveyor
