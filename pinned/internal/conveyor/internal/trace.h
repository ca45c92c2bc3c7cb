// conveyor/internal/trace.h: NVTX ranges for a profiler (Nsight Systems), in the "Conveyor" domain.
//
// Machinery, not a public header: pinned/internal/ is on the build's include path only (target
// conveyor_trace for libraries that do not link conveyor_pinned) and is not installed.
//
// What it is for: making the loader's work visible on a profiler's timeline. Worker threads are
// named; each chunk a worker fills is a range whose payload is its batch's sequence number, with a
// read, a decode and a resize range per sample nested in it; the consumer's waits for a batch or
// a slot and its copy issue are ranges whose payload is the batch's sequence number. README.md,
// "Finding a data stall with Nsight Systems", shows how they look.
//
// Requires: NVTX3 (header-only, nvtx3/nvToolsExt.h from the CUDA toolkit; CMake's CUDA::nvtx3).
// Guarantees:
//   * Without a tool attached (no NVTX_INJECTION64_PATH, which `nsys profile` sets), every call is
//     a load and a branch: NVTX initializes itself on the first call, finds no tool and turns
//     every later call into a no-op. Built with NVTX_DISABLE, the calls compile to nothing.
//   * Names are registered strings of the domain, registered once per process; a Range allocates
//     nothing and never throws.
//   * Every range a thread pushes it pops on the same thread (Range is a scope), so ranges nest.
// The domain is process-wide by NVTX's own design (a tool sees one "Conveyor" domain); its handle
// and names are made once, on first use, and only read afterwards. Thread safety: every function
// may be called from any thread.
#pragma once

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include <nvtx3/nvToolsExt.h>

namespace conveyor::trace {

// What a range stands for. The names a profiler shows are in kNames.
enum class Name : uint8_t {
  kChunk,         // a worker fills one chunk of a batch (payload: the batch's sequence)
  kRead,          // one sample's bytes read (file, shard member, HTTP, stream)
  kDecode,        // one sample's JPEG decode
  kResize,        // one sample's resize, flip and layout after the decode
  kWaitForBatch,  // the consumer waits for the next batch (payload: its sequence)
  kWaitForSlot,   // the consumer waits for a free slot to dispatch into (payload: that batch)
  kIssueCopy,     // the consumer issues a batch's device copy (payload: its sequence)
  kGpuDecode,     // the GPU decode thread decodes one chunk of a batch (payload: its sequence)
  kCount,
};
inline constexpr std::array<const char*, static_cast<size_t>(Name::kCount)> kNames = {
    "chunk",          "read",          "decode",     "resize",
    "wait for batch", "wait for slot", "issue copy", "GPU decode"};
inline constexpr const char* kDomain = "Conveyor";

// The domain and its registered names, made on first use (which also initializes NVTX, so later
// calls from any thread find NVTX's function table complete).
class Domain {
 public:
  static const Domain& get() {
    static const Domain domain;
    return domain;
  }
  nvtxDomainHandle_t handle() const { return handle_; }
  nvtxStringHandle_t name(Name n) const { return names_[static_cast<size_t>(n)]; }

 private:
  Domain() : handle_(nvtxDomainCreateA(kDomain)) {
    for (size_t i = 0; i < names_.size(); ++i) {
      names_[i] = nvtxDomainRegisterStringA(handle_, kNames[i]);
    }
  }
  nvtxDomainHandle_t handle_;
  std::array<nvtxStringHandle_t, kNames.size()> names_{};
};

// A range on the calling thread, from construction to destruction.
class Range {
 public:
  explicit Range(Name name) noexcept : domain_(Domain::get()) { push(name, nullptr); }
  Range(Name name, uint64_t payload) noexcept : domain_(Domain::get()) { push(name, &payload); }
  ~Range() { nvtxDomainRangePop(domain_.handle()); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  void push(Name name, const uint64_t* payload) noexcept {
    // A color per kind of range: the profiler's rows are easier to read.
    static constexpr std::array<uint32_t, kNames.size()> kColors = {
        0xFF4C78A8, 0xFF72B7B2, 0xFFF58518, 0xFF54A24B,
        0xFFE45756, 0xFFB279A2, 0xFFEECA3B, 0xFF9D755D};
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.colorType = NVTX_COLOR_ARGB;
    attributes.color = kColors[static_cast<size_t>(name)];
    attributes.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attributes.message.registered = domain_.name(name);
    if (payload) {
      attributes.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
      attributes.payload.ullValue = *payload;
    }
    nvtxDomainRangePushEx(domain_.handle(), &attributes);
  }
  const Domain& domain_;
};

// Names the calling thread for the profiler (`name`, e.g. "Conveyor worker 3") and for the OS
// (the first 15 characters of `os_name`, e.g. "conveyor-w3", which top, gdb and perf show).
inline void name_this_thread(const std::string& name, const std::string& os_name) noexcept {
  (void)Domain::get();  // NVTX initialized first (see Domain)
  nvtxNameOsThreadA(static_cast<uint32_t>(::syscall(SYS_gettid)), name.c_str());
  std::array<char, 16> os{};  // the kernel keeps 15 characters and the terminator
  os_name.copy(os.data(), os.size() - 1);
  ::pthread_setname_np(::pthread_self(), os.data());
}

}  // namespace conveyor::trace
