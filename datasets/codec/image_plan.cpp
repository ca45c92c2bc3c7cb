// plan_image (conveyor/image_plan.h): the geometry of every output view of an image, as data.
// Each view: torchvision's crop rules for its group's transform's mode, then the flip.
#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

#include "conveyor/image_plan.h"
#include "conveyor/internal/printable.h"
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

std::vector<ViewGroup> view_groups(const ImageTransform& transform) {
  if (transform.views.empty()) return {ViewGroup{"", 1, transform}};
  std::set<std::string> names;
  for (const ViewGroup& g : transform.views) {
    const std::string label = "view group \"" + detail::printable(g.name) + "\"";
    if (g.name.empty()) throw std::invalid_argument("a view group needs a name");
    if (!names.insert(g.name).second) throw std::invalid_argument(label + " is named twice");
    if (g.count < 1 || g.count > 256) {
      throw std::invalid_argument(label + ": count is " + std::to_string(g.count) +
                                  " (1 to 256 views)");
    }
    if (g.transform.size < 1) throw std::invalid_argument(label + ": its size must be positive");
    if (!g.transform.views.empty()) {
      throw std::invalid_argument(label + ": a group's transform has no views of its own");
    }
  }
  return transform.views;
}

ImagePlan plan_image(const ImageTransform& transform, int width, int height, uint64_t seed,
                     uint64_t epoch, size_t index) {
  ImagePlan plan;
  plan.width = width;
  plan.height = height;
  const auto plan_group = [&](const ImageTransform& t, int count, int group) {
    for (int k = 0; k < count; ++k) {
      const int view = static_cast<int>(plan.views.size());
      SampleRng rng(seed, epoch, index, static_cast<uint64_t>(view));
      const CropBox box = choose_box(t, width, height, rng);
      plan.views.push_back(
          {box.x, box.y, box.width, box.height, box.flip, t.size, t.size, view, group});
    }
  };
  if (transform.views.empty()) {
    plan_group(transform, 1, 0);
    return plan;
  }
  for (size_t g = 0; g < transform.views.size(); ++g) {
    plan_group(transform.views[g].transform, transform.views[g].count, static_cast<int>(g));
  }
  return plan;
}

}  // namespace conveyor
