// Machinery of the per-sample ops: each row's image as [3, H, W] (a view of an HWC row), given to
// a function that returns its new image (or an undefined tensor to leave it), written back.
#pragma once

#include <string>

#include <ATen/ATen.h>

#include "conveyor/augment.h"

namespace conveyor::augment_detail {

// `transform(image_chw, rng, r)`: row r's image, its stream (ctx.sample_rng(r)) and its number
// (for ctx.note).
template <class Transform>
void for_each_image(BatchFields& batch, const std::string& field, const std::string& op,
                    const BatchContext& ctx, Transform&& transform) {
  const bool chw = image_layout(batch.spec(field), op) == ImageLayout::kCHW;
  at::Tensor& images = batch[field];
  if (images.scalar_type() != at::kByte) {
    throw std::invalid_argument(op + " takes uint8 images; field \"" + field + "\" is " +
                                std::string(c10::toString(images.scalar_type())) +
                                " (put it before Normalize)");
  }
  for (size_t r = 0; r < ctx.rows(); ++r) {
    at::Tensor row = images[static_cast<int64_t>(r)];
    if (!chw) row = row.permute({2, 0, 1});
    SampleRng rng = ctx.sample_rng(r);
    const at::Tensor out = transform(static_cast<const at::Tensor&>(row), rng, r);
    if (out.defined()) row.copy_(out);
  }
}

// The image field's (height, width).
inline std::pair<int64_t, int64_t> image_size(const BatchFields& batch, const std::string& field,
                                              const std::string& op) {
  const FieldSpec& spec = batch.spec(field);
  const bool chw = image_layout(spec, op) == ImageLayout::kCHW;
  return chw ? std::pair{spec.sample_shape[1], spec.sample_shape[2]}
             : std::pair{spec.sample_shape[0], spec.sample_shape[1]};
}

}  // namespace conveyor::augment_detail
