// A test-only NVTX tool: see nvtx_recorder.h. NVTX loads it on the first NVTX call of a process
// whose NVTX_INJECTION64_PATH names it, calls InitializeInjectionNvtx2, and from then on routes
// the calls this library fills in (domains, registered strings, domain push/pop, thread names)
// here; every other call stays a no-op.
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <nvtx3/nvToolsExt.h>

#include "nvtx_recorder.h"

namespace {

struct Recorder {
  std::mutex mutex;
  std::deque<std::string> domains;  // a domain handle points at its entry (stable in a deque)
  std::deque<std::string> strings;  // a registered string's handle points at its entry
  std::vector<ConveyorNvtxEvent> events;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

uint64_t this_thread() { return static_cast<uint64_t>(::syscall(SYS_gettid)); }

void copy_text(char* out, size_t size, const char* text) {
  std::strncpy(out, text ? text : "", size - 1);
  out[size - 1] = '\0';
}

const char* domain_name(nvtxDomainHandle_t domain) {
  return domain ? reinterpret_cast<const std::string*>(domain)->c_str() : "";
}

void record(ConveyorNvtxEvent event) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.events.push_back(event);
}

nvtxDomainHandle_t domain_create(const char* name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (std::string& d : r.domains) {
    if (d == name) return reinterpret_cast<nvtxDomainHandle_t>(&d);
  }
  r.domains.emplace_back(name);
  return reinterpret_cast<nvtxDomainHandle_t>(&r.domains.back());
}

nvtxStringHandle_t register_string(nvtxDomainHandle_t, const char* text) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.strings.emplace_back(text);
  return reinterpret_cast<nvtxStringHandle_t>(&r.strings.back());
}

int range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attributes) {
  ConveyorNvtxEvent e{};
  e.kind = kConveyorNvtxPush;
  e.thread = this_thread();
  copy_text(e.domain, sizeof e.domain, domain_name(domain));
  if (attributes->messageType == NVTX_MESSAGE_TYPE_REGISTERED) {
    copy_text(e.message, sizeof e.message,
              reinterpret_cast<const std::string*>(attributes->message.registered)->c_str());
  } else if (attributes->messageType == NVTX_MESSAGE_TYPE_ASCII) {
    copy_text(e.message, sizeof e.message, attributes->message.ascii);
  }
  if (attributes->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64) {
    e.has_payload = 1;
    e.payload = attributes->payload.ullValue;
  }
  record(e);
  return 0;
}

int range_pop(nvtxDomainHandle_t domain) {
  ConveyorNvtxEvent e{};
  e.kind = kConveyorNvtxPop;
  e.thread = this_thread();
  copy_text(e.domain, sizeof e.domain, domain_name(domain));
  record(e);
  return 0;
}

void name_os_thread(uint32_t thread, const char* name) {
  ConveyorNvtxEvent e{};
  e.kind = kConveyorNvtxThreadName;
  e.thread = thread;
  copy_text(e.message, sizeof e.message, name);
  record(e);
}

template <typename F>
void install(NvtxFunctionTable table, unsigned int size, unsigned int id, F function) {
  if (id < size) *table[id] = reinterpret_cast<NvtxFunctionPointer>(function);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (!callbacks) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) return 0;
  install(table, size, NVTX_CBID_CORE2_DomainCreateA, &domain_create);
  install(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, &register_string);
  install(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &range_push);
  install(table, size, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size)) return 0;
  install(table, size, NVTX_CBID_CORE_NameOsThreadA, &name_os_thread);
  return 1;
}

__attribute__((visibility("default"))) const ConveyorNvtxEvent* conveyor_nvtx_events(
    size_t* count) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  *count = r.events.size();
  return r.events.data();
}
}
