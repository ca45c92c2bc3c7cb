// conveyor-prepare: turns an ImageFolder, a file list or tar shards (the forms tar_shards reads:
// paths, file://, http(s)://, pipe:COMMAND, brace patterns) into WebDataset tar shards with an
// index (--format wds, read by ImageSource::tar_shards) or into an ImageFolder (--format folder),
// keeping only the images Conveyor's decoder reads.
//
// Guarantees: the output is a pure function of the input files and the options other than
// --workers (same inputs, same bytes): samples keep the source's order, keys are the source's
// sample indices, tar headers carry no time or owner. Every file is written under a temporary
// name and renamed into place when complete; the index is written last, so an index means a
// complete set of shards. Exit status: 0 done, 1 a failure (or an undecodable input under
// --on-error raise), 2 a usage error.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "http.h"
#include "jpeg_segments.h"
#include "restart_markers.h"
#include "shard_stream.h"
#include "shards.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    R"(usage: conveyor-prepare SRC DST --format wds|folder [--shard-size BYTES] [--workers W]
                        [--on-error skip|raise] [--restart N]

SRC   an ImageFolder (SRC/<class>/<image>.jpg|jpeg; classes are the sorted folder names), a
      file list (lines 'path<TAB>label', relative paths relative to the list's folder), or
      WebDataset tar shards, named as tar_shards and conveyor-bench --data name them: local
      paths, file://, http(s)://, "pipe:COMMAND" (its output is the shard, e.g. "pipe:aws s3 cp
      s3://bucket/train-{000000..000146}.tar -"), brace patterns, several comma-separated.
      Shards are read in order, each sample KEY.jpg|jpeg with KEY.cls (other members ignored);
      their index's classes are kept where they have one (for --format folder without one, the
      class folders are the labels as six digits).
DST   --format wds: the shards' prefix. Writes DST-000000.tar, DST-000001.tar, ... (POSIX ustar;
      sample i of SRC becomes members KEY.jpg, the original JPEG bytes, and KEY.cls, its label
      as decimal text, with KEY = i as %08d) and DST.index.json, which gives every sample's shard,
      .jpg data offset and size, and label (read by conveyor::ImageSource::tar_shards).
      --format folder: an ImageFolder at DST (DST/<class>/KEY.jpg); DST must be empty or absent.

--shard-size BYTES  about this many bytes per shard (K, M, G suffixes: powers of 1024);
                    default 256M. A sample larger than that gets a shard of its own.
--workers W         threads for the decode checks; default: all hardware threads.
--on-error skip     an input that cannot be read or decoded by Conveyor's JpegDecoder is reported
                    on stderr with its path and left out (the default).
--on-error raise    such an input stops the run with exit status 1; shards written before it are
                    left, the index is not written.
--restart N         rewrite every JPEG losslessly (DCT coefficients kept; baseline Huffman with
                    optimized tables; APP and COM markers, EXIF included, kept) with a restart
                    marker every N MCUs, or the largest divisor of the MCUs per row below N, so
                    the intervals tile each MCU row (for crop-proportional decoding; 1, the
                    finest cut, was the fastest in BENCHMARKS.md). Each
                    rewrite is decoded and compared with the input's pixels; one that differs
                    counts as undecodable. Each file also gets a segment index (an APP15
                    marker segment listing every interval's length: up to 32,755 intervals of
                    at most 64 kB), so that loading never scans for the markers. The summary
                    gives the size change and how many files got an index.

Progress goes to stderr (a line per shard, or every few seconds); the summary line to stdout.
Shards from an earlier run with more shards are not removed; the index lists the current ones.
)";

struct Options {
  std::string src;
  std::string dst;
  std::string format;
  uint64_t shard_size = 256ull << 20;
  size_t workers = 0;
  bool raise = false;
  int restart = 0;  // MCUs per restart interval; 0: files are copied as they are
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

uint64_t parse_size(const std::string& text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') {
    throw UsageError("--shard-size: '" + text + "' is not a size");
  }
  size_t end = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &end, 10);
  } catch (const std::exception&) {
    throw UsageError("--shard-size: '" + text + "' is not a size");
  }
  const std::string suffix = text.substr(end);
  int shift = 0;
  if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else if (!suffix.empty()) {
    throw UsageError("--shard-size: '" + text + "' is not a size");
  }
  if (v == 0 || v > (UINT64_MAX >> shift)) throw UsageError("--shard-size: out of range");
  return static_cast<uint64_t>(v) << shift;
}

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (arg == "--format") {
      o.format = value();
      if (o.format != "wds" && o.format != "folder") {
        throw UsageError("--format: '" + o.format + "' is neither wds nor folder");
      }
    } else if (arg == "--shard-size") {
      o.shard_size = parse_size(value());
    } else if (arg == "--workers") {
      const std::string w = value();
      char* end = nullptr;
      const unsigned long n = std::strtoul(w.c_str(), &end, 10);
      if (w.empty() || *end != '\0' || n > 4096) throw UsageError("--workers: '" + w + "'");
      o.workers = n;
    } else if (arg == "--on-error") {
      const std::string p = value();
      if (p != "skip" && p != "raise") throw UsageError("--on-error: '" + p + "'");
      o.raise = p == "raise";
    } else if (arg == "--restart") {
      const std::string r = value();
      char* end = nullptr;
      const unsigned long n = std::strtoul(r.c_str(), &end, 10);
      if (r.empty() || *end != '\0' || n < 1 || n > 65535) {
        throw UsageError("--restart: '" + r + "' (MCUs per restart interval, 1..65535)");
      }
      o.restart = static_cast<int>(n);
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError("unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) throw UsageError("expected SRC and DST");
  if (o.format.empty()) throw UsageError("--format wds|folder is required");
  o.src = positional[0];
  o.dst = positional[1];
  if (o.workers == 0) o.workers = std::max(1u, std::thread::hardware_concurrency());
  return o;
}

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

// A file written under `final_path + ".tmp"` and renamed to `final_path` by commit(); removed if
// never committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path)
      : final_(std::move(final_path)), temp_(final_ + ".tmp") {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) io_error(temp_, "cannot create");
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        io_error(temp_, "write failed");
      }
      p += n;
      size -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  uint64_t written() const { return written_; }
  const std::string& path() const { return final_; }

  void commit() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io_error(temp_, "close failed");
    if (::rename(temp_.c_str(), final_.c_str()) != 0) io_error(final_, "cannot rename into place");
    committed_ = true;
  }

 private:
  std::string final_;
  std::string temp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string key_of(size_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08zu", index);
  return buf;
}

constexpr uint64_t kBlock = 512;
uint64_t padded(uint64_t size) { return (size + kBlock - 1) / kBlock * kBlock; }

// A POSIX ustar header for a regular file: mode 0644, owner 0, mtime 0 (reproducible).
std::array<char, kBlock> ustar_header(const std::string& name, uint64_t size) {
  std::array<char, kBlock> h{};
  if (name.size() > 99) throw std::runtime_error("tar member name too long: " + name);
  std::memcpy(h.data(), name.data(), name.size());
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  if (size >= (1ull << 33)) throw std::runtime_error("tar member too large: " + name);
  std::snprintf(h.data() + 124, 12, "%011" PRIo64, size);
  std::snprintf(h.data() + 136, 12, "%011o", 0);
  h[156] = '0';                             // regular file
  std::memcpy(h.data() + 257, "ustar", 6);  // magic "ustar\0"
  std::memcpy(h.data() + 263, "00", 2);     // version
  std::memset(h.data() + 148, ' ', 8);      // the checksum counts its own field as spaces
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);  // six digits, NUL, then the space kept
  h[155] = ' ';
  return h;
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

// --format wds: shards of about shard_size bytes and the index.
class ShardWriter {
 public:
  ShardWriter(std::string dst, uint64_t shard_size, std::vector<std::string> classes)
      : dst_(std::move(dst)), shard_size_(shard_size), classes_(std::move(classes)) {}

  void add(const std::string& key, const std::vector<uint8_t>& jpeg, int64_t label,
           const Progress& progress, size_t done) {
    const std::string cls = std::to_string(label);
    const uint64_t entry = kBlock + padded(jpeg.size()) + kBlock + padded(cls.size());
    if (shard_ && shard_samples_ > 0 && shard_->written() + entry + 2 * kBlock > shard_size_) {
      close_shard(progress, done);
    }
    if (!shard_) open_shard();
    const uint64_t offset = shard_->written() + kBlock;
    write_member(key + ".jpg", jpeg.data(), jpeg.size());
    write_member(key + ".cls", cls.data(), cls.size());
    ++shard_samples_;
    samples_ += "{\"shard\": " + json_string(shard_name_) + ", \"key\": " + json_string(key) +
                ", \"offset\": " + std::to_string(offset) +
                ", \"size\": " + std::to_string(jpeg.size()) + ", \"label\": " + cls + "},\n";
  }

  // Closes the last shard and writes the index. Returns the shards' total bytes.
  uint64_t finish(const Progress& progress, size_t done) {
    if (shard_) close_shard(progress, done);
    if (!samples_.empty()) samples_.resize(samples_.size() - 2);  // the last ",\n"
    std::string index = "{\"format\": \"conveyor-wds-index\", \"version\": 1,\n\"classes\": [";
    for (size_t i = 0; i < classes_.size(); ++i) {
      index += (i ? ", " : "") + json_string(classes_[i]);
    }
    index += "],\n\"shards\": [\n" + shards_;
    if (!shards_.empty()) index.resize(index.size() - 2);
    index += "\n],\n\"samples\": [\n" + samples_ + "\n]}\n";
    AtomicFile file(dst_ + ".index.json");
    file.write(index);
    file.commit();
    return bytes_;
  }
  size_t shards() const { return shard_count_; }

 private:
  void open_shard() {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "-%06zu.tar", shard_count_);
    shard_name_ = fs::path(dst_ + suffix).filename().string();
    shard_ = std::make_unique<AtomicFile>(dst_ + suffix);
    shard_samples_ = 0;
  }
  void write_member(const std::string& name, const void* data, size_t size) {
    const auto header = ustar_header(name, size);
    shard_->write(header.data(), header.size());
    shard_->write(data, size);
    const std::array<char, kBlock> zeros{};
    shard_->write(zeros.data(), padded(size) - size);
  }
  void close_shard(const Progress& progress, size_t done) {
    const std::array<char, 2 * kBlock> end{};  // two zero blocks end the archive
    shard_->write(end.data(), end.size());
    const uint64_t bytes = shard_->written();
    shard_->commit();
    std::cerr << "conveyor-prepare: wrote " << shard_->path() << " (" << shard_samples_
              << " samples, " << bytes << " bytes); " << progress.status(done) << "\n";
    shards_ += "{\"file\": " + json_string(shard_name_) + ", \"bytes\": " + std::to_string(bytes) +
               ", \"samples\": " + std::to_string(shard_samples_) + "},\n";
    bytes_ += bytes;
    ++shard_count_;
    shard_.reset();
  }

  std::string dst_;
  uint64_t shard_size_;
  std::vector<std::string> classes_;
  std::unique_ptr<AtomicFile> shard_;
  std::string shard_name_;
  size_t shard_samples_ = 0;
  size_t shard_count_ = 0;
  uint64_t bytes_ = 0;
  std::string shards_;   // the index's "shards" entries
  std::string samples_;  // the index's "samples" entries
};

// --format folder: DST/<class>/KEY.jpg. Without class names (shards without an index) a label's
// folder is its number as six digits, made when first needed; finish() adds the empty ones below
// the largest label, so that the sorted names give the labels back.
class FolderWriter {
 public:
  FolderWriter(const std::string& dst, std::vector<std::string> classes)
      : dst_(dst), classes_(std::move(classes)) {
    std::error_code ec;
    if (fs::exists(dst_, ec) && !fs::is_empty(dst_, ec)) {
      throw std::runtime_error(dst +
                               ": exists and is not empty (--format folder writes a new "
                               "ImageFolder)");
    }
    for (const auto& c : classes_) fs::create_directories(dst_ / c);
    fs::create_directories(dst_);
  }
  void add(const std::string& key, const std::vector<uint8_t>& jpeg, int64_t label) {
    fs::path folder;
    if (classes_.empty()) {
      if (label < 0 || label >= 1'000'000) {
        throw std::runtime_error("--format folder: label " + std::to_string(label) +
                                 " (without class names, labels 0..999999)");
      }
      folder = dst_ / numbered(label);
      if (label > max_label_) {
        fs::create_directories(folder);
        max_label_ = label;
      }
    } else {
      if (label < 0 || static_cast<size_t>(label) >= classes_.size()) {
        throw std::runtime_error("label " + std::to_string(label) + " outside the index's " +
                                 std::to_string(classes_.size()) + " classes");
      }
      folder = dst_ / classes_[static_cast<size_t>(label)];
    }
    AtomicFile file((folder / (key + ".jpg")).string());
    file.write(jpeg.data(), jpeg.size());
    file.commit();
    bytes_ += jpeg.size();
  }
  uint64_t bytes() const { return bytes_; }
  void finish() const {
    for (int64_t l = 0; classes_.empty() && l < max_label_; ++l) {
      fs::create_directories(dst_ / numbered(l));
    }
  }

 private:
  static std::string numbered(int64_t label) {
    char name[32];
    std::snprintf(name, sizeof name, "%06lld", static_cast<long long>(label));
    return name;
  }
  fs::path dst_;
  std::vector<std::string> classes_;
  int64_t max_label_ = -1;
  uint64_t bytes_ = 0;
};

// Folder names for a file list's labels 0..max: zero-padded to one width, so that the sorted
// names give back the same labels (labels without images get an empty folder).
std::vector<std::string> label_folders(const std::vector<conveyor::ImageItem>& items) {
  int64_t max_label = 0;
  for (const auto& item : items) max_label = std::max(max_label, item.label);
  if (max_label >= 1'000'000) {
    throw std::runtime_error("--format folder: labels up to " + std::to_string(max_label) +
                             " would need that many class folders");
  }
  const size_t width = std::to_string(max_label).size();
  std::vector<std::string> names;
  for (int64_t l = 0; l <= max_label; ++l) {
    std::string s = std::to_string(l);
    names.push_back(std::string(width - s.size(), '0') + s);
  }
  return names;
}

struct Checked {
  std::string name;  // the input's path, or its shard and member
  int64_t label = 0;
  std::vector<uint8_t> bytes;
  std::string error;         // empty when the input read and decoded
  uint64_t input_bytes = 0;  // before a --restart rewrite
  bool indexed = false;      // --restart: the rewrite carries a segment index
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
  explicit ShardInputs(const std::string& src)
      : shards_(conveyor::expand_shard_locations(conveyor::split_shard_patterns(src))) {
    if (shards_.empty()) throw UsageError("SRC names no shards: '" + src + "'");
  }
  const std::vector<conveyor::ShardLocation>& shards() const { return shards_; }

  // Fills window[0, n) with the next samples (name, label, bytes; `error` set for a sample
  // without a label) and returns n: fewer than the window only at the end, or when a shard
  // failed (then `failure` says how, and the next call goes on with the next shard).
  size_t read(std::vector<Checked>& window, std::string& failure) {
    failure.clear();
    size_t n = 0;
    while (n < window.size()) {
      try {
        if (!reader_) {
          if (next_ == shards_.size()) break;
          reader_ = std::make_unique<conveyor::detail::TarSampleReader>(shards_[next_++], options_,
                                                                        http_, never_);
        }
        if (!reader_->next(sample_)) {
          reader_.reset();
          continue;
        }
      } catch (const std::exception& e) {
        reader_.reset();
        failure = e.what();
        return n;
      }
      Checked& c = window[n++];
      c.name = sample_.name;
      c.label = sample_.label;
      c.bytes.swap(sample_.bytes);
      c.error = sample_.has_label ? "" : "no .cls member beside it (the label)";
    }
    return n;
  }

 private:
  std::vector<conveyor::ShardLocation> shards_;
  conveyor::ShardOptions options_;  // the defaults: retries, backoff, deadlines
  std::unique_ptr<conveyor::detail::HttpStreamHandles> http_;
  const conveyor::detail::ReadCancel never_;
  std::unique_ptr<conveyor::detail::TarSampleReader> reader_;
  size_t next_ = 0;
  conveyor::detail::TarSample sample_;
};

int run(const Options& o) {
  std::unique_ptr<conveyor::ImageSource> source;  // SRC as files
  std::unique_ptr<ShardInputs> from_shards;       // SRC as tar shards
  std::vector<std::string> classes;
  std::error_code ec;
  if (conveyor::names_tar_shards(o.src)) {
    from_shards = std::make_unique<ShardInputs>(o.src);
    classes = conveyor::detail::shard_classes(from_shards->shards(), conveyor::ShardOptions{});
  } else if (fs::is_directory(o.src, ec)) {
    source = conveyor::ImageSource::image_folder(o.src, conveyor::ImageTransform{});
    classes = source->classes();
  } else {
    source = conveyor::ImageSource::file_list(o.src, conveyor::ImageTransform{});
  }
  static const std::vector<conveyor::ImageItem> kNoItems;
  const std::vector<conveyor::ImageItem>& items = source ? source->items() : kNoItems;

  std::optional<ShardWriter> shards;
  std::optional<FolderWriter> folder;
  if (o.format == "wds") {
    const fs::path dst(o.dst);
    if (dst.filename().empty()) throw UsageError("DST must name a file prefix for --format wds");
    if (dst.has_parent_path()) fs::create_directories(dst.parent_path());
    shards.emplace(o.dst, o.shard_size, classes);
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
  Progress progress(items.size());
  std::vector<conveyor::JpegDecoder> decoders(o.workers);
  const size_t window = std::max<size_t>(64, o.workers * 32);
  std::vector<Checked> checked(window);
  size_t inputs = 0;  // read so far (written or skipped)
  size_t written = 0;
  size_t skipped = 0;
  size_t failed_shards = 0;
  uint64_t input_bytes = 0;   // of the samples written, as read
  uint64_t output_bytes = 0;  // of the same, as written
  uint64_t indexed = 0;       // of the same, with a segment index
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
              if (!from_shards) conveyor::read_file(c.name, c.bytes);
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
      if (shards) {
        shards->add(key_of(sample), c.bytes, c.label, progress, sample);
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

  uint64_t bytes = 0;
  std::string where;
  if (shards) {
    bytes = shards->finish(progress, inputs);
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
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    std::cerr << "conveyor-prepare: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "conveyor-prepare: " << e.what() << "\n";
    return 1;
  }
}
