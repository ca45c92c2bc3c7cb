// conveyor-bench --plot (plot.h): runs bench/plot.py on the bench's JSON.
#include "plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace conveyor::bench {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// conveyor-bench-plot.py beside this executable.
std::string script_path() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("--plot: cannot find this executable (/proc/self/exe)");
  return (self.parent_path() / "conveyor-bench-plot.py").string();
}

std::string python_path() {
  const char* chosen = std::getenv("CONVEYOR_PYTHON");
  if (chosen != nullptr && chosen[0] != '\0') return chosen;
#ifdef CONVEYOR_PLOT_PYTHON
  if (std::filesystem::exists(CONVEYOR_PLOT_PYTHON)) return CONVEYOR_PLOT_PYTHON;
#endif
  return "python3";
}

}  // namespace

bool is_plot_name(const std::string& path) {
  return ends_with(path, ".svg") || ends_with(path, ".png");
}

void write_plot(const std::string& path, const std::string& json_path) {
  if (!is_plot_name(path)) {
    throw std::runtime_error("--plot " + path + ": the name must end in .svg or .png");
  }
  const std::string script = script_path();
  const std::string python = python_path();
  if (!std::filesystem::exists(script)) {
    throw std::runtime_error("--plot " + path + ": no " + script +
                             " (the build copies bench/plot.py beside conveyor-bench)");
  }
  std::vector<std::string> args{python, script, json_path, path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = ::posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (err != 0) {
    throw std::runtime_error("--plot " + path + ": cannot run " + python + " (" +
                             std::strerror(err) +
                             "); set CONVEYOR_PYTHON to a Python with "
                             "matplotlib (scripts/setup installs it in the project's venv)");
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("--plot " + path + ": " + python + " " + script +
                             " failed (exit status " +
                             std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                             "; it needs matplotlib: scripts/setup installs it in the project's "
                             "venv, or set CONVEYOR_PYTHON)");
  }
}

}  // namespace conveyor::bench
