// A test-only NVTX tool (nvtx_recorder.cpp, a shared library named by NVTX_INJECTION64_PATH):
// it records every domain range pushed and popped and every thread named, with the thread that
// did it, so a test can check the ranges a run produced (tests/nvtx_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

enum ConveyorNvtxEventKind : int32_t {
  kConveyorNvtxPush = 0,        // a domain range pushed: domain, message, payload
  kConveyorNvtxPop = 1,         // a domain range popped: domain
  kConveyorNvtxThreadName = 2,  // nvtxNameOsThreadA: thread (the named one), message
};

struct ConveyorNvtxEvent {
  int32_t kind;
  int32_t has_payload;  // 1 when the push carried an unsigned 64-bit payload
  uint64_t thread;      // the kernel's thread id of the caller (the named thread for a name)
  uint64_t payload;
  char domain[32];   // "" for calls outside a domain
  char message[64];  // the range's name (registered or ASCII), or the thread's name
};

// The events recorded so far, in the order they happened; *count is their number. The array is
// valid until the next NVTX call; read it when no other thread makes NVTX calls.
typedef const ConveyorNvtxEvent* (*ConveyorNvtxEventsFn)(size_t* count);
#define CONVEYOR_NVTX_EVENTS_SYMBOL "conveyor_nvtx_events"
}
