// conveyor/storage.h: where the sources' bytes come from: local files and folders, HTTP(S)
// servers, and commands whose output is a shard.
//
// What it is for: one seam between the image sources (datasets.h) and the world, as LevelDB's Env
// is for its tables. A Storage lists a folder and opens a file or URL for reads at random; a
// StorageReader (one per thread: its connections and buffers) reads byte ranges, reads a whole
// resource and opens a stream (a file, one plain GET, a command's output). The sources take a
// Storage through their options (FolderOptions::storage, ShardOptions::storage; null means
// system_storage(), the real one), so a test can give them one that injects faults while the
// shipped path stays as it is.
//
// Requires: a Storage is shared by every worker: its methods are const and thread-safe. A
// StorageReader and a ByteStream are used by one thread at a time. A StorageFile is read only
// through readers of the Storage that opened it, and outlives none of them (shared_ptr).
// Guarantees of system_storage() (POSIX files, libcurl, /bin/sh), which the sources rely on from
// any Storage:
//   * every error is a std::runtime_error (StreamFailure for a stream's attempt) whose message
//     names the path, URL or command and the cause (errno's text, the HTTP status, the exit
//     status and stderr's last lines);
//   * read_at() returns at most `size` bytes, and 0 only at or past the end of the file; a short
//     count is no error, and read_range() and read_file() read on until they have every byte;
//   * every HTTP request, and every wait for a command's output, ends by a deadline
//     (RemoteOptions), and a whole stream by the bound of min_bytes_per_second, so no read
//     blocks forever on a remote source, however slowly it trickles;
//   * an HTTP body is held to its cap while it arrives (read_whole's max_bytes, a range's size),
//     and an error status is reported as that status after at most a small part of its body;
//   * HTTP requests and their redirects (5 at most, to any host) use http and https only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor {

// The largest image the sources read, in bytes (256 MiB): an ImageFolder or FileList file
// (read_file), a tar shard's image member, a sample its index lists. No JPEG a loader decodes is
// that large; a larger one (a sparse file made with `truncate -s 3G`, a forged size field) is
// refused before any memory is allocated for it, as that sample's error (on_error).
constexpr uint64_t kMaxImageBytes = uint64_t{1} << 28;

// Retries and deadlines of remote reads (HTTP(S), and a pipe: command's output).
struct RemoteOptions {
  // HTTP(S): a request that times out, is refused or reset, or gets 5xx, 408 or 429 is tried
  // again up to `retries` more times, after backoff_initial * 2^k (at most backoff_max) before
  // retry k. Other failures (404, a server that ignores Range) are not retried.
  int retries = 4;
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{2000};
  // HTTP(S): the deadline of one request, from connecting to its last byte, and of connecting
  // alone. A read thus ends, at the latest, after (retries + 1) request deadlines plus the
  // backoff. A stream reads a whole shard with one GET, however long it takes: there
  // request_timeout is the longest wait for its next bytes, and the same holds for a pipe:
  // command's output. A stream whose connection drops, or whose command fails, is read again
  // from where it stopped (a Range request, where the server honours it) or from its beginning,
  // skipping the bytes already read; `retries` counts the attempts in a row that brought no new
  // byte.
  std::chrono::milliseconds request_timeout{30000};
  std::chrono::milliseconds connect_timeout{5000};
  // HTTP(S) streams and pipe: commands: the slowest a stream may be, so that a server or command
  // that trickles (a byte every few seconds, each wait within request_timeout) cannot hold a
  // shard forever. A stream that has reached byte N of its resource may have waited for it at
  // most G + N / min_bytes_per_second seconds in all, its retries and their backoff included,
  // where G = (retries + 1) x request_timeout + retries x backoff_max (so a silent source still
  // gets each attempt); past that it fails, not retried, naming this option. So a shard of N
  // bytes is read, or has failed, after G + N / min_bytes_per_second of waiting. The time the
  // consumer holds the bytes handed to it does not count, so a training loop that pauses
  // mid-shard costs nothing. 0: no floor (only request_timeout per wait).
  // Reads at random and whole reads (an index) are bounded by request_timeout per request.
  uint64_t min_bytes_per_second = 64 * 1024;
  // HTTP(S), reads at random: Range requests a reader keeps in flight for the ranges it was told
  // it reads next (StorageReader::will_read), each on its own connection, so that the network
  // hides behind decoding. 1: one request at a time.
  size_t requests_in_flight = 4;
};

// Where bytes are read from: the same forms name shards everywhere (ImageSource::tar_shards,
// conveyor-prepare's SRC, conveyor-bench's --data; parse_shard_location in datasets.h).
struct StorageLocation {
  enum class Kind {
    kLocal,  // a path, or file:///PATH (percent escapes decoded)
    kHttp,   // an http:// or https:// URL
    kPipe,   // pipe:COMMAND: the bytes are what COMMAND, run by /bin/sh -c, writes to stdout
  };
  Kind kind = Kind::kLocal;
  std::string location;  // the path, the URL, or the command (without "pipe:")
  // How messages name it: "pipe:COMMAND" for a command, else `location`.
  std::string name() const;
};

struct FolderEntry {
  std::string name;     // within its folder
  bool folder = false;  // a folder, or a symbolic link to one
};

// A local file or a URL, opened for reads at random by any number of readers.
class StorageFile {
 public:
  static constexpr uint64_t kUnknownSize = ~uint64_t{0};
  virtual ~StorageFile() = default;
  // The path or the URL, as messages name it.
  virtual const std::string& name() const = 0;
  // Bytes when it was opened; kUnknownSize for a URL (nothing is asked of the server at open).
  virtual uint64_t size() const = 0;
};

struct FileRange {
  const StorageFile* file = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// A stream's failed attempt: `transient` ones (a dropped connection, a timeout, a command that
// failed) are tried again by the caller; the message is the cause alone (the caller adds the name
// and the attempts).
struct StreamFailure : std::runtime_error {
  StreamFailure(const std::string& reason, bool transient_failure)
      : std::runtime_error(reason), transient(transient_failure) {}
  bool transient;
};

// What a stream throws when its StreamCancel fired: not a failure of the source.
struct StreamCancelled : std::runtime_error {
  StreamCancelled() : std::runtime_error("the read was cancelled") {}
};

// Wakes a stream that waits for bytes or sleeps before a retry, so that a reader being replaced
// or destroyed stops at once instead of at its deadline. An eventfd, so that poll() and
// curl_multi_poll() wait on it beside their own descriptors.
// Thread safety: cancel() from any thread; the rest from the stream's.
class StreamCancel {
 public:
  StreamCancel();  // throws std::runtime_error if no eventfd can be made
  ~StreamCancel();
  StreamCancel(const StreamCancel&) = delete;
  StreamCancel& operator=(const StreamCancel&) = delete;
  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Readable once cancel() was called.
  int fd() const { return fd_; }
  // Sleeps `duration`, or less when cancelled; false when cancelled.
  bool sleep_for(std::chrono::milliseconds duration) const;

 private:
  int fd_ = -1;
  std::atomic<bool> cancelled_{false};
};

// One attempt at a resource's bytes, in order. The caller restarts a failed attempt (start() again
// with the bytes it already has) and checks what comes twice.
class ByteStream {
 public:
  struct Bytes {
    const uint8_t* data = nullptr;
    size_t size = 0;
  };
  virtual ~ByteStream() = default;
  // Starts an attempt at byte `offset` (0 for the first). Returns where its bytes start: `offset`,
  // or 0 when the source starts over (a command; a server that ignores Range). Throws
  // StreamFailure, StreamCancelled.
  virtual uint64_t start(uint64_t offset) = 0;
  // The attempt's next bytes, valid until the next call; none at the source's end (a whole
  // body, a command that exited 0). Waits at most RemoteOptions::request_timeout for them, and
  // throws a StreamFailure that is not transient once the stream is slower than
  // RemoteOptions::min_bytes_per_second. Throws StreamFailure, StreamCancelled.
  virtual Bytes read() = 0;
  // Ends the attempt: closes its connection, kills its command. No-op when none runs.
  virtual void stop() = 0;
};

// One thread's reads: its own connections (HTTP keep-alive, read-ahead) and buffers.
class StorageReader {
 public:
  virtual ~StorageReader() = default;
  // Up to `size` bytes of `file` from `offset` into `buffer`; returns how many. Fewer than asked
  // is no error; 0 means the file ends at or before `offset`. Throws naming the file (and, for a
  // URL, the range) when the read fails.
  virtual size_t read_at(const StorageFile& file, uint64_t offset, size_t size,
                         uint8_t* buffer) = 0;
  // A hint: the ranges this thread reads next, in order. A remote reader starts up to
  // RemoteOptions::requests_in_flight of their requests at once. Never changes what is read.
  virtual void will_read(const FileRange* ranges, size_t count) {
    (void)ranges;
    (void)count;
  }
  // The whole of `where` (a file, a URL, a command's output) into `out`, at most `max_bytes`.
  // False when it does not exist (no such local file, HTTP 404 or 410); throws naming it when it
  // cannot be read (a command that fails: its exit status and stderr), or is larger than
  // `max_bytes`: a local file is checked before any byte is read, a body or a command's output is
  // stopped once it passes the cap, and a response whose Content-Length is over it is refused
  // before its body is read.
  virtual bool read_whole(const StorageLocation& where, size_t max_bytes,
                          std::vector<uint8_t>& out) = 0;
  // The bytes of `where`, streamed: a local file, one plain GET, a command's output. `cancel`
  // must outlive the stream.
  virtual std::unique_ptr<ByteStream> open_stream(const StorageLocation& where,
                                                  const StreamCancel& cancel) = 0;
};

class Storage {
 public:
  virtual ~Storage() = default;
  // The entries of folder `path`, in no particular order. Throws naming it when it is not a
  // folder that can be read.
  virtual std::vector<FolderEntry> list_folder(const std::string& path) const = 0;
  // Opens `where` (a local path or an http(s):// URL) for reads at random. A local file must be
  // a regular file (a FIFO named like an image is refused without waiting for a writer); throws
  // naming it when it is missing (a dangling symbolic link says so), not a regular file or
  // unreadable. A URL is not asked for anything until read.
  virtual std::shared_ptr<const StorageFile> open_file(const StorageLocation& where) const = 0;
  // A reader for one thread, with `options` for its remote reads.
  virtual std::unique_ptr<StorageReader> reader(const RemoteOptions& options) const = 0;
};

// The real storage: local files through POSIX calls, HTTP(S) through libcurl, pipe: commands
// through /bin/sh -c (in their own process group, killed and reaped when done). Stateless.
std::shared_ptr<const Storage> system_storage();

// Exactly `size` bytes of `file` from `offset` into `out` (reusing its capacity), reading on after
// short reads. Throws naming the file and the range when it ends first ("truncated since the
// index was written?").
void read_range(StorageReader& reader, const StorageFile& file, uint64_t offset, uint64_t size,
                std::vector<uint8_t>& out);
// The whole local file `path` into `out` (reusing its capacity). Throws naming the path when the
// file is missing, not a regular file, unreadable, empty, larger than `max_bytes` (said before
// anything is allocated, naming the size and the limit), or shrank while being read.
void read_file(const Storage& storage, StorageReader& reader, const std::string& path,
               std::vector<uint8_t>& out, uint64_t max_bytes = kMaxImageBytes);
// The same through system_storage().
void read_file(const std::string& path, std::vector<uint8_t>& out,
               uint64_t max_bytes = kMaxImageBytes);

}  // namespace conveyor
