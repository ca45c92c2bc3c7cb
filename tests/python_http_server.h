// Test support: static HTTP servers in Python on 127.0.0.1, for the shard tests against servers
// that ignore Range: `python3 -m http.server` itself, or tests/shard_http_server.py (the same
// behaviour, or honouring Range, and dropping a shard's first connection part-way); and any other
// server script (tests/hostile_http_server.py). Started and stopped by the test (SIGKILL and
// reap), so no server outlives it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nginx_server.h"

extern char** environ;

namespace conveyor::testing {

class PythonHttpServer {
 public:
  // `python3 -m http.server PORT --bind 127.0.0.1 --directory ROOT`.
  static PythonHttpServer standard_library(const std::filesystem::path& root) {
    return PythonHttpServer(
        {"-m", "http.server", "", "--bind", "127.0.0.1", "--directory", root.string()}, 2);
  }
  // tests/shard_http_server.py: honouring Range or not, cutting each shard's first GET after
  // `drop_after` bytes (or never, when negative), logging requests to `log`.
  static PythonHttpServer shard_server(const std::filesystem::path& root, bool ranges,
                                       long drop_after, const std::filesystem::path& log) {
    std::vector<std::string> args = {SHARD_HTTP_SERVER, "--root",    root.string(), "--port", "",
                                     "--log",           log.string()};
    if (ranges) args.push_back("--ranges");
    if (drop_after >= 0) {
      args.push_back("--drop-after");
      args.push_back(std::to_string(drop_after));
    }
    return PythonHttpServer(std::move(args), 4);
  }

  // CONVEYOR_PYTHON3 running the server `script` with `args`, then "--port PORT".
  static PythonHttpServer script(const std::string& script, std::vector<std::string> args) {
    args.insert(args.begin(), script);
    args.push_back("--port");
    args.push_back("");
    const size_t port_arg = args.size() - 1;
    return PythonHttpServer(std::move(args), port_arg);
  }

  PythonHttpServer(PythonHttpServer&& other) noexcept
      : port_(other.port_), pid_(std::exchange(other.pid_, -1)) {}
  PythonHttpServer& operator=(PythonHttpServer&&) = delete;
  PythonHttpServer(const PythonHttpServer&) = delete;
  ~PythonHttpServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + path;
  }

 private:
  // Runs CONVEYOR_PYTHON3 with `args`, args[port_arg] replaced by a free port; returns once it
  // accepts connections, or throws after 20 s or when it exits.
  PythonHttpServer(std::vector<std::string> args, size_t port_arg) : port_(free_loopback_port()) {
    args.at(port_arg) = std::to_string(port_);
    std::vector<std::string> all = {CONVEYOR_PYTHON3};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its request lines and greeting go to /dev/null, not into the test's output.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int spawned =
        ::posix_spawn(&pid, CONVEYOR_PYTHON3, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) throw std::runtime_error("cannot start " + std::string(CONVEYOR_PYTHON3));
    pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!loopback_accepts(port_)) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("the Python HTTP server exited at start");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        pid_ = -1;
        throw std::runtime_error("the Python HTTP server did not listen within 20 s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  int port_ = 0;
  pid_t pid_ = -1;
};

// The lines of a request log (tests/shard_http_server.py's or NginxServer::requests()), each
// split at its tabs: path, Range header ("-" when none), status, body bytes sent.
inline std::vector<std::vector<std::string>> request_lines(const std::string& log) {
  std::vector<std::vector<std::string>> out;
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    std::vector<std::string> fields;
    size_t field = start;
    while (field <= end) {
      size_t tab = log.find('\t', field);
      if (tab == std::string::npos || tab > end) tab = end;
      fields.push_back(log.substr(field, tab - field));
      field = tab + 1;
    }
    if (fields.size() == 4) out.push_back(std::move(fields));
    start = end + 1;
  }
  return out;
}

}  // namespace conveyor::testing
