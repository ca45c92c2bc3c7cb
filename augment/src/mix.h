// MixUp's blend (mixup_cutmix.cpp), exposed to augment_test, which checks its fast path.
#pragma once

#include <ATen/core/Tensor.h>

namespace conveyor::augment_detail {

// In place: row r of `images` [B, ...] becomes round(x[r] * lambda + x[B-1-r] * (1 - lambda)),
// computed in float32 as ATen's kernels compute it (the products, then the sum; rounded half to
// even for an integer dtype). A contiguous uint8 CPU batch takes a table of those float32 results
// in one pass over row pairs, bit-identical (augment_test); anything else runs the ATen
// expression.
void mix_with_flip(at::Tensor& images, double lambda);

}  // namespace conveyor::augment_detail
