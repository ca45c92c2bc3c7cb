// pipe: commands (command.h): a command's standard output as a ByteStream.
#include "storage/command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "storage/clock.h"
#include "storage/file_descriptor.h"
#include "storage/resuming_stream.h"

extern char** environ;

namespace conveyor::detail {

namespace {

constexpr size_t kPipeRead = 1 << 20;  // bytes of a command's output read at once
constexpr size_t kStderrKept = 4096;   // the end of a command's stderr, for its error

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

class PipeStream final : public ByteStream {
 public:
  PipeStream(std::string command, const RemoteOptions& options, const StreamCancel& cancel)
      : command_(std::move(command)), options_(options), cancel_(cancel), budget_(options) {}
  ~PipeStream() override { stop(); }

  uint64_t start(uint64_t) override {
    stop();
    budget_.waiting();
    if (budget_.spent()) throw budget_.failure(stderr_text());
    position_ = 0;
    stderr_.clear();
    child_ = std::make_unique<ChildProcess>(command_);
    out_open_ = true;
    err_open_ = true;
    return 0;  // a command always starts over
  }

  Bytes read() override {
    budget_.waiting();
    const auto deadline = Clock::now() + options_.request_timeout;
    if (buffer_.size() < kPipeRead) buffer_.resize(kPipeRead);
    while (out_open_) {
      if (budget_.spent()) throw budget_.failure(stderr_text());
      if (Clock::now() >= deadline) {
        throw StreamFailure("wrote nothing for " + seconds_text(options_.request_timeout) +
                                " (ShardOptions::request_timeout)" + stderr_text(),
                            true);
      }
      pollfd fds[3] = {{child_->out(), POLLIN, 0},
                       {err_open_ ? child_->err() : -1, POLLIN, 0},
                       {cancel_.fd(), POLLIN, 0}};
      if (::poll(fds, 3, milliseconds_until(std::min(deadline, budget_.end()))) < 0) {
        if (errno == EINTR) continue;
        throw StreamFailure(std::string("poll failed: ") + std::strerror(errno), true);
      }
      if (fds[2].revents != 0) throw StreamCancelled();
      if (fds[1].revents != 0) drain_stderr();
      if (fds[0].revents != 0) {
        const ssize_t n = ::read(child_->out(), buffer_.data(), buffer_.size());
        if (n > 0) {
          position_ += static_cast<uint64_t>(n);
          budget_.handed(position_);
          return {buffer_.data(), static_cast<size_t>(n)};
        }
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
      if (budget_.spent()) throw budget_.failure(stderr_text());
      if (Clock::now() >= deadline) {
        throw StreamFailure("closed its output but did not exit within " +
                                seconds_text(options_.request_timeout) + stderr_text(),
                            true);
      }
      pollfd fds[2] = {{err_open_ ? child_->err() : -1, POLLIN, 0}, {cancel_.fd(), POLLIN, 0}};
      ::poll(fds, 2, std::min(10, milliseconds_until(deadline)));
      if (fds[1].revents != 0) throw StreamCancelled();
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
  const RemoteOptions options_;
  const StreamCancel& cancel_;
  StreamBudget budget_;
  uint64_t position_ = 0;  // of the attempt: the bytes of output read
  std::unique_ptr<ChildProcess> child_;
  std::vector<uint8_t> buffer_;
  std::string stderr_;
  bool out_open_ = false;
  bool err_open_ = false;
};

}  // namespace

std::unique_ptr<ByteStream> open_pipe_stream(const std::string& command,
                                             const RemoteOptions& options,
                                             const StreamCancel& cancel) {
  return std::make_unique<PipeStream>(command, options, cancel);
}

void read_command_output(const std::string& command, const RemoteOptions& options, size_t max_bytes,
                         std::vector<uint8_t>& out) {
  RemoteOptions once = options;
  once.retries = 0;
  const StreamCancel never;
  ResumingStream stream("pipe:" + command, open_pipe_stream(command, once, never), once, never);
  out.clear();
  for (auto bytes = stream.next(); !bytes.empty(); bytes = stream.next()) {
    if (out.size() + bytes.size() > max_bytes) {
      throw std::runtime_error("pipe:" + command + ": wrote more than " +
                               std::to_string(max_bytes) + " bytes");
    }
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
}

}  // namespace conveyor::detail
