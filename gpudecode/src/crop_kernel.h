// gpudecode/src/crop_kernel.h (build-only): the CUDA kernel that turns each decoded region into
// its batch row, as crop_plan.h's crop_pixel computes it (the same code the CPU test runs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "crop_plan.h"

struct CUstream_st;

namespace conveyor::gpudecode {

// One image of a launch: its plan, the decoded region (roi_h rows of roi_w RGB pixels, `pitch`
// bytes apart, device memory) and its row (side*side*3 bytes, device memory).
struct CropJob {
  CropPlan plan;
  const uint8_t* roi = nullptr;
  size_t pitch = 0;
  uint8_t* row = nullptr;
};

// Launches the kernel over jobs[0 .. count) (device memory, every plan of the same side) on
// `stream`. Returns this launch's own cudaError_t (0: launched; the CUDA unit's kernel-launch
// rule, conveyor/internal/kernel_launch.h), never an error left pending by earlier work.
int launch_crop_rows(const CropJob* jobs, int count, int side, CUstream_st* stream);

}  // namespace conveyor::gpudecode
