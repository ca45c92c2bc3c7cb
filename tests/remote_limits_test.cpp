// Hostile and broken remote sources (issue 29): servers on loopback (tests/hostile_http_server.py,
// nginx) and commands that do what a hostile party's would. A body that never ends is stopped at
// its cap while it arrives, and a Content-Length over the cap is refused before the body; an error
// page that never ends is reported as its status, at once; a server or command that trickles a
// byte at a time fails within its bound (ShardOptions::min_bytes_per_second), naming it, and
// leaves no process; while a consumer that pauses mid-shard costs nothing. Redirects go to http
// and https only (an ftp:// listener is never reached), and to other hosts over http they work.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/loader.h"
#include "conveyor/storage.h"
#include "nginx_server.h"
#include "python_http_server.h"
#include "shards_test_support.h"
#include "test_support.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::finishes_within;
using testing::NginxServer;
using testing::PythonHttpServer;
using testing::request_lines;
using testing::TempDir;
using namespace testing::shards;

// Past what a capped read may have had sent to it: the cap, then what the kernel's socket
// buffers on loopback hold (a few MiB each way) before the client's stop is seen.
constexpr uint64_t kBufferedSlack = 32u << 20;

// tests/hostile_http_server.py on a free port, logging into `dir`.
struct Hostile {
  fs::path log;
  PythonHttpServer server;
  Hostile(const TempDir& dir, std::vector<std::string> args = {})
      : log(dir / "hostile.log"), server(start(log, std::move(args))) {}
  static PythonHttpServer start(const fs::path& log, std::vector<std::string> args) {
    args.insert(args.end(), {"--log", log.string()});
    return PythonHttpServer::script(HOSTILE_HTTP_SERVER, std::move(args));
  }
  std::string url(const std::string& path) const { return server.url(path); }
  // The body bytes the server sent for each request of `path`, once `count` of them ended (the
  // server logs a request when it sees the client gone, which can be a moment after the client's
  // error), or after `limit` (the caller's checks then say what is missing).
  std::vector<int64_t> sent_for(const std::string& path, size_t count = 1,
                                std::chrono::milliseconds limit = 10s) const {
    std::vector<int64_t> sent;
    for (const auto deadline = Clock::now() + limit;;) {
      sent.clear();
      for (const auto& line : request_lines(slurp(log))) {
        if (line[0] == "/" + path) sent.push_back(std::stoll(line[3]));
      }
      if (sent.size() >= count || Clock::now() >= deadline) return sent;
      std::this_thread::sleep_for(20ms);
    }
  }
};

// Short deadlines and no retries, so that a test of a limit is quick.
RemoteOptions quick() {
  RemoteOptions o;
  o.retries = 0;
  o.backoff_initial = 10ms;
  o.backoff_max = 50ms;
  o.request_timeout = 5000ms;
  o.connect_timeout = 1000ms;
  return o;
}

ShardOptions quick_stream(size_t epoch_samples = 1) {
  ShardOptions o = streamed(1);
  static_cast<RemoteOptions&>(o) = quick();
  o.retries = 2;
  o.epoch_samples = epoch_samples;
  return o;
}

// The message of what `read` throws, and how long it took; fails the test when it throws nothing.
std::string failure_of(const std::function<void()>& read, Clock::duration& took) {
  const auto t0 = Clock::now();
  try {
    read();
  } catch (const std::exception& e) {
    took = Clock::now() - t0;
    return e.what();
  }
  took = Clock::now() - t0;
  ADD_FAILURE() << "no error";
  return {};
}

// The error of streaming `shards` (one loader, kRaise) under the watchdog.
std::string stream_failure(const std::vector<std::string>& shards, const ShardOptions& o,
                           Clock::duration& took) {
  std::string what;
  finishes_within(60s, "a hostile stream", [&] {
    auto source = shards_source(shards, o);
    what = failure_of(
        [&] {
          DataLoader loader(source, small_batches(1));
          for (Batch& batch : loader) (void)batch;
        },
        took);
  });
  return what;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A body that never ends, read whole under a cap of 1 MiB: the error names the URL and the cap,
// and the server could send no more than the cap and the socket buffers before the client
// stopped. A Content-Length of 1 TiB is refused before any body is read. Through tar_shards, an
// index that declares 1 TiB is refused at its 1 GiB cap, naming the index's URL.
TEST(RemoteLimits, AnEndlessBodyIsStoppedAtItsCap) {
  TempDir dir;
  Hostile hostile(dir);
  const auto reader = system_storage()->reader(quick());
  const uint64_t cap = 1u << 20;
  std::vector<uint8_t> out;
  Clock::duration took{};
  for (const char* name : {"endless/train.index.json", "declared/train.index.json"}) {
    const std::string path = name;
    const std::string what = failure_of(
        [&] {
          reader->read_whole({StorageLocation::Kind::kHttp, hostile.url(path)}, cap, out);
        },
        took);
    EXPECT_TRUE(contains(what, hostile.url(path))) << what;
    EXPECT_TRUE(contains(what, std::to_string(cap) + " bytes accepted")) << what;
    EXPECT_LT(took, 4s) << "stopped at the cap, not at the request's deadline: " << what;
    EXPECT_LE(out.size(), cap);
    const std::vector<int64_t> sent = hostile.sent_for(path);
    ASSERT_EQ(sent.size(), 1u) << "the server saw the connection end";
    EXPECT_LE(static_cast<uint64_t>(sent[0]), cap + kBufferedSlack) << path;
  }
  const std::string declared = failure_of(
      [&] {
        reader->read_whole({StorageLocation::Kind::kHttp, hostile.url("declared/again.json")}, cap,
                           out);
      },
      took);
  EXPECT_TRUE(contains(declared, "Content-Length, 1099511627776 bytes")) << declared;

  ShardOptions o;
  static_cast<RemoteOptions&>(o) = quick();
  const std::string index = failure_of(
      [&] { ImageSource::tar_shards({hostile.url("declared/train-000000.tar")}, fixed(), o); },
      took);
  EXPECT_TRUE(contains(index, hostile.url("declared/train.index.json"))) << index;
  EXPECT_TRUE(contains(index, std::to_string(uint64_t{1} << 30) + " bytes accepted")) << index;
  EXPECT_LT(took, 4s) << index;
}

// An error page that never ends: a whole read and a stream both report HTTP 500 with the URL, at
// once (not at the deadline), and the server could send no more than the socket buffers hold.
TEST(RemoteLimits, AnEndlessErrorPageIsReportedAsItsStatus) {
  TempDir dir;
  Hostile hostile(dir);
  const auto reader = system_storage()->reader(quick());
  std::vector<uint8_t> out;
  Clock::duration took{};
  const std::string whole = failure_of(
      [&] {
        reader->read_whole({StorageLocation::Kind::kHttp, hostile.url("error/train.index.json")},
                           1u << 30, out);
      },
      took);
  EXPECT_TRUE(contains(whole, hostile.url("error/train.index.json") + ": HTTP 500")) << whole;
  EXPECT_LT(took, 4s) << "before the 5 s deadline: " << whole;
  const std::vector<int64_t> page = hostile.sent_for("error/train.index.json");
  ASSERT_EQ(page.size(), 1u);
  EXPECT_LE(static_cast<uint64_t>(page[0]), kBufferedSlack);

  const std::string streamed = stream_failure({hostile.url("error/a.tar")}, quick_stream(), took);
  EXPECT_TRUE(contains(streamed, hostile.url("error/a.tar") + ": HTTP 500")) << streamed;
  EXPECT_TRUE(contains(streamed, "after 3 attempts")) << "500 is retried: " << streamed;
  EXPECT_LT(took, 4s) << "not 3 deadlines of 5 s: " << streamed;
  const std::vector<int64_t> sent = hostile.sent_for("error/a.tar", 3);
  EXPECT_EQ(sent.size(), 3u);
  for (int64_t s : sent) EXPECT_LE(static_cast<uint64_t>(s), kBufferedSlack);
}

// A server that sends a byte every 0.1 s, each wait well within request_timeout (1 s): the stream
// fails once it has waited 3 x request_timeout + 2 x backoff_max + its bytes /
// min_bytes_per_second (about 3.1 s, retries 2), not retried, naming the option.
TEST(RemoteLimits, ATricklingServerFailsWithinTheBound) {
  TempDir dir;
  Hostile hostile(dir, {"--trickle-interval", "0.1"});
  ShardOptions o = quick_stream();
  o.request_timeout = 1000ms;
  o.min_bytes_per_second = 64 * 1024;
  Clock::duration took{};
  const std::string what = stream_failure({hostile.url("trickle/a.tar")}, o, took);
  EXPECT_TRUE(contains(what, hostile.url("trickle/a.tar") + ": too slow")) << what;
  EXPECT_TRUE(contains(what, "ShardOptions::min_bytes_per_second")) << what;
  EXPECT_FALSE(contains(what, "attempts")) << "not retried: " << what;
  EXPECT_GE(took, 1s) << what;
  EXPECT_LT(took, 8s) << what;
}

// `while :; do printf x; sleep 0.1; done`: the same bound for a command, which is then killed
// and reaped with its process group.
TEST(RemoteLimits, ATricklingCommandFailsWithinTheBoundAndLeavesNoProcess) {
  ShardOptions o = quick_stream();
  o.request_timeout = 1000ms;
  o.min_bytes_per_second = 64 * 1024;
  const std::string command = "pipe:while :; do printf x; sleep 0.1; done";
  Clock::duration took{};
  const std::string what = stream_failure({command}, o, took);
  EXPECT_TRUE(contains(what, command + ": too slow")) << what;
  EXPECT_TRUE(contains(what, "ShardOptions::min_bytes_per_second")) << what;
  EXPECT_GE(took, 1s) << what;
  EXPECT_LT(took, 8s) << what;
  EXPECT_TRUE(child_processes().empty()) << "the command was killed and reaped";
}

// The floor counts the time a stream waits for its source, not the time its consumer holds the
// samples: with a floor no loopback read could fail (a whole shard within request_timeout + a
// few ms), a consumer that pauses mid-shard for longer than request_timeout still gets every
// sample.
TEST(RemoteLimits, AConsumerThatPausesMidShardCostsNothing) {
  Prepared p("--shard-size 1M");
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  ASSERT_EQ(p.shard_paths().size(), 1u);
  NginxServer server(p.prefix.parent_path(), p.dir / "nginx");
  ShardOptions o = quick_stream(0);
  o.request_timeout = 1000ms;
  o.min_bytes_per_second = uint64_t{1} << 40;  // 1 TiB/s: about request_timeout for the shard
  o.stream_lookahead = 1;
  o.stream_window = 16;
  finishes_within(60s, "a paused consumer", [&] {
    auto source = shards_source({server.url("train-000000.tar")}, o);
    LoaderOptions options = small_batches(1);
    options.batch_size = 2;
    options.slots = 2;
    DataLoader loader(source, options);
    size_t samples = 0;
    for (Batch& batch : loader) {
      if (samples == 0) std::this_thread::sleep_for(1500ms);  // mid-shard: the reader waits
      samples += batch.indices.size();
    }
    EXPECT_EQ(samples, 21u);
    EXPECT_EQ(loader.stats().errors, 0u);
  });
}

// A listener on loopback that records whether anyone connected (the kernel completes the
// handshake; nobody accepts).
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
        ::listen(fd, 16) != 0) {
      throw std::runtime_error("no loopback listener");
    }
    port = ntohs(address.sin_port);
  }
  ~Listener() { ::close(fd); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  bool connected() const {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
};

// A redirect to ftp:// is refused at once, for a whole read and for a stream, naming the URL;
// the ftp listener never sees a connection.
TEST(RemoteLimits, ARedirectToFtpIsRefused) {
  TempDir dir;
  Listener ftp;
  Hostile hostile(dir, {"--redirect-to", "ftp://127.0.0.1:" + std::to_string(ftp.port)});
  const auto reader = system_storage()->reader(quick());
  std::vector<uint8_t> out;
  Clock::duration took{};
  const std::string whole = failure_of(
      [&] {
        reader->read_whole({StorageLocation::Kind::kHttp, hostile.url("redirect/a.index.json")},
                           1u << 20, out);
      },
      took);
  EXPECT_TRUE(contains(whole, hostile.url("redirect/a.index.json"))) << whole;
  EXPECT_TRUE(contains(whole, "ftp")) << "the protocol refused: " << whole;
  EXPECT_LT(took, 4s) << whole;
  const std::string streamed =
      stream_failure({hostile.url("redirect/a.tar")}, quick_stream(), took);
  EXPECT_TRUE(contains(streamed, hostile.url("redirect/a.tar"))) << streamed;
  EXPECT_TRUE(contains(streamed, "ftp")) << streamed;
  EXPECT_FALSE(ftp.connected()) << "the ftp:// listener was reached";
}

// Shards behind a redirect to another server (another port) over http: read at random, index and
// every sample through the redirect, they give what the folder gives.
TEST(RemoteLimits, ARedirectToAnotherHostOverHttpIsFollowed) {
  Prepared p;
  ASSERT_EQ(p.result.status, 0) << p.result.err;
  NginxServer server(p.prefix.parent_path(), p.dir / "nginx");
  Hostile hostile(p.dir, {"--redirect-to", "http://127.0.0.1:" + std::to_string(server.port())});
  const std::string pattern = shard_pattern(hostile.url("redirect/"), p.shard_paths().size());
  auto folder = std::shared_ptr<ImageSource>(ImageSource::image_folder(p.folder, fixed()));
  ShardOptions o;
  static_cast<RemoteOptions&>(o) = quick();
  auto redirected = shards_source({pattern}, o);
  expect_same(read_epoch(folder, RandomSampler::make(3)),
              read_epoch(redirected, RandomSampler::make(3)));
  size_t redirects = 0;
  for (const auto& line : request_lines(slurp(hostile.log))) redirects += line[2] == "302";
  EXPECT_GE(redirects, 22u) << "the index and every sample went through the redirect";
}

}  // namespace
}  // namespace conveyor
