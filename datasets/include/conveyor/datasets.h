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

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/fields.h"
#include "conveyor/sample_source.h"

namespace conveyor {

// Images with labels, decoded into "image" (uint8 [3,S,S] or [S,S,3]) and "label" (int64).
// Items come from a folder tree, a file list, memory, or indexed WebDataset tar shards (local
// or over HTTP). Each image is decoded by its content, never its name (ImageWriter): JPEG and PNG
// are decoded; WebP, BMP, PNM, GIF and TIFF are recognised and are the sample's error, naming the
// format ("a GIF image: no codec for GIF"), which LoaderOptions::on_error raises or skips.
class ImageSource : public FieldSource {
 public:
  // ImageFolder layout: root/<class>/<image> with the extensions torchvision's ImageFolder lists
  // (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case). Classes are the sorted
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
  // Encoded image bytes held in memory (measures decode without the file system).
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

  // The fields are FieldSource's "image" (Field::image(Field::kDefaultImageKeys, transform):
  // a shard sample's .jpg, .jpeg, .png or .webp member) and "label"
  // (Field::integer("cls"): the class, the index's label, or the shard's .cls member), so
  // write_sample(), read_encoded() (GPU decode), describe(), scale_histogram() and work_time() are
  // FieldSource's.
  ~ImageSource() override;
  // The file (and label) of each sample; empty for a shard stream.
  const std::vector<ImageItem>& items() const;
  const ImageTransform& transform() const { return transform_; }

 private:
  ImageSource(std::unique_ptr<Kind> kind, ImageTransform transform);
  ImageTransform transform_;
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
