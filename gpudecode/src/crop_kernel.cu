#include <cuda_runtime.h>

#include "conveyor/internal/kernel_launch.h"
#include "crop_kernel.h"

namespace conveyor::gpudecode {
namespace {

// One thread per output pixel; blockIdx.y is the image.
__global__ void crop_rows(const CropJob* jobs, int side) {
  const CropJob& job = jobs[blockIdx.y];
  const int pixel = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (pixel >= side * side) return;
  const int ox = pixel % side, oy = pixel / side;
  uint8_t rgb[3];
  crop_pixel(job.roi, job.pitch, job.plan, ox, oy, rgb);
  for (int c = 0; c < 3; ++c) job.row[output_offset(job.plan, ox, oy, c)] = rgb[c];
}

}  // namespace

int launch_crop_rows(const CropJob* jobs, int count, int side, CUstream_st* stream) {
  if (count <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((side * side + kThreads - 1) / kThreads),
                  static_cast<unsigned>(count));
  // The CUDA unit's rule: this launch's own error, never one left pending by earlier work.
  return static_cast<int>(
      detail::launch_kernel(&crop_rows, grid, dim3(kThreads), stream, jobs, side));
}

}  // namespace conveyor::gpudecode
