// Test support: a real nginx (Debian's nginx-light) serving a folder on 127.0.0.1, started and
// stopped by the test, for the HTTP shard tests. One process (master_process off), so stopping it
// is one SIGKILL: the clients then meet a refused connection, as with a crashed server. Extra
// server directives (max_ranges 0: a server that ignores Range; limit_rate) and a request log
// are options.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>

extern char** environ;

namespace conveyor::testing {

// A loopback port that was free a moment ago.
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("no free loopback port");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

// True when something accepts connections on 127.0.0.1:port.
inline bool loopback_accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

class NginxServer {
 public:
  // Serves `root` on a free loopback port; `work` holds the configuration, logs and temp folders.
  // `server_directives` go into the server block (e.g. "max_ranges 0;"); with `log_requests`
  // each request is a line of requests() ("URI<TAB>RANGE<TAB>STATUS<TAB>BODY_BYTES").
  NginxServer(std::filesystem::path root, std::filesystem::path work,
              std::string server_directives = "", bool log_requests = false)
      : root_(std::move(root)),
        work_(std::move(work)),
        directives_(std::move(server_directives)),
        log_requests_(log_requests),
        port_(free_loopback_port()) {
    std::filesystem::create_directories(work_);
    write_config();
    start();
  }
  ~NginxServer() { stop(); }
  NginxServer(const NginxServer&) = delete;
  NginxServer& operator=(const NginxServer&) = delete;

  int port() const { return port_; }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + path;
  }
  bool running() const { return pid_ > 0; }

  // Starts nginx on the same port; returns once it accepts connections. Throws with nginx's error
  // log if it exits or does not listen within 10 s.
  void start() {
    if (pid_ > 0) return;
    const std::string config = (work_ / "nginx.conf").string();
    const std::string prefix = work_.string() + "/";
    const char* argv[] = {CONVEYOR_NGINX, "-p", prefix.c_str(), "-c", config.c_str(), nullptr};
    pid_t pid = 0;
    const int status = ::posix_spawn(&pid, CONVEYOR_NGINX, nullptr, nullptr,
                                     const_cast<char* const*>(argv), environ);
    if (status != 0) throw std::runtime_error("cannot start " + std::string(CONVEYOR_NGINX));
    pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!accepts()) {
      int exit_status = 0;
      if (::waitpid(pid_, &exit_status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("nginx exited at start: " + error_log());
      }
      if (std::chrono::steady_clock::now() > deadline) {
        stop();
        throw std::runtime_error("nginx did not listen within 10 s: " + error_log());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Kills nginx (SIGKILL) and reaps it; connections in progress are reset.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string error_log() const {
    std::ifstream in(work_ / "error.log");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  // The request log, when log_requests was given (a request is logged once answered).
  std::string requests() const {
    std::ifstream in(work_ / "access.log");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

 private:
  bool accepts() const { return loopback_accepts(port_); }

  void write_config() const {
    const std::string w = work_.string();
    std::ofstream conf(work_ / "nginx.conf");
    conf << "daemon off;\nmaster_process off;\nworker_processes 1;\n"
         << (::geteuid() == 0 ? "user root;\n" : "") << "error_log " << w
         << "/error.log warn;\npid " << w << "/nginx.pid;\n"
         << "events { worker_connections 256; }\n"
         << "http {\n  sendfile on;\n  keepalive_requests 100000;\n"
         << (log_requests_ ? "  log_format shards '$request_uri\\t$http_range\\t$status\\t"
                             "$body_bytes_sent';\n  access_log " +
                                 w + "/access.log shards;\n"
                           : std::string("  access_log off;\n"))
         << "  client_body_temp_path " << w << "/body;\n  proxy_temp_path " << w << "/proxy;\n"
         << "  fastcgi_temp_path " << w << "/fastcgi;\n  uwsgi_temp_path " << w << "/uwsgi;\n"
         << "  scgi_temp_path " << w << "/scgi;\n"
         << "  types { } default_type application/octet-stream;\n"
         << "  server { listen 127.0.0.1:" << port_ << "; root " << root_.string() << "; "
         << directives_ << " }\n}\n";
  }

  std::filesystem::path root_;
  std::filesystem::path work_;
  std::string directives_;
  bool log_requests_ = false;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace conveyor::testing
