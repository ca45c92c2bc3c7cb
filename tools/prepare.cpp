// conveyor-prepare: turns an ImageFolder, a file list or tar shards (the forms tar_shards reads:
// paths, file://, http(s)://, pipe:COMMAND, brace patterns) into WebDataset tar shards with an
// index (--format wds, read by ImageSource::tar_shards) or into an ImageFolder (--format folder),
// keeping only the images Conveyor's decoder reads; or, with --index-only, writes the index of
// WebDataset shards written by anyone, beside them, without rewriting them.
//
// Guarantees: the output is a pure function of the input files and the options other than
// --workers (same inputs, same bytes): samples keep the source's order, keys are the source's
// sample indices, tar headers carry no time or owner (prepare_output.h). Names from data (an
// index's class names) become paths only through detail::path_under. Exit status: 0 done, 1 a
// failure (no sample read from SRC, a name from data that is not one path segment, an
// undecodable input under --on-error raise, an index that exists without --force), 2 a usage
// error. The command line is
// CLI11's (Debian's libcli11-dev); --help is generated from the options below.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "codec/jpeg_segments.h"
#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "prepare_output.h"
#include "restart_markers.h"
#include "shards/index.h"
#include "shards/names.h"
#include "shards/tar_reader.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using conveyor::tools::FolderWriter;
using conveyor::tools::label_folders;
using conveyor::tools::ShardWriter;

struct Options {
  std::string src;
  std::string dst;
  std::vector<std::string> index_only;  // --index-only SHARD...: the shard arguments
  std::string output;                   // --output: where --index-only writes the index
  bool force = false;                   // --force: --index-only may replace an index
  std::string format;
  uint64_t shard_size = 256ull << 20;
  size_t workers = 0;  // 0: all hardware threads
  std::string on_error = "skip";
  bool raise = false;  // --on-error raise
  int restart = 0;     // MCUs per restart interval; 0: files are copied as they are
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The command line, and its --help.
void describe(CLI::App& app, Options& o) {
  app.description(
      "conveyor-prepare: an ImageFolder, a file list or tar shards into WebDataset tar\n"
      "shards with an index (--format wds), or into an ImageFolder (--format folder), keeping\n"
      "only the images Conveyor's decoder reads. Or: conveyor-prepare --index-only SHARD...\n"
      "writes the index of existing WebDataset shards beside them.");
  app.get_formatter()->column_width(22);
  // An option given twice takes its last value, as with most Unix tools (and scripts that
  // append to a default command line).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option(
      "SRC", o.src,
      "an ImageFolder (SRC/<class>/<image>.jpg|jpeg; classes are the sorted folder\n"
      "names), a file list (lines 'path<TAB>label', relative paths relative to the\n"
      "list's folder), or WebDataset tar shards, named as tar_shards and conveyor-bench\n"
      "--data name them: local paths, file://, http(s)://, \"pipe:COMMAND\" (its output\n"
      "is the shard, e.g. \"pipe:aws s3 cp s3://bucket/train-{000000..000146}.tar -\"),\n"
      "brace patterns, several comma-separated (an existing file or folder is always\n"
      "that path, literally). Shards are read in order, each sample a KEY with a\n"
      "KEY.jpg|jpeg member (keys without one are skipped), its label KEY.cls (decimal text;\n"
      "required for --format folder), and for --format wds every other member, carried\n"
      "through byte for byte; their index's classes are kept where they have one (for\n"
      "--format folder without one, the class folders are the labels as six digits).");
  app.add_option(
      "DST", o.dst,
      "--format wds: the shards' prefix. Writes DST-000000.tar, DST-000001.tar, ...\n"
      "(POSIX ustar; sample i of SRC becomes members KEY.jpg, the original JPEG bytes,\n"
      "and KEY.cls, its label as decimal text, with KEY = i as %08d; from shards, the\n"
      "sample's members in their order and with their extensions, the image as above, the\n"
      "others byte for byte) and DST.index.json (version 2), which gives every sample's\n"
      "shard, every member's data offset and size, and label (read by tar_shards).\n"
      "--format folder: an ImageFolder at DST (DST/<class>/KEY.jpg); DST must be empty\n"
      "or absent. Class names from an index must each be one path segment (not empty,\n"
      "'.' or '..', no '/', '\\' or NUL), or the run stops before writing.\n"
      "A SRC that yields no sample is an error (exit 1; no index is written).");
  app.add_option("--format", o.format,
                 "wds (tar shards and their index) or folder (an ImageFolder); required\n"
                 "without --index-only")
      ->check(CLI::IsMember({"wds", "folder"}));
  app.add_option(
         "--index-only", o.index_only,
         "instead of converting, scan these local WebDataset shards (written by\n"
         "anyone: webdataset.ShardWriter, img2dataset, tar) in order, each argument named as\n"
         "SRC's are, and write their index (version 2: every member of every sample, with\n"
         "its data offset and size, and the .cls label where it is decimal text) beside them:\n"
         "PREFIX.index.json for shards named PREFIX-NNNNNN.tar, one PREFIX and folder for\n"
         "all. No shard is rewritten. Each shard is read once, whole. A sample the reader\n"
         "refuses (damaged, over a bound) is reported and left out, or stops the run under\n"
         "--on-error raise (exit 1, no index). Without SRC, DST and --format.")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->type_name("SHARD");
  app.add_option("--output", o.output,
                 "--index-only: write the index to PATH instead (required when the shards do not\n"
                 "share one PREFIX-NNNNNN.tar name and folder); tar_shards then needs\n"
                 "ShardOptions::index (Python: index=) naming it.")
      ->type_name("PATH");
  app.add_flag("--force", o.force,
               "--index-only: replace an index that exists (without it, an existing index is an\n"
               "error, exit 1, and is left as it is).");
  app.add_option("--shard-size", o.shard_size,
                 "about this many bytes per shard (K, M, G suffixes: powers of 1024); default\n"
                 "256M. A sample larger than that gets a shard of its own.")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", o.workers,
                 "threads for the decode checks; default: all hardware threads.")
      ->check(CLI::Range(0, 4096));
  app.add_option("--on-error", o.on_error,
                 "skip: an input that cannot be read or decoded by Conveyor's JpegDecoder is\n"
                 "reported on stderr with its path and left out (the default).\n"
                 "raise: such an input stops the run with exit status 1; shards written before it\n"
                 "are left, the index is not written.")
      ->check(CLI::IsMember({"skip", "raise"}));
  app.add_option(
         "--restart", o.restart,
         "rewrite every JPEG losslessly (DCT coefficients kept; baseline Huffman with\n"
         "optimized tables; APP and COM markers, EXIF included, kept) with a restart marker\n"
         "every N MCUs (1..65535), or the largest divisor of the MCUs per row below N, so\n"
         "the intervals tile each MCU row (for crop-proportional decoding; 1, the finest\n"
         "cut, was the fastest in BENCHMARKS.md). Each rewrite is decoded and compared\n"
         "with the input's pixels; one that differs counts as undecodable. Each file also\n"
         "gets a segment index (an APP15 marker segment listing every interval's length:\n"
         "up to 32,755 intervals of at most 64 kB), so that loading never scans for the\n"
         "markers. The summary gives the size change and how many files got an index.")
      ->type_name("N")
      ->check(CLI::Range(1, 65535));
  app.footer(
      "Progress goes to stderr (a line per shard, or every few seconds); the summary line to\n"
      "stdout. Shards from an earlier run with more shards are not removed; the index lists the\n"
      "current ones.");
}

std::string key_of(size_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08zu", index);
  return buf;
}

class Progress {
 public:
  explicit Progress(size_t total) : total_(total), start_(Clock::now()), last_(start_) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  std::string status(size_t done) const {
    const double s = seconds();
    char buf[128];
    const double rate = s > 0 ? static_cast<double>(done) / s : 0.0;
    if (total_ == 0) {  // shards: the count is not known before the end
      std::snprintf(buf, sizeof buf, "%zu inputs, %.0f images/s", done, rate);
    } else {
      std::snprintf(buf, sizeof buf, "%zu/%zu inputs, %.0f images/s", done, total_, rate);
    }
    return buf;
  }
  // A line every few seconds.
  void tick(size_t done) {
    if (Clock::now() - last_ < std::chrono::seconds(3)) return;
    last_ = Clock::now();
    std::cerr << "conveyor-prepare: " << status(done) << "\n";
  }

 private:
  size_t total_;
  Clock::time_point start_;
  Clock::time_point last_;
};

struct Checked {
  std::string name;  // the input's path, or its shard and member
  int64_t label = 0;
  bool has_label = true;       // false: a shard's sample without a decimal .cls
  std::vector<uint8_t> bytes;  // the image
  std::vector<conveyor::detail::TarMember> members;  // a shard's sample: all its members
  std::vector<uint8_t> data;                         // their bytes (TarSample::data)
  std::string error;                                 // empty when the input read and decoded
  uint64_t input_bytes = 0;                          // before a --restart rewrite
  bool indexed = false;  // --restart: the rewrite carries a segment index
};

// The pixels of a full decode, copied out of the decoder's buffer.
std::vector<uint8_t> pixels_of(conveyor::JpegDecoder& decoder, const std::vector<uint8_t>& jpeg,
                               int& width, int& height) {
  const conveyor::DecodedImage image = decoder.decode(jpeg.data(), jpeg.size());
  width = image.width;
  height = image.height;
  const size_t row = static_cast<size_t>(image.width) * static_cast<size_t>(image.channels);
  std::vector<uint8_t> out(row * static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y) {
    std::memcpy(out.data() + row * static_cast<size_t>(y),
                image.pixels + image.stride * static_cast<size_t>(y), row);
  }
  return out;
}

// --restart: rewrites `bytes` with restart markers and, where it fits, the segment index
// (jpeg_segments.h), and checks that the result decodes to the same pixels. True when it has the
// index.
bool rewrite_with_restarts(conveyor::JpegDecoder& decoder, int target,
                           std::vector<uint8_t>& bytes) {
  int w0 = 0, h0 = 0, w1 = 0, h1 = 0;
  const std::vector<uint8_t> before = pixels_of(decoder, bytes, w0, h0);
  conveyor::tools::RestartRewrite rewritten =
      conveyor::tools::add_restart_markers(bytes.data(), bytes.size(), target);
  std::vector<uint8_t> indexed;
  const bool has_index =
      conveyor::detail::add_segment_index(rewritten.jpeg.data(), rewritten.jpeg.size(), indexed);
  std::vector<uint8_t>& result = has_index ? indexed : rewritten.jpeg;
  if (pixels_of(decoder, result, w1, h1) != before || w0 != w1 || h0 != h1) {
    throw std::runtime_error("the rewrite with restart markers every " +
                             std::to_string(rewritten.interval) +
                             " MCUs decodes to other pixels than the input");
  }
  bytes = std::move(result);
  return has_index;
}

// SRC as tar shards: their samples in order, read by this thread a window at a time (a shard is
// one stream). A shard that fails loses the samples it still held; read() returns what came
// before and says why.
class ShardInputs {
 public:
  // `need_label`: a sample without a decimal .cls is an error (--format folder).
  ShardInputs(const std::string& src, bool need_label)
      : need_label_(need_label),
        shards_(conveyor::shard_argument_locations(src)),
        reader_(conveyor::system_storage()->reader(options_)) {
    if (shards_.empty()) throw UsageError("SRC names no shards: '" + src + "'");
  }
  const std::vector<conveyor::ShardLocation>& shards() const { return shards_; }

  // Fills window[0, n) with the next samples (name, label, bytes; `error` set for a sample
  // without a label, or one the shard's reader refused) and returns n: fewer than the window only
  // at the end, or when a shard failed (then `failure` says how, and the next call goes on with the
  // next shard).
  size_t read(std::vector<Checked>& window, std::string& failure) {
    failure.clear();
    size_t n = 0;
    while (n < window.size()) {
      try {
        if (!samples_) {
          if (next_ == shards_.size()) break;
          samples_ = std::make_unique<conveyor::detail::TarSampleReader>(
              shards_[next_++], *reader_, options_, never_, conveyor::detail::SampleRule::kMembers);
        }
        if (!samples_->next(sample_)) {
          samples_.reset();
          continue;
        }
      } catch (const std::exception& e) {
        samples_.reset();
        failure = e.what();
        return n;
      }
      const bool image = !sample_.error.empty() || sample_.find("jpg") || sample_.find("jpeg");
      const bool cls = sample_.find("cls") != nullptr;
      Checked& c = window[n++];
      c.name = sample_.name;
      c.label = sample_.label;
      c.has_label = sample_.has_label;
      c.bytes.swap(sample_.bytes);
      c.members.swap(sample_.members);
      c.data.swap(sample_.data);
      c.error = !sample_.error.empty()              ? sample_.error
                : !image                            ? "no .jpg or .jpeg member (the image)"
                : sample_.has_label || !need_label_ ? ""
                : cls                               ? "its .cls member is not a decimal label"
                                                    : "no .cls member beside it (the label)";
    }
    return n;
  }

 private:
  bool need_label_;
  std::vector<conveyor::ShardLocation> shards_;
  conveyor::RemoteOptions options_;                  // the defaults: retries, backoff, deadlines
  std::unique_ptr<conveyor::StorageReader> reader_;  // kept across shards: connections reused
  const conveyor::StreamCancel never_;
  std::unique_ptr<conveyor::detail::TarSampleReader> samples_;
  size_t next_ = 0;
  conveyor::detail::TarSample sample_;
};

// --index-only: the index of the shards o.index_only name, written beside them (or to --output).
int index_only(const Options& o) {
  namespace detail = conveyor::detail;
  std::vector<conveyor::ShardLocation> shards;
  for (const std::string& argument : o.index_only) {
    for (auto& shard : conveyor::shard_argument_locations(argument)) {
      if (shard.kind != conveyor::ShardLocation::Kind::kLocal) {
        throw UsageError("--index-only reads local shards; '" + shard.name() + "' is not one");
      }
      shards.push_back(std::move(shard));
    }
  }
  if (shards.empty()) throw UsageError("--index-only: the arguments name no shards");
  std::string index_path = o.output;
  if (index_path.empty()) {  // PREFIX.index.json, the same for every shard
    for (const auto& shard : shards) {
      if (!detail::has_index_name(shard)) {
        throw UsageError("--index-only: shard '" + shard.name() +
                         "' is not named PREFIX-NNNNNN.tar; give --output PATH for the index");
      }
      const std::string beside = detail::index_location_for(shard).location;
      if (!index_path.empty() && beside != index_path) {
        throw UsageError(
            "--index-only: the shards have no common PREFIX-NNNNNN.tar name and "
            "folder (" +
            index_path + ", " + beside + "); give --output PATH");
      }
      index_path = beside;
    }
  }
  std::set<std::string> files;  // the index names each shard by its file name: once
  for (const auto& shard : shards) {
    if (!files.insert(detail::file_name_of(shard)).second) {
      throw UsageError("--index-only: two shards named " + detail::file_name_of(shard) +
                       " (the index names shards by file name)");
    }
  }
  std::error_code ec;
  if (fs::exists(index_path, ec) && !o.force) {
    std::cerr << "conveyor-prepare: " << index_path
              << " exists; --force replaces it (nothing written)\n";
    return 1;
  }
  const conveyor::RemoteOptions remote;
  const conveyor::StreamCancel never;
  const std::unique_ptr<conveyor::StorageReader> reader =
      conveyor::system_storage()->reader(remote);
  detail::ShardIndex index;
  detail::TarSample sample;
  std::vector<detail::IndexedMember> members;
  size_t samples = 0, member_count = 0, skipped = 0, failed_shards = 0;
  for (const auto& shard : shards) {
    detail::IndexedShard& indexed = index.shards.emplace_back();
    indexed.file = detail::file_name_of(shard);
    indexed.bytes = fs::file_size(shard.location);  // throws naming it when it cannot be read
    try {
      detail::TarSampleReader reader_of(shard, *reader, remote, never,
                                        detail::SampleRule::kMembers);
      while (reader_of.next(sample)) {
        if (!sample.error.empty()) {
          std::cerr << "conveyor-prepare: " << (o.raise ? "" : "skipping ") << sample.name << ": "
                    << sample.error << "\n";
          if (o.raise) {
            std::cout << "conveyor-prepare: stopped at a sample that cannot be read (--on-error "
                         "raise): the index not written\n";
            return 1;
          }
          ++skipped;
          continue;
        }
        members.clear();
        for (const detail::TarMember& m : sample.members) {
          members.push_back({index.name_member(m.extension), m.shard_offset, m.size});
        }
        detail::IndexedSample entry;
        entry.key = sample.key;
        entry.label = sample.label;
        entry.has_label = sample.has_label;
        index.add_sample(indexed, std::move(entry), members);
        ++samples;
        member_count += members.size();
      }
    } catch (const std::exception& e) {
      std::cerr << "conveyor-prepare: " << e.what() << "\n";
      if (o.raise) {
        std::cout << "conveyor-prepare: stopped at a shard that could not be read (--on-error "
                     "raise): the index not written\n";
        return 1;
      }
      ++failed_shards;  // the samples read before the failure stay indexed
    }
    if (fs::file_size(shard.location) != indexed.bytes) {
      throw std::runtime_error(shard.location + " changed while it was read");
    }
    std::cerr << "conveyor-prepare: " << shard.location << ": " << indexed.samples.size()
              << " samples\n";
  }
  if (samples == 0) {
    std::cerr << "conveyor-prepare: no samples in the shards: the index not written\n";
    return 1;
  }
  conveyor::tools::AtomicFile file(index_path);
  const std::string text = detail::write_index(index);
  file.write(text.data(), text.size());
  file.commit();
  std::cout << "conveyor-prepare: indexed " << samples << " samples (" << member_count
            << " members) of " << shards.size() << " shards in " << index_path << "; " << skipped
            << " skipped (unreadable)"
            << (failed_shards > 0 ? ", " + std::to_string(failed_shards) +
                                        " shards cut short (their other samples lost)"
                                  : std::string())
            << "\n";
  return 0;
}

int run(const Options& o) {
  std::unique_ptr<conveyor::ImageSource> source;  // SRC as files
  std::unique_ptr<ShardInputs> from_shards;       // SRC as tar shards
  std::vector<std::string> classes;
  std::error_code ec;
  if (conveyor::names_tar_shards(o.src)) {
    from_shards = std::make_unique<ShardInputs>(o.src, o.format == "folder");
    classes = conveyor::detail::shard_classes(from_shards->shards(), conveyor::ShardOptions{});
  } else if (fs::is_directory(o.src, ec)) {
    source = conveyor::ImageSource::image_folder(o.src, conveyor::ImageTransform{});
    classes = source->classes();
  } else {
    source = conveyor::ImageSource::file_list(o.src, conveyor::ImageTransform{});
  }
  static const std::vector<conveyor::ImageItem> kNoItems;
  const std::vector<conveyor::ImageItem>& items = source ? source->items() : kNoItems;

  Progress progress(items.size());
  size_t inputs = 0;    // read so far (written or skipped)
  size_t reported = 0;  // inputs done, for the line of a shard being written
  std::optional<ShardWriter> shards;
  std::optional<FolderWriter> folder;
  if (o.format == "wds") {
    const fs::path dst(o.dst);
    if (dst.filename().empty()) throw UsageError("DST must name a file prefix for --format wds");
    if (dst.has_parent_path()) fs::create_directories(dst.parent_path());
    shards.emplace(
        o.dst, o.shard_size, classes, [&](const std::string& path, size_t samples, uint64_t bytes) {
          std::cerr << "conveyor-prepare: wrote " << path << " (" << samples << " samples, "
                    << bytes << " bytes); " << progress.status(reported) << "\n";
        });
  } else {
    folder.emplace(o.dst, !classes.empty() || from_shards ? classes : label_folders(items));
  }

  if (from_shards) {
    std::cerr << "conveyor-prepare: " << from_shards->shards().size() << " shards from " << o.src
              << ", " << o.workers << " workers\n";
  } else {
    std::cerr << "conveyor-prepare: " << items.size() << " inputs from " << o.src << ", "
              << o.workers << " workers\n";
  }
  std::vector<conveyor::JpegDecoder> decoders(o.workers);
  const std::shared_ptr<const conveyor::Storage> storage = conveyor::system_storage();
  std::vector<std::unique_ptr<conveyor::StorageReader>> readers;
  for (size_t w = 0; w < o.workers; ++w) readers.push_back(storage->reader({}));
  const size_t window = std::max<size_t>(64, o.workers * 32);
  std::vector<Checked> checked(window);
  size_t written = 0;
  size_t skipped = 0;
  size_t failed_shards = 0;
  uint64_t input_bytes = 0;                  // of the samples written, as read
  uint64_t output_bytes = 0;                 // of the same, as written
  uint64_t indexed = 0;                      // of the same, with a segment index
  std::vector<ShardWriter::Member> members;  // of a shard's sample, as written
  while (true) {
    const size_t begin = inputs;
    size_t count = 0;
    std::string shard_failure;
    if (from_shards) {
      count = from_shards->read(checked, shard_failure);
    } else {
      count = std::min(window, items.size() - begin);
      for (size_t i = 0; i < count; ++i) {
        checked[i].name = items[begin + i].path;
        checked[i].label = items[begin + i].label;
        checked[i].error.clear();
      }
    }
    if (count == 0 && shard_failure.empty()) break;
    std::atomic<size_t> next{0};
    {
      std::vector<std::jthread> threads;
      for (size_t w = 0; w < std::min(o.workers, count); ++w) {
        threads.emplace_back([&, w] {
          for (size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
            Checked& c = checked[i];
            if (!c.error.empty()) continue;  // a shard's sample without a label
            try {
              if (!from_shards) conveyor::read_file(*storage, *readers[w], c.name, c.bytes);
              c.input_bytes = c.bytes.size();
              if (o.restart > 0) {
                c.indexed = rewrite_with_restarts(decoders[w], o.restart, c.bytes);
              } else {
                decoders[w].decode(c.bytes.data(), c.bytes.size());
              }
            } catch (const std::exception& e) {
              c.error = e.what();
              if (c.error.empty()) c.error = "unknown error";
            }
          }
        });
      }
    }  // joined
    for (size_t i = 0; i < count; ++i) {
      const Checked& c = checked[i];
      const size_t sample = begin + i;
      if (!c.error.empty()) {
        const std::string message = c.name + ": " + c.error;
        if (o.raise) {
          std::cerr << "conveyor-prepare: " << message << "\n";
          std::cout << "conveyor-prepare: stopped at an undecodable input (--on-error raise): "
                    << written << " samples written, 1 failed, the index not written\n";
          return 1;  // the shard being written is removed; those before it stay
        }
        std::cerr << "conveyor-prepare: skipping " << message << "\n";
        ++skipped;
        continue;
      }
      input_bytes += c.input_bytes;
      output_bytes += c.bytes.size();
      indexed += c.indexed ? 1 : 0;
      reported = sample;
      if (shards && from_shards) {  // every member: the image as checked, the others as read
        members.clear();
        bool image = false;
        for (const conveyor::detail::TarMember& m : c.members) {
          if (!image && conveyor::detail::is_image_extension(m.extension)) {
            image = true;
            members.push_back({m.extension, c.bytes.data(), c.bytes.size()});
          } else {
            members.push_back({m.extension, c.data.data() + m.data_begin, m.size});
          }
        }
        shards->add(key_of(sample), members, c.label, c.has_label);
      } else if (shards) {
        shards->add(key_of(sample), c.bytes, c.label);
      } else {
        folder->add(key_of(sample), c.bytes, c.label);
      }
      ++written;
    }
    inputs += count;
    progress.tick(inputs);
    if (!shard_failure.empty()) {
      ++failed_shards;
      if (o.raise) {
        std::cerr << "conveyor-prepare: " << shard_failure << "\n";
        std::cout << "conveyor-prepare: stopped at a shard that could not be read (--on-error "
                     "raise): "
                  << written << " samples written, the index not written\n";
        return 1;
      }
      std::cerr << "conveyor-prepare: skipping the rest of a shard: " << shard_failure << "\n";
    }
  }

  if (inputs == 0) {
    std::cerr << "conveyor-prepare: no samples were read from " << o.src
              << (failed_shards > 0 ? " (" + std::to_string(failed_shards) +
                                          " shards could not be read; see above)"
                                    : std::string())
              << ": nothing written, the index not written\n";
    return 1;
  }
  uint64_t bytes = 0;
  std::string where;
  if (shards) {
    reported = inputs;
    bytes = shards->finish();
    where = std::to_string(shards->shards()) + " shards and " + o.dst + ".index.json";
  } else {
    folder->finish();
    bytes = folder->bytes();
    where = "ImageFolder " + o.dst;
  }
  char rate[64];
  const double s = progress.seconds();
  std::snprintf(rate, sizeof rate, "%.1f s, %.0f images/s", s,
                s > 0 ? static_cast<double>(inputs) / s : 0.0);
  std::cout << "conveyor-prepare: " << written << " samples written, " << skipped
            << " skipped (unreadable or undecodable)"
            << (failed_shards > 0 ? ", " + std::to_string(failed_shards) +
                                        " shards cut short (their other samples lost)"
                                  : std::string())
            << "; " << bytes << " bytes in " << where << "; " << rate << "\n";
  if (o.restart > 0) {
    char change[224];
    std::snprintf(
        change, sizeof change,
        "conveyor-prepare: restart markers every %d MCUs (at most): JPEG bytes %" PRIu64
        " -> %" PRIu64 " (%+.1f%%); %" PRIu64 " files with a segment index\n",
        o.restart, input_bytes, output_bytes,
        input_bytes > 0
            ? 100.0 * (static_cast<double>(output_bytes) / static_cast<double>(input_bytes) - 1.0)
            : 0.0,
        indexed);
    std::cout << change;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app("", "conveyor-prepare");
  describe(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help
      std::cout << app.help();
      return 0;
    }
    std::cerr << "conveyor-prepare: " << e.what() << "\n\n" << app.help();
    return 2;
  }
  if (options.workers == 0) options.workers = std::max(1u, std::thread::hardware_concurrency());
  options.raise = options.on_error == "raise";
  try {
    if (!options.index_only.empty()) {
      if (!options.src.empty() || !options.format.empty()) {
        throw UsageError("--index-only takes shards only (no SRC, DST or --format)");
      }
      return index_only(options);
    }
    if (options.src.empty() || options.dst.empty()) throw UsageError("SRC and DST are required");
    if (options.format.empty()) throw UsageError("--format is required");
    if (!options.output.empty() || options.force) {
      throw UsageError("--output and --force go with --index-only");
    }
    return run(options);
  } catch (const UsageError& e) {
    std::cerr << "conveyor-prepare: " << e.what() << "\n\n" << app.help();
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "conveyor-prepare: " << e.what() << "\n";
    return 1;
  }
}
