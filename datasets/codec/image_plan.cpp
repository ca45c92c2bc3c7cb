// plan_image (conveyor/image_plan.h): the geometry of every output view of an image, as data.
// Today one view per image: torchvision's crop rules for the transform's mode, then the flip.
#include <algorithm>
#include <cmath>

#include "conveyor/image_plan.h"
#include "conveyor/random.h"

namespace conveyor {

namespace {

// One view's box and flip, drawn from `rng` (torchvision's rules for the transform's mode).
CropBox choose_box(const ImageTransform& transform, int width, int height, SampleRng& rng) {
  CropBox box{0, 0, width, height, false};
  switch (transform.mode) {
    case ImageTransform::Mode::kRandomResizedCrop: {
      const double area = static_cast<double>(width) * height;
      const double log_r0 = std::log(transform.ratio_min);
      const double log_r1 = std::log(transform.ratio_max);
      bool found = false;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        double target = area * rng.uniform(transform.scale_min, transform.scale_max);
        double aspect = std::exp(rng.uniform(log_r0, log_r1));
        int w = static_cast<int>(std::nearbyint(std::sqrt(target * aspect)));
        int h = static_cast<int>(std::nearbyint(std::sqrt(target / aspect)));
        if (w > 0 && h > 0 && w <= width && h <= height) {
          box = {rng.randint(0, width - w + 1), rng.randint(0, height - h + 1), w, h, false};
          found = true;
        }
      }
      if (!found) {  // torchvision's fallback: the central crop of the clamped aspect ratio
        double in_ratio = static_cast<double>(width) / height;
        int w = width, h = height;
        if (in_ratio < transform.ratio_min) {
          h = static_cast<int>(std::nearbyint(w / transform.ratio_min));
        } else if (in_ratio > transform.ratio_max) {
          w = static_cast<int>(std::nearbyint(h * transform.ratio_max));
        }
        box = {(width - w) / 2, (height - h) / 2, w, h, false};
      }
      break;
    }
    case ImageTransform::Mode::kResizeCenterCrop: {
      // The crop of size x size in an image whose shorter side was resized to `resize`.
      double factor = static_cast<double>(transform.resize) / std::min(width, height);
      int side_w = std::min(width, static_cast<int>(std::nearbyint(transform.size / factor)));
      int side_h = std::min(height, static_cast<int>(std::nearbyint(transform.size / factor)));
      side_w = std::max(side_w, 1);
      side_h = std::max(side_h, 1);
      box = {(width - side_w) / 2, (height - side_h) / 2, side_w, side_h, false};
      break;
    }
    case ImageTransform::Mode::kResize:
      break;
  }
  box.flip = transform.flip_probability > 0.0 && rng.uniform(0.0, 1.0) < transform.flip_probability;
  return box;
}

}  // namespace

ImagePlan plan_image(const ImageTransform& transform, int width, int height, uint64_t seed,
                     uint64_t epoch, size_t index) {
  ImagePlan plan;
  plan.width = width;
  plan.height = height;
  SampleRng rng(seed, epoch, index, 0);
  const CropBox box = choose_box(transform, width, height, rng);
  plan.views.push_back(
      {box.x, box.y, box.width, box.height, box.flip, transform.size, transform.size, 0});
  return plan;
}

}  // namespace conveyor
