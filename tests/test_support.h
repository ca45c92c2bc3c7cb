// Test support: temporary folders, small generated datasets, and sources and copy engines that
// misbehave on purpose (throwing, slow, late copies).
#pragma once

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include "conveyor/conveyor.h"
#include "synthetic.h"

namespace conveyor::testing {

// A fresh folder under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("conveyor-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// Writes a small ImageFolder: `per_class` photo-like JPEGs of w x h in each class.
inline void make_small_folder(const std::filesystem::path& root,
                              const std::vector<std::string>& classes, size_t per_class, int w = 64,
                              int h = 48) {
  uint64_t seed = 1;
  for (const auto& c : classes) {
    for (size_t i = 0; i < per_class; ++i) {
      write_bytes(root / c / ("img" + std::to_string(i) + ".jpg"), make_photo_jpeg(w, h, seed++));
    }
  }
}

// A source whose samples are their index (an int64 field), optionally failing or slow at chosen
// indices. Counts concurrent calls to check the worker count.
class IndexSource : public SampleSource {
 public:
  explicit IndexSource(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  std::vector<FieldSpec> fields() const override {
    return {{"value", c10::ScalarType::Long, {}}, {"label", c10::ScalarType::Long, {}}};
  }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    calls.fetch_add(1);
    if (fail_at.count(ctx.index)) throw std::runtime_error("synthetic failure in user dataset");
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (stall_at.count(ctx.index)) {
      std::unique_lock<std::mutex> lock(stall_mutex);
      stall_cv.wait_for(lock, std::chrono::seconds(30), [&] { return release_stall; });
    }
    auto v = static_cast<int64_t>(ctx.index);
    std::memcpy(fields[0], &v, sizeof v);
    std::memcpy(fields[1], &v, sizeof v);
    if (record_workers) {
      std::lock_guard<std::mutex> lock(stall_mutex);
      worker_of[ctx.index] = ctx.worker;
    }
  }
  std::string describe(size_t index) const override {
    return "/data/item_" + std::to_string(index) + ".bin";
  }
  void unstall() {
    {
      std::lock_guard<std::mutex> lock(stall_mutex);
      release_stall = true;
    }
    stall_cv.notify_all();
  }

  std::set<size_t> fail_at;
  std::set<size_t> stall_at;
  std::chrono::microseconds delay{0};
  std::atomic<uint64_t> calls{0};
  bool record_workers = false;         // set before the loader starts
  std::map<size_t, size_t> worker_of;  // index -> the worker that wrote it, when recorded

 private:
  size_t n_;
  std::mutex stall_mutex;
  std::condition_variable stall_cv;
  bool release_stall = false;
};

// A host-side copy engine's check of the rows GPU decode left on its "device", before it queues
// anything: rows that do not fit are refused after the slot is handed back, as the CopyEngine
// contract asks of any start() that throws.
inline void check_or_hand_back(const std::vector<at::Tensor>& host,
                               const std::vector<DeviceRows>& on_device, const c10::Device& device,
                               const std::function<void()>& on_finished) {
  try {
    check_device_rows(host, on_device, device);
  } catch (...) {
    on_finished();
    throw;
  }
}

// What a host-side copy engine's copies moved, per field: bytes from the host (the slot: what
// crosses PCIe on a GPU) and from the device rows GPU decode left on the "device". Shared with the
// test, which reads it while or after the loader runs.
struct CopyAccounting {
  std::mutex mutex;
  std::vector<uint64_t> host_bytes, device_bytes;  // per field
  void add(std::vector<uint64_t>& to, size_t field, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    if (to.size() <= field) to.resize(field + 1, 0);
    to[field] += bytes;
  }
  uint64_t host(size_t field) {
    std::lock_guard<std::mutex> lock(mutex);
    return field < host_bytes.size() ? host_bytes[field] : 0;
  }
  uint64_t device(size_t field) {
    std::lock_guard<std::mutex> lock(mutex);
    return field < device_bytes.size() ? device_bytes[field] : 0;
  }
};

// A host-side copy engine's copy, as the CUDA engine makes it: fresh (uninitialised) tensors, the
// host rows host_rows() names, then the rows GPU decode left on the "device" (host memory here).
// A row that neither wrote holds garbage, so a rule that skips a needed row shows in the batch.
inline std::vector<at::Tensor> empty_like_all(const std::vector<at::Tensor>& host) {
  std::vector<at::Tensor> out;
  for (const auto& h : host) out.push_back(at::empty(h.sizes(), h.options()));
  return out;
}
inline void copy_rows(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                      std::vector<at::Tensor>& device, CopyAccounting* accounting) {
  for (const HostRows& run : host_rows(host, on_device)) {
    device[run.field]
        .narrow(0, run.first_row, run.rows)
        .copy_(host[run.field].narrow(0, run.first_row, run.rows));
    if (accounting) {
      const auto row_bytes =
          host[run.field].nbytes() / static_cast<size_t>(host[run.field].size(0));
      accounting->add(accounting->host_bytes, run.field,
                      static_cast<uint64_t>(run.rows) * row_bytes);
    }
  }
  for (const DeviceRows& d : on_device) {
    device[d.field].narrow(0, d.first_row, d.rows.size(0)).copy_(d.rows);
    if (accounting) accounting->add(accounting->device_bytes, d.field, d.rows.nbytes());
  }
}

// The fence of a host-side copy engine: a stream "waits" by the host waiting for the copy.
class HostCopyFence : public CopyFence {
 public:
  explicit HostCopyFence(std::shared_future<void> done) : done_(std::move(done)) {}
  void use_on(c10::Stream, const std::vector<at::Tensor>&) const override { done_.wait(); }
  c10::Stream current_stream() const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
  }
  bool done() const override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
};

// A test double of the CUDA copy stage: copies on its own thread, each finishing `latency` after
// it was started, into CPU tensors. It checks that the source bytes are unchanged between start
// and finish, which fails if the loader reused a slot while its copy was still reading it.
class LateCopyEngine : public CopyEngine {
 public:
  explicit LateCopyEngine(std::chrono::milliseconds latency,
                          std::shared_ptr<CopyAccounting> accounting = nullptr)
      : latency_(latency), accounting_(std::move(accounting)) {
    thread_ = std::thread([this] { run(); });
  }
  ~LateCopyEngine() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent*, std::function<void()> on_finished) override {
    check_or_hand_back(host, on_device, device(), on_finished);
    Job job;
    job.due = std::chrono::steady_clock::now() + latency_;
    job.host = host;
    job.on_device = on_device;
    job.device = empty_like_all(host);
    for (const auto& h : host) job.snapshot.push_back(h.clone());  // the slot at the start
    job.on_finished = std::move(on_finished);
    std::promise<void> done;
    DeviceCopy copy{job.device, std::make_shared<HostCopyFence>(done.get_future().share())};
    job.done = std::move(done);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
    return copy;
  }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }

  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> overwritten{0};  // slots changed while their copy was in flight

 private:
  struct Job {
    std::chrono::steady_clock::time_point due;
    std::vector<at::Tensor> host, device, snapshot;
    std::vector<DeviceRows> on_device;
    std::function<void()> on_finished;
    std::promise<void> done;
  };
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      std::this_thread::sleep_until(job.due);
      for (size_t i = 0; i < job.host.size(); ++i) {
        if (!job.host[i].equal(job.snapshot[i])) overwritten.fetch_add(1);
      }
      copy_rows(job.host, job.on_device, job.device, accounting_.get());
      copies.fetch_add(1);
      job.done.set_value();
      job.on_finished();
    }
  }
  std::chrono::milliseconds latency_;
  std::shared_ptr<CopyAccounting> accounting_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// A copy stage whose copies complete at once, inside start(), as a fast GPU's do: each slot is
// handed back before its batch is handed out, so the loader runs up to slots + prefetch_factor
// batches ahead of the consumer. Optionally it loses hand-backs (never calls on_finished from
// start number `lose_from` on), as hand-backs that threw on CUDA's callback thread would, and
// reports it through check() when `report_loss` is set, as the CUDA engine does.
class InstantCopyEngine : public CopyEngine {
 public:
  InstantCopyEngine() = default;
  InstantCopyEngine(size_t lose_from, bool report_loss) : lose_(lose_from), report_(report_loss) {}
  explicit InstantCopyEngine(std::shared_ptr<CopyAccounting> accounting)
      : accounting_(std::move(accounting)) {}
  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent*, std::function<void()> on_finished) override {
    check_or_hand_back(host, on_device, device(), on_finished);
    DeviceCopy copy;
    copy.tensors = empty_like_all(host);
    copy_rows(host, on_device, copy.tensors, accounting_.get());
    std::promise<void> done;
    done.set_value();
    copy.fence = std::make_shared<HostCopyFence>(done.get_future().share());
    if (lose_ && starts_ >= *lose_) {
      lost_ = true;
    } else {
      on_finished();
    }
    ++starts_;
    return copy;
  }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }
  void check() override {
    if (lost_ && report_) throw std::runtime_error("synthetic lost hand-back: a slot is lost");
  }
  size_t starts() const { return starts_; }

 private:
  std::optional<size_t> lose_;
  bool report_ = false;
  bool lost_ = false;
  size_t starts_ = 0;
  std::shared_ptr<CopyAccounting> accounting_;
};

// A copy stage whose copies finish only when the test says so (release()): its fences let a
// stream "wait" by blocking in use_on() until the copy is released, and count the waits, so a test
// can see that the consumer waits for a batch's copy before the batch is handed out.
class GatedCopyEngine : public CopyEngine {
 public:
  struct Gate {
    std::mutex mutex;
    std::condition_variable cv;
    size_t released = 0;  // copies 0 .. released-1 have finished
    size_t started = 0;
    size_t waiting = 0;  // use_on() calls blocked now
    size_t waits = 0;    // use_on() calls so far
    // Lets copies up to number `n` (0-based, exclusive) finish.
    void release(size_t n) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        released = std::max(released, n);
      }
      cv.notify_all();
    }
  };
  explicit GatedCopyEngine(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  ~GatedCopyEngine() override { gate_->release(SIZE_MAX); }  // nothing waits past the engine

  DeviceCopy start(const std::vector<at::Tensor>& host, const std::vector<DeviceRows>& on_device,
                   CudaEvent*, std::function<void()> on_finished) override {
    check_or_hand_back(host, on_device, device(), on_finished);
    DeviceCopy copy;
    copy.tensors = empty_like_all(host);
    copy_rows(host, on_device, copy.tensors, nullptr);  // the bytes; "done" only when released
    size_t number = 0;
    {
      std::lock_guard<std::mutex> lock(gate_->mutex);
      number = gate_->started++;
    }
    copy.fence = std::make_shared<Fence>(gate_, number);
    on_finished();  // the slot is no longer read (the copy above is whole)
    return copy;
  }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }

 private:
  class Fence : public CopyFence {
   public:
    Fence(std::shared_ptr<Gate> gate, size_t number) : gate_(std::move(gate)), number_(number) {}
    void use_on(c10::Stream, const std::vector<at::Tensor>&) const override {
      std::unique_lock<std::mutex> lock(gate_->mutex);
      ++gate_->waits;
      ++gate_->waiting;
      gate_->cv.notify_all();
      gate_->cv.wait(lock, [&] { return gate_->released > number_; });
      --gate_->waiting;
    }
    c10::Stream current_stream() const override {
      return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
    }
    bool done() const override {
      std::lock_guard<std::mutex> lock(gate_->mutex);
      return gate_->released > number_;
    }

   private:
    std::shared_ptr<Gate> gate_;
    size_t number_;
  };
  std::shared_ptr<Gate> gate_;
};

// A checkpoint of `loader`'s position (DataLoader::save) as bytes, and back into a loader.
inline std::string save_to_string(const DataLoader& loader) {
  torch::serialize::OutputArchive archive;
  loader.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

inline void load_from_string(DataLoader& loader, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  loader.load(archive);
}

// Runs `body` on another thread; if it has not finished within `limit` (a deadlock), the whole
// test program aborts with a message, so a hang becomes a failure instead of a stuck CI run.
inline void finishes_within(std::chrono::milliseconds limit, const char* what,
                            std::function<void()> body) {
  auto task = std::async(std::launch::async, std::move(body));
  if (task.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "watchdog: '%s' did not finish within %lld ms (deadlock?)\n", what,
                 static_cast<long long>(limit.count()));
    std::abort();
  }
  task.get();  // rethrows what the body threw
}

}  // namespace conveyor::testing
