// Private: the fused uint8 -> normalized float kernel, callable from plain C++.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace conveyor::detail {

enum class OutType { kFloat32, kFloat16, kBFloat16 };

// out[c] = in[c] * scale[c] + shift[c] for every pixel of a [B,3,H,W] (hwc=false) or [B,H,W,3]
// (hwc=true) uint8 batch, written as [B,3,H,W] (channels_last=false) or NHWC memory. Returns this
// launch's own error (cudaLaunchKernel's result), never one left pending by earlier work.
cudaError_t launch_normalize(const uint8_t* in, void* out, OutType type, int64_t batch,
                             int64_t height, int64_t width, bool hwc, bool channels_last,
                             const float scale[3], const float shift[3], cudaStream_t stream);

}  // namespace conveyor::detail
