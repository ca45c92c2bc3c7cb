#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conveyor/internal/kernel_launch.h"
#include "normalize_kernel.h"

namespace conveyor::detail {
namespace {

struct Affine {
  float scale[3];
  float shift[3];
};

template <typename T>
__device__ T convert(float v);
template <>
__device__ float convert<float>(float v) {
  return v;
}
template <>
__device__ __half convert<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 convert<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// One thread per pixel: it reads the pixel's three channels and writes three outputs.
template <typename T>
__global__ void normalize_kernel(const uint8_t* __restrict__ in, T* __restrict__ out,
                                 int64_t pixels_per_image, int64_t total_pixels, bool hwc,
                                 bool channels_last, Affine affine) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total_pixels;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = p / pixels_per_image;
    const int64_t q = p - b * pixels_per_image;
    float v[3];
    if (hwc) {
      const uint8_t* src = in + p * 3;
      v[0] = src[0];
      v[1] = src[1];
      v[2] = src[2];
    } else {
      const uint8_t* src = in + b * 3 * pixels_per_image + q;
      v[0] = src[0];
      v[1] = src[pixels_per_image];
      v[2] = src[2 * pixels_per_image];
    }
    if (channels_last) {
      T* dst = out + p * 3;
      for (int c = 0; c < 3; ++c) dst[c] = convert<T>(v[c] * affine.scale[c] + affine.shift[c]);
    } else {
      T* dst = out + b * 3 * pixels_per_image + q;
      for (int c = 0; c < 3; ++c) {
        dst[c * pixels_per_image] = convert<T>(v[c] * affine.scale[c] + affine.shift[c]);
      }
    }
  }
}

// Launched by the CUDA unit's rule (kernel_launch.h): the result is this launch's error alone.
template <typename T>
cudaError_t launch(const uint8_t* in, void* out, int64_t ppi, int64_t total, bool hwc, bool cl,
                   Affine a, cudaStream_t stream) {
  const int threads = 256;
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  if (blocks < 1) blocks = 1;
  return launch_kernel(&normalize_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(threads),
                       stream, in, static_cast<T*>(out), ppi, total, hwc, cl, a);
}

}  // namespace

cudaError_t launch_normalize(const uint8_t* in, void* out, OutType type, int64_t batch,
                             int64_t height, int64_t width, bool hwc, bool channels_last,
                             const float scale[3], const float shift[3], cudaStream_t stream) {
  Affine a{};
  for (int c = 0; c < 3; ++c) {
    a.scale[c] = scale[c];
    a.shift[c] = shift[c];
  }
  const int64_t ppi = height * width;
  const int64_t total = batch * ppi;
  if (total == 0) return cudaSuccess;
  switch (type) {
    case OutType::kFloat32:
      return launch<float>(in, out, ppi, total, hwc, channels_last, a, stream);
    case OutType::kFloat16:
      return launch<__half>(in, out, ppi, total, hwc, channels_last, a, stream);
    case OutType::kBFloat16:
      return launch<__nv_bfloat16>(in, out, ppi, total, hwc, channels_last, a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace conveyor::detail
