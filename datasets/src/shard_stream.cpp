// ShardStream: streaming mode of ImageSource::tar_shards (see shard_stream.h), and what it reads
// shards through: restarting byte streams, pipe: commands, and the tar sample reader.
#include "shard_stream.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "conveyor/random.h"
#include "http.h"

extern char** environ;

namespace conveyor {
namespace detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kMaxMemberBytes = int64_t{1} << 28;  // a .jpg member larger is refused
constexpr size_t kSpareBuffers = 64;
constexpr size_t kInitialBuffer = 100;  // samples in the shuffle buffer before the first comes out
constexpr size_t kPipeRead = 1 << 20;   // bytes of a command's output read at once
constexpr size_t kStderrKept = 4096;    // the end of a command's stderr, for its error
constexpr size_t kMessageLine = 600;    // a failed shard's line in an error, at most

std::string seconds_text(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

// `text` on one line: line breaks become " | ", and it is cut at kMessageLine characters.
std::string one_line(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < kMessageLine; ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      if (!out.empty() && out.compare(out.size() - std::min<size_t>(3, out.size()), 3, " | ") != 0)
        out += " | ";
    } else {
      out += text[i];
    }
  }
  if (out.size() >= kMessageLine) out += "...";
  return out;
}

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ReadCancel

ReadCancel::ReadCancel() : event_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (event_.get() < 0) {
    throw std::runtime_error(std::string("tar_shards: eventfd failed: ") + std::strerror(errno));
  }
}

void ReadCancel::cancel() {
  cancelled_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(event_.get(), &one, sizeof one);
}

bool ReadCancel::sleep_for(std::chrono::milliseconds duration) const {
  const auto deadline = Clock::now() + duration;
  while (!cancelled()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return true;
    pollfd fd{event_.get(), POLLIN, 0};
    ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// ShardByteStream

ShardByteStream::ShardByteStream(std::string name, const ShardOptions& options,
                                 const ReadCancel& cancel)
    : options_(options), cancel_(cancel), name_(std::move(name)) {}

std::span<const uint8_t> ShardByteStream::next() {
  if (ended_) return {};
  int failures = 0;  // attempts in a row that brought no new byte
  Clock::time_point first_failure;
  while (true) {
    if (cancel_.cancelled()) throw ReadCancelled();
    try {
      if (!running_) {
        running_ = true;
        position_ = start(delivered_);
        if (position_ > delivered_) {
          throw StreamFailure("the source started at byte " + std::to_string(position_) +
                                  ", past the " + std::to_string(delivered_) + " bytes read",
                              false);
        }
      }
      while (true) {
        std::span<const uint8_t> bytes = read();
        if (bytes.empty()) {
          if (position_ < delivered_) {
            throw StreamFailure("it ended at byte " + std::to_string(position_) +
                                    " when read again, before the " + std::to_string(delivered_) +
                                    " bytes read before: the shard changed while being read",
                                false);
          }
          stop();
          running_ = false;
          ended_ = true;
          return {};
        }
        const uint64_t at = position_;
        position_ += bytes.size();
        if (at < delivered_) {  // read again after a restart from the beginning: dropped
          const auto again = static_cast<size_t>(std::min<uint64_t>(bytes.size(), delivered_ - at));
          check_again(at, bytes.first(again));
          bytes = bytes.subspan(again);
          if (bytes.empty()) continue;
        }
        remember(bytes);
        delivered_ += bytes.size();
        return bytes;
      }
    } catch (const StreamFailure& failure) {
      stop();
      running_ = false;
      if (failures == 0) first_failure = Clock::now();
      ++failures;
      const std::string attempts = failures > 1
                                       ? ", after " + std::to_string(failures) + " attempts over " +
                                             seconds_text(Clock::now() - first_failure)
                                       : std::string();
      if (!failure.transient || failures > options_.retries) {
        throw std::runtime_error(name_ + ": " + failure.what() + attempts);
      }
      auto wait = options_.backoff_initial;
      for (int k = 1; k < failures && wait < options_.backoff_max; ++k) wait *= 2;
      if (!cancel_.sleep_for(std::min(wait, options_.backoff_max))) throw ReadCancelled();
    }
  }
}

void ShardByteStream::finish() {
  while (!next().empty()) {
  }
}

void ShardByteStream::remember(std::span<const uint8_t> bytes) {
  if (tail_.empty()) tail_.resize(kCheckedTail);
  const size_t keep = std::min(bytes.size(), kCheckedTail);
  uint64_t at = delivered_ + bytes.size() - keep;
  const uint8_t* from = bytes.data() + bytes.size() - keep;
  for (size_t left = keep; left > 0;) {
    const size_t ring = static_cast<size_t>(at % kCheckedTail);
    const size_t run = std::min(left, kCheckedTail - ring);
    std::memcpy(tail_.data() + ring, from, run);
    from += run;
    at += run;
    left -= run;
  }
}

void ShardByteStream::check_again(uint64_t at, std::span<const uint8_t> bytes) const {
  const uint64_t kept_from = delivered_ - std::min<uint64_t>(delivered_, kCheckedTail);
  for (uint64_t p = std::max(at, kept_from); p < at + bytes.size();) {
    const size_t ring = static_cast<size_t>(p % kCheckedTail);
    const size_t run =
        static_cast<size_t>(std::min<uint64_t>(kCheckedTail - ring, at + bytes.size() - p));
    if (std::memcmp(tail_.data() + ring, bytes.data() + (p - at), run) != 0) {
      throw StreamFailure("read again from its beginning, its bytes before byte " +
                              std::to_string(delivered_) +
                              " differ from the first read: the shard changed while being read",
                          false);
    }
    p += run;
  }
}

// ---------------------------------------------------------------------------------------------
// pipe: commands

namespace {

// `command` run by /bin/sh -c in a new process group, stdin /dev/null, stdout and stderr through
// pipes. The destructor kills the group and reaps the shell.
class ChildProcess {
 public:
  explicit ChildProcess(const std::string& command) {
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    if (::pipe2(out, O_CLOEXEC) != 0) fail_start(command, "pipe2", errno);
    FileDescriptor out_write(out[1]);
    out_ = FileDescriptor(out[0]);
    if (::pipe2(err, O_CLOEXEC) != 0) fail_start(command, "pipe2", errno);
    FileDescriptor err_write(err[1]);
    err_ = FileDescriptor(err[0]);

    struct Actions {
      posix_spawn_file_actions_t value;
      Actions() { posix_spawn_file_actions_init(&value); }
      ~Actions() { posix_spawn_file_actions_destroy(&value); }
    } actions;
    posix_spawn_file_actions_addopen(&actions.value, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions.value, out_write.get(), 1);
    posix_spawn_file_actions_adddup2(&actions.value, err_write.get(), 2);
    struct Attributes {
      posix_spawnattr_t value;
      Attributes() { posix_spawnattr_init(&value); }
      ~Attributes() { posix_spawnattr_destroy(&value); }
    } attributes;
    // Its own process group (killed as one), no signal blocked, SIGPIPE and the like at their
    // defaults even where this process ignores them (Python does).
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&defaults, sig);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setpgroup(&attributes.value, 0);
    posix_spawnattr_setsigdefault(&attributes.value, &defaults);
    posix_spawnattr_setsigmask(&attributes.value, &none);
    posix_spawnattr_setflags(
        &attributes.value, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
    pid_t pid = -1;
    const int status = ::posix_spawn(&pid, "/bin/sh", &actions.value, &attributes.value,
                                     const_cast<char* const*>(argv), environ);
    if (status != 0) fail_start(command, "posix_spawn /bin/sh", status);
    pid_ = pid;
  }
  ~ChildProcess() { kill_and_reap(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int out() const { return out_.get(); }
  int err() const { return err_.get(); }

  // The shell's wait status once it exited (what is left of its group is killed then), or
  // nothing yet.
  std::optional<int> exited() {
    if (pid_ <= 0) return exit_status_;
    siginfo_t info{};
    // WNOWAIT: the shell stays a zombie, so its pid (the group's id) is not reused before the
    // group is killed.
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid == 0) {
      return std::nullopt;
    }
    kill_and_reap();
    return exit_status_;
  }

  void kill_and_reap() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    exit_status_ = status;
    pid_ = -1;
  }

 private:
  [[noreturn]] static void fail_start(const std::string& command, const char* what, int error) {
    throw StreamFailure(std::string("cannot run it: ") + what + ": " + std::strerror(error) +
                            " (command: " + command + ")",
                        false);
  }

  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  FileDescriptor out_, err_;
};

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "was killed by signal " + std::to_string(WTERMSIG(status)) +
           (name != nullptr ? std::string(" (") + name + ")" : std::string());
  }
  return "ended with wait status " + std::to_string(status);
}

class PipeShardStream final : public ShardByteStream {
 public:
  PipeShardStream(std::string command, const ShardOptions& options, const ReadCancel& cancel)
      : ShardByteStream("pipe:" + command, options, cancel), command_(std::move(command)) {}
  ~PipeShardStream() override { stop(); }

 protected:
  uint64_t start(uint64_t) override {
    stop();
    stderr_.clear();
    child_ = std::make_unique<ChildProcess>(command_);
    out_open_ = true;
    err_open_ = true;
    return 0;  // a command always starts over
  }

  std::span<const uint8_t> read() override {
    const auto deadline = Clock::now() + options_.request_timeout;
    if (buffer_.size() < kPipeRead) buffer_.resize(kPipeRead);
    while (out_open_) {
      if (Clock::now() >= deadline) {
        throw StreamFailure("wrote nothing for " + seconds_text(options_.request_timeout) +
                                " (ShardOptions::request_timeout)" + stderr_text(),
                            true);
      }
      pollfd fds[3] = {{child_->out(), POLLIN, 0},
                       {err_open_ ? child_->err() : -1, POLLIN, 0},
                       {cancel_.fd(), POLLIN, 0}};
      if (::poll(fds, 3, milliseconds_until(deadline)) < 0) {
        if (errno == EINTR) continue;
        throw StreamFailure(std::string("poll failed: ") + std::strerror(errno), true);
      }
      if (fds[2].revents != 0) throw ReadCancelled();
      if (fds[1].revents != 0) drain_stderr();
      if (fds[0].revents != 0) {
        const ssize_t n = ::read(child_->out(), buffer_.data(), buffer_.size());
        if (n > 0) return {buffer_.data(), static_cast<size_t>(n)};
        if (n == 0) {
          out_open_ = false;
        } else if (errno != EINTR) {
          throw StreamFailure(std::string("reading its output failed: ") + std::strerror(errno),
                              true);
        }
      }
    }
    // Its output ended: the exit status decides. What it still writes on stderr is kept.
    while (true) {
      const std::optional<int> status = child_->exited();
      if (status) {
        if (err_open_) drain_stderr();
        if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return {};
        throw StreamFailure(exit_text(*status) + stderr_text(), true);
      }
      if (Clock::now() >= deadline) {
        throw StreamFailure("closed its output but did not exit within " +
                                seconds_text(options_.request_timeout) + stderr_text(),
                            true);
      }
      pollfd fds[2] = {{err_open_ ? child_->err() : -1, POLLIN, 0}, {cancel_.fd(), POLLIN, 0}};
      ::poll(fds, 2, std::min(10, milliseconds_until(deadline)));
      if (fds[1].revents != 0) throw ReadCancelled();
      if (fds[0].revents != 0) drain_stderr();
    }
  }

  void stop() override { child_.reset(); }

 private:
  // Reads what stderr has now (without waiting), keeping its last kStderrKept bytes.
  void drain_stderr() {
    char chunk[4096];
    while (err_open_) {
      pollfd fd{child_->err(), POLLIN, 0};
      if (::poll(&fd, 1, 0) <= 0 || fd.revents == 0) return;
      const ssize_t n = ::read(child_->err(), chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err_open_ = false;
        return;
      }
      stderr_.append(chunk, static_cast<size_t>(n));
      if (stderr_.size() > 2 * kStderrKept) stderr_.erase(0, stderr_.size() - kStderrKept);
    }
  }

  // "; its stderr ended: LINE | LINE | LINE" (its last three lines), or "; nothing on stderr".
  std::string stderr_text() const {
    std::vector<std::string> lines;
    size_t end = stderr_.size();
    while (end > 0 && lines.size() < 3) {
      const size_t begin = stderr_.rfind('\n', end - 1);
      const size_t from = begin == std::string::npos ? 0 : begin + 1;
      std::string line = stderr_.substr(from, end - from);
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) {
        line.pop_back();
      }
      if (!line.empty()) lines.insert(lines.begin(), line.substr(0, 200));
      if (begin == std::string::npos) break;
      end = begin;
    }
    if (lines.empty()) return "; nothing on stderr";
    std::string text = "; its stderr ended: ";
    for (size_t i = 0; i < lines.size(); ++i) text += (i > 0 ? " | " : "") + lines[i];
    return text;
  }

  std::string command_;
  std::unique_ptr<ChildProcess> child_;
  std::vector<uint8_t> buffer_;
  std::string stderr_;
  bool out_open_ = false;
  bool err_open_ = false;
};

}  // namespace

std::unique_ptr<ShardByteStream> open_pipe_stream(const std::string& command,
                                                  const ShardOptions& options,
                                                  const ReadCancel& cancel) {
  return std::make_unique<PipeShardStream>(command, options, cancel);
}

bool read_command_output(const std::string& command, const ShardOptions& options, size_t max_bytes,
                         std::vector<uint8_t>& out, std::string& failure) {
  ShardOptions once = options;
  once.retries = 0;
  const ReadCancel never;
  PipeShardStream stream(command, once, never);
  out.clear();
  try {
    for (auto bytes = stream.next(); !bytes.empty(); bytes = stream.next()) {
      if (out.size() + bytes.size() > max_bytes) {
        failure = "pipe:" + command + ": wrote more than " + std::to_string(max_bytes) + " bytes";
        return false;
      }
      out.insert(out.end(), bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    failure = e.what();
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// TarSampleReader

namespace {

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};
using Archive = std::unique_ptr<archive, ArchiveFree>;

Archive new_tar_reader() {
  Archive a(archive_read_new());
  if (!a) throw std::runtime_error("tar_shards: archive_read_new failed");
  archive_read_support_format_tar(a.get());
  return a;
}

std::string archive_message(archive* a) {
  const char* text = archive_error_string(a);
  return text != nullptr ? text : "unknown libarchive error";
}

// WebDataset's rule: the key is the path up to the first dot of its last component, the
// extension the rest ("a/b.c.jpg" -> "a/b", "c.jpg"); the extension is compared in lower case.
void split_member(const std::string& path, std::string& key, std::string& extension) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) {
    key = path;
    extension.clear();
    return;
  }
  key = path.substr(0, dot);
  extension = path.substr(dot + 1);
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

bool is_image(const std::string& extension) { return extension == "jpg" || extension == "jpeg"; }

}  // namespace

struct TarSampleReader::State {
  std::string name;  // the shard, for messages
  Archive tar;
  FileDescriptor fd;                        // a local shard
  std::unique_ptr<ShardByteStream> stream;  // a remote or pipe: shard
  std::exception_ptr failure;               // what the stream threw inside libarchive's read
  archive_entry* entry = nullptr;
  bool held = false;  // `entry`'s header was read, its data not yet
  bool archive_ended = false;
  bool finished = false;
  std::string member, key, extension, sample_key;  // scratch, reused

  static la_ssize_t read(archive* a, void* self_ptr, const void** buffer) {
    auto* self = static_cast<State*>(self_ptr);
    try {
      const std::span<const uint8_t> bytes = self->stream->next();
      *buffer = bytes.data();
      return static_cast<la_ssize_t>(bytes.size());
    } catch (...) {
      self->failure = std::current_exception();
      archive_set_error(a, EIO, "the shard's read failed");
      return -1;
    }
  }

  // The stream's own error where it caused libarchive's, else libarchive's, naming the shard.
  [[noreturn]] void fail(const std::string& where) {
    if (failure) std::rethrow_exception(failure);
    throw std::runtime_error(where + ": " + archive_message(tar.get()));
  }

  // Reads the current member's data into `out` (exactly `size` bytes).
  void read_member(int64_t size, const std::string& what, std::vector<uint8_t>& out) {
    out.resize(static_cast<size_t>(size));
    size_t done = 0;
    while (done < out.size()) {
      const la_ssize_t n = archive_read_data(tar.get(), out.data() + done, out.size() - done);
      if (n < 0) fail(what);
      if (n == 0) {
        throw std::runtime_error(what + ": the member ends after " + std::to_string(done) + " of " +
                                 std::to_string(size) + " bytes (truncated shard)");
      }
      done += static_cast<size_t>(n);
    }
  }
};

TarSampleReader::TarSampleReader(const ShardLocation& shard, const ShardOptions& options,
                                 std::unique_ptr<HttpStreamHandles>& http, const ReadCancel& cancel)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.name = shard.name();
  s.tar = new_tar_reader();
  int opened = ARCHIVE_OK;
  if (shard.kind == ShardLocation::Kind::kLocal) {
    s.fd = FileDescriptor(::open(shard.location.c_str(), O_RDONLY | O_CLOEXEC));
    if (s.fd.get() < 0) {
      throw std::runtime_error("cannot open " + shard.location + ": " + std::strerror(errno));
    }
    opened = archive_read_open_fd(s.tar.get(), s.fd.get(), 1 << 20);
  } else {
    if (shard.kind == ShardLocation::Kind::kHttp) {
      if (!http) http = std::make_unique<HttpStreamHandles>(options);
      s.stream = open_http_stream(*http, shard.location, options, cancel);
    } else {
      s.stream = open_pipe_stream(shard.location, options, cancel);
    }
    opened = archive_read_open(s.tar.get(), &s, nullptr, &State::read, nullptr);
  }
  if (opened != ARCHIVE_OK) s.fail(s.name);
}

TarSampleReader::~TarSampleReader() = default;

bool TarSampleReader::next(TarSample& out) {
  State& s = *state_;
  if (s.archive_ended) {
    if (!s.finished && s.stream) s.stream->finish();
    s.finished = true;
    return false;
  }
  out.has_label = false;
  out.label = 0;
  bool image = false;
  bool started = false;  // a key is being gathered
  archive* a = s.tar.get();
  while (true) {
    if (!s.held) {
      const int r = archive_read_next_header(a, &s.entry);
      if (r == ARCHIVE_EOF) {
        s.archive_ended = true;
        if (image) return true;
        return next(out);
      }
      if (r < ARCHIVE_WARN) s.fail(s.name);
      s.held = true;
    }
    const char* path = archive_entry_pathname(s.entry);
    if (archive_entry_filetype(s.entry) != AE_IFREG || path == nullptr) {
      s.held = false;
      if (archive_read_data_skip(a) < ARCHIVE_WARN) s.fail(s.name);
      continue;
    }
    s.member = path;
    split_member(s.member, s.key, s.extension);
    if (started && s.key != s.sample_key) {
      if (image) return true;  // the header stays held: it starts the next sample
      out.has_label = false;   // a key without an image: dropped
      out.label = 0;
    }
    if (!started || s.key != s.sample_key) {
      started = true;
      s.sample_key = s.key;
    }
    s.held = false;
    const std::string what = s.name + " (member " + s.member + ")";
    if (is_image(s.extension) && !image) {
      const int64_t size = archive_entry_size(s.entry);
      if (size <= 0 || size > kMaxMemberBytes) {
        throw std::runtime_error(what + ": " + std::to_string(size) +
                                 " bytes, not a JPEG this loader reads");
      }
      s.read_member(size, what, out.bytes);
      out.name = what;
      image = true;
    } else if (s.extension == "cls") {
      const int64_t size = archive_entry_size(s.entry);
      if (size < 0 || size > 64) throw std::runtime_error(what + ": not a label");
      std::vector<uint8_t> text;
      s.read_member(size, what, text);
      std::string digits(text.begin(), text.end());
      while (!digits.empty() && std::isspace(static_cast<unsigned char>(digits.back()))) {
        digits.pop_back();
      }
      char* end = nullptr;
      errno = 0;
      const long long label = std::strtoll(digits.c_str(), &end, 10);
      if (digits.empty() || *end != '\0' || errno != 0) {
        throw std::runtime_error(what + ": not a decimal label: '" + digits + "'");
      }
      out.label = label;
      out.has_label = true;
    } else if (archive_read_data_skip(a) < ARCHIVE_WARN) {
      s.fail(what);
    }
  }
}

size_t count_tar_samples(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw std::runtime_error("tar_shards: cannot open shard " + path + ": " + std::strerror(errno));
  }
  Archive a = new_tar_reader();
  if (archive_read_open_fd(a.get(), fd.get(), 1 << 16) != ARCHIVE_OK) {
    throw std::runtime_error("tar_shards: " + path + ": " + archive_message(a.get()));
  }
  size_t samples = 0;
  std::string last_key, key, extension;
  bool counted = false;
  archive_entry* entry = nullptr;
  while (true) {
    const int r = archive_read_next_header(a.get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      throw std::runtime_error("tar_shards: " + path + ": " + archive_message(a.get()));
    }
    const char* name = archive_entry_pathname(entry);
    if (archive_entry_filetype(entry) == AE_IFREG && name != nullptr) {
      split_member(name, key, extension);
      if (key != last_key) {
        last_key = key;
        counted = false;
      }
      if (is_image(extension) && !counted) {
        ++samples;
        counted = true;
      }
    }
    archive_read_data_skip(a.get());
  }
  return samples;
}

std::vector<size_t> ShardStream::rank_shards(size_t shard_count, uint64_t seed, uint64_t epoch,
                                             size_t rank, size_t world_size) {
  std::vector<size_t> order(shard_count);
  for (size_t i = 0; i < shard_count; ++i) order[i] = i;
  SampleRng rng(seed ^ 0x5348415244ull /* "SHARD" */, epoch, 0);
  for (size_t i = shard_count; i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
  std::vector<size_t> mine;
  for (size_t i = rank; i < shard_count; i += world_size) mine.push_back(order[i]);
  return mine;
}

size_t ShardStream::equal_positions(std::vector<size_t> counts, size_t world_size) {
  const size_t each = counts.size() / world_size;
  std::sort(counts.begin(), counts.end());
  size_t total = 0;
  for (size_t i = 0; i < each; ++i) total += counts[i];
  return total;
}

ShardStream::ShardStream(std::vector<StreamShard> shards, ShardOptions options, size_t positions)
    : shards_(std::move(shards)),
      options_(std::move(options)),
      positions_(positions),
      lookahead_(std::max<size_t>(1, options_.stream_lookahead)),
      behind_(std::max<size_t>(1, options_.stream_window)) {}

ShardStream::~ShardStream() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  stop_reader(lock);
}

void ShardStream::stop_reader(std::unique_lock<std::mutex>& lock) {
  ++generation_;
  changed_.notify_all();
  std::thread old = std::move(reader_);
  const std::unique_ptr<ReadCancel> cancel = std::move(cancel_);  // destroyed after the join
  if (cancel) cancel->cancel();  // wakes a read or a backoff at once
  lock.unlock();
  if (old.joinable()) old.join();
  lock.lock();
}

void ShardStream::reset() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (restarting_) changed_.wait(lock);
  restarting_ = true;
  stop_reader(lock);
  window_.clear();
  running_ = false;
  restarting_ = false;
  changed_.notify_all();
}

void ShardStream::restart(std::unique_lock<std::mutex>& lock, Key key) {
  while (restarting_) changed_.wait(lock);
  if (running_ && key_ == key) return;  // another worker started it
  restarting_ = true;
  stop_reader(lock);
  for (auto& [position, entry] : window_) {
    if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(entry.bytes));
  }
  window_.clear();
  emitted_ = 0;
  floor_ = 0;
  highest_ = 0;
  ended_ = false;
  errors_.clear();
  key_ = key;
  running_ = true;
  cancel_ = std::make_unique<ReadCancel>();
  reader_ = std::thread(&ShardStream::run, this, generation_, key, cancel_.get());
  restarting_ = false;
  changed_.notify_all();
}

int64_t ShardStream::fetch(uint64_t seed, uint64_t epoch, size_t position,
                           std::vector<uint8_t>& out) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Key key{seed, epoch};
  while (restarting_) changed_.wait(lock);
  if (!running_ || !(key_ == key)) {
    if (running_ && seed == key_.seed && epoch < key_.epoch) {
      throw std::runtime_error("tar_shards (streaming): position " + std::to_string(position) +
                               " of epoch " + std::to_string(epoch) + " asked for after epoch " +
                               std::to_string(key_.epoch) + " began");
    }
    restart(lock, key);
  }
  if (position >= positions_) {
    throw std::out_of_range("tar_shards (streaming): position " + std::to_string(position) +
                            " of " + std::to_string(positions_));
  }
  auto dropped = [&] {
    return std::runtime_error(
        "tar_shards (streaming): position " + std::to_string(position) + " of epoch " +
        std::to_string(epoch) + " was already dropped (the stream keeps the " +
        std::to_string(behind_) +
        " positions below the highest asked for; read a streaming source in order, with the "
        "sequential sampler and one loader at a time, and give ShardOptions::stream_window at "
        "least the loader's slots x batch_size)");
  };
  if (position < floor_) throw dropped();
  if (position > highest_) {
    highest_ = position;
    changed_.notify_all();
  }
  changed_.wait(lock, [&] {
    return stopping_ || restarting_ || !(key_ == key) || window_.count(position) != 0 ||
           position < floor_ || (ended_ && position >= emitted_);
  });
  const auto it = window_.find(position);
  if (it == window_.end() || !(key_ == key)) {
    if (stopping_ || restarting_ || !(key_ == key)) {
      throw std::runtime_error("tar_shards (streaming): the stream of epoch " +
                               std::to_string(epoch) + " was replaced while position " +
                               std::to_string(position) + " was awaited");
    }
    if (position < floor_) throw dropped();
    throw std::runtime_error(
        "tar_shards (streaming): the stream of epoch " + std::to_string(epoch) + " (rank " +
        std::to_string(options_.rank) + " of " + std::to_string(options_.world_size) +
        ") ended after " + std::to_string(emitted_) + " of " + std::to_string(positions_) +
        " samples, before position " + std::to_string(position) +
        (errors_.empty() ? std::string(": the shards hold fewer samples than that")
                         : ": " + errors_));
  }
  const Entry& entry = it->second;
  if (!entry.has_label) {
    throw std::runtime_error(entry.name + ": no .cls member beside it (the label)");
  }
  out.assign(entry.bytes.begin(), entry.bytes.end());
  return entry.label;
}

std::string ShardStream::describe(size_t position) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = window_.find(position);
  if (it != window_.end()) return it->second.name;
  return "stream position " + std::to_string(position) + " (rank " + std::to_string(options_.rank) +
         ")";
}

bool ShardStream::emit(uint64_t generation, Entry&& entry) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    return stopping_ || generation_ != generation || emitted_ <= highest_ + lookahead_;
  });
  if (stopping_ || generation_ != generation || emitted_ >= positions_) return false;
  window_.emplace(emitted_++, std::move(entry));
  while (!window_.empty() && window_.begin()->first + behind_ < highest_) {
    if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(window_.begin()->second.bytes));
    floor_ = window_.begin()->first + 1;
    window_.erase(window_.begin());
  }
  changed_.notify_all();
  return emitted_ < positions_;
}

namespace {

// "N of M shards failed:" and a line for each of the first three, then how many more.
std::string failed_shards_text(const std::vector<std::string>& failures, size_t shards) {
  if (failures.empty()) return {};
  constexpr size_t kShown = 3;
  std::string text = std::to_string(failures.size()) + " of " + std::to_string(shards) +
                     (shards == 1 ? " shard" : " shards") + " failed:";
  for (size_t i = 0; i < std::min(kShown, failures.size()); ++i) text += "\n  " + failures[i];
  if (failures.size() > kShown) {
    text += "\n  and " + std::to_string(failures.size() - kShown) + " more";
  }
  return text;
}

}  // namespace

void ShardStream::run(uint64_t generation, Key key, const ReadCancel* cancel) {
  const size_t capacity = options_.shuffle_buffer;
  std::vector<Entry> buffer;
  buffer.reserve(std::min<size_t>(capacity, 1 << 16));
  SampleRng draws(key.seed ^ 0x4255464645ull /* "BUFFE" */, key.epoch, options_.rank);
  bool stop = false;
  // As WebDataset's shuffle: output starts once `initial` samples are in; the buffer then grows
  // to `capacity`, two samples in for one out, and stays full, one in for one out.
  const size_t initial = std::min<size_t>(capacity, kInitialBuffer);
  size_t in_since_out = 0;
  const std::function<void(Entry &&)> push = [&](Entry&& entry) {
    if (capacity <= 1) {
      stop = !emit(generation, std::move(entry));
      return;
    }
    buffer.push_back(std::move(entry));
    ++in_since_out;
    if (buffer.size() < initial) return;
    if (buffer.size() < capacity && in_since_out < 2) return;
    in_since_out = 0;
    const size_t j = static_cast<size_t>(draws.next() % buffer.size());
    Entry out = std::move(buffer[j]);
    buffer[j] = std::move(buffer.back());
    buffer.pop_back();
    stop = !emit(generation, std::move(out));
  };
  std::vector<std::string> failures;  // one line per failed shard
  size_t shards_read = 0;
  try {
    std::unique_ptr<HttpStreamHandles> http;  // kept across shards: the connection is reused
    for (size_t shard :
         rank_shards(shards_.size(), key.seed, key.epoch, options_.rank, options_.world_size)) {
      if (stop) break;
      ++shards_read;
      try {
        TarSampleReader reader(shards_[shard].where, options_, http, *cancel);
        while (!stop) {
          Entry entry;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!spare_.empty()) {
              entry.bytes = std::move(spare_.back());
              spare_.pop_back();
            }
          }
          if (!reader.next(entry)) break;
          push(std::move(entry));
        }
      } catch (const ReadCancelled&) {
        stop = true;
      } catch (const std::exception& e) {
        // The samples the shard still held are lost; the stream goes on with the next shard.
        failures.push_back(one_line(e.what()));
      }
    }
    while (!stop && !buffer.empty()) {
      const size_t j = static_cast<size_t>(draws.next() % buffer.size());
      Entry out = std::move(buffer[j]);
      buffer[j] = std::move(buffer.back());
      buffer.pop_back();
      stop = !emit(generation, std::move(out));
    }
  } catch (const std::exception& e) {
    failures.push_back(one_line(e.what()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (generation_ == generation) {
    ended_ = true;
    errors_ = failed_shards_text(failures, shards_read);
    changed_.notify_all();
  }
}

}  // namespace detail
}  // namespace conveyor
