// conveyor/datasets.h: where samples come from, and how an image becomes a batch row.
//
// What it is for: a SampleSource writes one sample's fields straight into the bytes the loader
// hands it (a row of a pinned batch slot), so nothing is allocated or copied per sample between
// the file and the batch. The image sources (ImageFolder, FileList, in-memory JPEG bytes, tar
// shards read at random or streamed) read their bytes through a Storage (conveyor/storage.h) and
// decode with libjpeg-turbo through JpegDecoder, decoding only the crop they need at the smallest
// DCT scale that still covers the output (as RGBX), then resize (bilinear), flip and split into
// the row with libyuv.
//
// Requires: write_sample() may be called concurrently from `workers` threads, each passing its
// own worker number (0 .. workers-1) as given to prepare(); a source keeps per-worker state
// (decoders, read buffers) indexed by it. So a source serves one DataLoader at a time: two live
// loaders on one source would share that state (destroy the first, or give each its own source).
// Guarantees: write_sample() either fills every byte of the sample's fields or throws; a corrupt,
// truncated, unsupported or oversized image, or a missing/unreadable file, throws an exception
// whose message names the file. Augmentation randomness is a pure function of (seed, epoch,
// index), so results do not depend on the number of workers or the order of work.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
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
};

enum class ImageLayout { kCHW, kHWC };

// How each decoded image becomes a fixed-size uint8 RGB row.
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

  static ImageTransform train(int size = 224);
  static ImageTransform eval(int size = 224, int resize = 256);
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

// A crop box in source pixels.
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
};

// The crop and flip that `transform` applies to sample `index` of an image of width x height in
// (seed, epoch): torchvision's RandomResizedCrop rules (10 tries, then the center-crop fallback).
CropBox choose_crop(const ImageTransform& transform, int width, int height, uint64_t seed,
                    uint64_t epoch, size_t index);

// Decodes the JPEG `bytes` and writes the transformed image to `out` (size*size*3 bytes).
// Per-thread state: one JpegDecoder and scratch buffers, reused across calls.
class ImageWriter {
 public:
  explicit ImageWriter(ImageTransform transform);
  ~ImageWriter();
  ImageWriter(ImageWriter&&) noexcept;
  ImageWriter& operator=(ImageWriter&&) noexcept;
  void write(const uint8_t* bytes, size_t size, const SampleContext& ctx, std::byte* out);
  const ImageTransform& transform() const;
  // The DCT scale numerator (of 8) used by the last write, for statistics.
  int last_scale() const;
  // Where the last write's time went, for statistics: the JPEG decode of the crop (header,
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

// JPEG images with labels, decoded into "image" (uint8 [3,S,S] or [S,S,3]) and "label" (int64).
// Items come from a folder tree, a file list, memory, or indexed WebDataset tar shards (local
// or over HTTP).
class ImageSource : public SampleSource {
 public:
  // ImageFolder layout: root/<class>/<image>.jpg|jpeg (any case). Classes are the sorted
  // sub-folder names, labelled 0..K-1; images within a class are sorted by name. Throws if root is
  // not a folder or holds no images.
  static std::unique_ptr<ImageSource> image_folder(const std::filesystem::path& root,
                                                   ImageTransform transform,
                                                   const FolderOptions& options = FolderOptions());
  // A text file of `path<TAB>label` lines; relative paths are relative to the list's folder.
  // Throws naming the line on a malformed line.
  static std::unique_ptr<ImageSource> file_list(const std::filesystem::path& list,
                                                ImageTransform transform,
                                                const FolderOptions& options = FolderOptions());
  // Encoded JPEG bytes held in memory (measures decode without the file system).
  static std::unique_ptr<ImageSource> in_memory(std::vector<std::vector<uint8_t>> jpegs,
                                                std::vector<int64_t> labels,
                                                ImageTransform transform);
  // WebDataset tar shards: what conveyor-prepare --format wds writes (tools/prepare.cpp), or any
  // tar whose samples are KEY.jpg (or .jpeg) + KEY.cls (the label as decimal text).
  //
  // Two ways to name them. `patterns` are what a user typed (a C++ argument in their program):
  // local paths, file:// or http(s):// URLs, or pipe:COMMAND, each possibly in WebDataset's brace
  // notation (expand_shard_braces: "train-{000000..000012}.tar"), read by
  // expand_shard_locations. Never pass names that come from data (a folder listing, a glob, an
  // index, a server) as patterns: a file named "{pipe:CMD,x}.tar" would run CMD. Give those as
  // `shards`, ShardLocations taken literally (literal_shard_location: a URL, or a local path
  // whatever it holds), which the overload below reads as they are. Both behave alike from there.
  // A shard
  // named PREFIX-NNNNNN.tar (any number of digits) is indexed by PREFIX.index.json beside it (or
  // by options.index). For pipe:COMMAND the name is the last word of COMMAND that ends in .tar,
  // and the index is what COMMAND writes with that word's PREFIX-NNNNNN.tar replaced by
  // PREFIX.index.json ("pipe:aws s3 cp s3://b/train-000003.tar -" is indexed by "aws s3 cp
  // s3://b/train.index.json -"); a command that fails or writes no index means no index.
  //
  // Random-access mode (every shard has an index, and options.streaming is false): the dataset is
  // the shards in the order given (after expansion), each shard's samples in the index's order;
  // labels and classes() come from the index. Each sample is one ranged read of its .jpg member
  // (pread() locally, an HTTP Range request remotely, on a connection each worker keeps), decoded
  // exactly as image_folder() decodes files (same transform, same SampleContext rules), so
  // samplers, resume and DistributedSampler work as they do there. describe(i) and
  // items()[i].path read "SHARD (member KEY.jpg)". A shard shorter than its index says
  // (truncated) fails only the samples it cuts: their reads throw naming the shard and the byte
  // range (the loader adds the member and the sample), through the loader's on_error policy.
  // A remote server that ignores Range requests is found here, with one request of one byte:
  // tar_shards then throws naming the URL and saying that streaming works with that server.
  //
  // Streaming mode (options.streaming, or a shard without an index; see ShardOptions): size() is
  // the samples per rank per epoch, sample i is position i of the epoch's stream, and items() is
  // empty; use the loader's default sequential sampler (not DistributedSampler: the ranks are
  // options.rank of options.world_size) and one loader at a time per source. Resume works: the
  // stream is read again from its start up to the checkpoint. A remote shard is one plain GET
  // (no Range needed), a pipe: shard the standard output of its command (run by /bin/sh -c with
  // the process's environment, in its own process group; a source destroyed mid-shard kills the
  // group and reaps it). A dropped connection or a failed command is retried (ShardOptions), and
  // the shard goes on from the byte where it stopped: no sample is read twice. A shard that still
  // cannot be read (truncated, a dead server, a command that keeps failing) loses the samples it
  // still held; the stream then ends early and its last positions fail through on_error, naming
  // the failed shards, one line each (the first three, and how many more). Damage that leaves the
  // rest of a shard readable fails one position, through on_error, and the stream goes on: a tar
  // header with a wrong checksum (named by its byte offset; the reader resumes at the next valid
  // header), an image member over 256 MiB or sparse (refused before it is read), a label that is
  // not decimal text. A local shard without an index that is cut short counts the samples before
  // the cut, and one for a header the cut goes through, so the loss is a counted failure too.
  // describe(i) names the shard and member while position i is held.
  //
  // HTTP requests that time out, are refused or reset, or get 5xx, 408 or 429 are retried
  // (ShardOptions); then, or at once for other statuses, the read throws naming the URL and the
  // HTTP status. Every request has a deadline, so a dead server never hangs a worker.
  // Throws std::invalid_argument for an unsupported URL scheme, malformed braces, a rank outside
  // world_size, fewer shards than ranks, or remote or pipe: shards streamed without an index or
  // epoch_samples; std::runtime_error naming the file or URL for a missing or unreadable shard
  // or index, a malformed index, an index over 1 GiB (a local one refused before it is read) or
  // nested more than 64 levels deep, a shard the index does not list, a local shard longer than
  // the index says (rewritten since), a server that ignores Range in random-access mode, or
  // shards that hold no samples. Names from shards and indexes (members, keys) appear in messages
  // and in items() escaped (control characters as \n, \x1b, ...; cut after 200 bytes), so that
  // none can fake a line of a log.
  static std::unique_ptr<ImageSource> tar_shards(const std::vector<std::string>& patterns,
                                                 ImageTransform transform,
                                                 const ShardOptions& options = ShardOptions());
  static std::unique_ptr<ImageSource> tar_shards(const std::vector<ShardLocation>& shards,
                                                 ImageTransform transform,
                                                 const ShardOptions& options = ShardOptions());
  // A braced list of strings ({"a-{0..3}.tar"}, {}) is patterns, as the first overload.
  static std::unique_ptr<ImageSource> tar_shards(std::initializer_list<std::string> patterns,
                                                 ImageTransform transform,
                                                 const ShardOptions& options = ShardOptions());

  // One implementation per kind of source, behind ImageSource (build-only:
  // datasets/sources/image_kind.h): files, memory, shards at random, a shard stream.
  class Kind;

  ~ImageSource() override;
  size_t size() const override;
  std::vector<FieldSpec> fields() const override;
  void prepare(size_t workers) override;
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override;
  std::string describe(size_t index) const override;
  // Remote shards in random-access mode: starts up to ShardOptions::requests_in_flight of the
  // samples' Range requests at once, on the worker's own connections.
  void will_write(size_t worker, const size_t* indices, size_t count) override;

  // The capability (SampleSource::encoded_image_field): "image" (field 0) is the source's
  // transform of each file. read_encoded() writes the label (fields[1]) as write_sample() does,
  // leaves fields[0] untouched, reads as write_sample() does (the same errors naming the file) and
  // counts its read time; the decode is the caller's.
  std::optional<EncodedImageField> encoded_image_field() const override;
  Encoded read_encoded(const SampleContext& ctx, std::vector<uint8_t>& buffer,
                       std::byte* const* fields) override;

  const std::vector<ImageItem>& items() const;
  const std::vector<std::string>& classes() const;
  const ImageTransform& transform() const { return transform_; }
  // Samples decoded at each DCT scale numerator 1..8 (index 0 unused), summed over workers.
  std::vector<uint64_t> scale_histogram() const;
  // Worker time spent in write_sample() so far, by stage, summed over workers: reading the bytes
  // (a file, a shard member, an HTTP request, the stream), decoding them, and the transform after
  // the decode (ImageWriter::Timing). Two clock reads per stage per sample; may be read from any
  // thread while workers run.
  struct WorkTime {
    double read_seconds = 0;
    double decode_seconds = 0;
    double transform_seconds = 0;
  };
  WorkTime work_time() const;

 private:
  ImageSource(std::unique_ptr<Kind> kind, ImageTransform transform);
  struct Worker;  // a worker's decoder and counters
  std::unique_ptr<Kind> kind_;
  ImageTransform transform_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// WebDataset's brace notation: "a-{000000..000003}.tar" is a-000000.tar .. a-000003.tar (numeric
// ranges, zero-padded to the wider bound when either bound has a leading zero; descending when
// the first bound is larger) and "{train,val}.tar" is train.tar, val.tar; several and nested
// braces expand left to right. Text without braces is returned as it is. Throws
// std::invalid_argument naming the pattern on an unmatched brace, or when it expands to more than
// a million names or 64 MiB of them (expand_shard_locations holds all its patterns to the same).
std::vector<std::string> expand_shard_braces(const std::string& pattern);

// Parses one shard pattern a user typed (after brace expansion). Throws std::invalid_argument
// naming it for an unsupported URL scheme (s3:// and gs:// are answered with the pipe: command
// that reads them), a file:// URL without an absolute path, or pipe: without a command.
ShardLocation parse_shard_location(const std::string& shard);

// A shard name taken literally, never as a pattern or a command: an http:// or https:// URL (any
// case) is that URL; anything else is a local path, whatever it holds (commas, braces, "pipe:",
// "file://"). For names from data: a folder listing, a glob, an index, a server's answer.
ShardLocation literal_shard_location(const std::string& name);

// Every shard `patterns` (typed by a user) name, in order: each pattern brace-expanded (a pipe:
// command too, as WebDataset does), then parsed. Throws as expand_shard_braces and
// parse_shard_location do.
std::vector<ShardLocation> expand_shard_locations(const std::vector<std::string>& patterns);

// The shard patterns of one command-line argument: `text` split at the commas outside braces
// and quotes ("{train,val}.tar" and "pipe:curl -H 'a, b' URL" stay whole); empty pieces dropped.
std::vector<std::string> split_shard_patterns(const std::string& text);

// The shards one command-line argument names (conveyor-bench --data, conveyor-prepare SRC): an
// argument that names an existing file or folder is that local path, literally, whatever its name
// holds (checked first); anything else is patterns (split_shard_patterns, then
// expand_shard_locations), and throws as those do.
std::vector<ShardLocation> shard_argument_locations(const std::string& text);

// True when `text` (a command-line argument) names tar shards rather than a folder or a file
// list: an existing file or folder when it is a file ending in .tar; otherwise when it starts
// with pipe:, http://, https:// or file://, ends in .tar, or holds '{' and .tar.
bool names_tar_shards(const std::string& text);

}  // namespace conveyor
