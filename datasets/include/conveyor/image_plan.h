// conveyor/image_plan.h: an image's geometry as data. For each sample, one pure function of
// (transform, upright image size, seed, epoch, index) says what every output view of the image
// is: the box it shows, whether it is mirrored, and its output size.
//
// What it is for: the decoders execute a plan, they do not choose geometry. ImageWriter (the CPU)
// and the GPU decode (gpudecode/src/crop_plan.h's executor) take their box from plan_image(), and
// the fields that follow an image (a segmentation mask, later boxes, points) read the plan its
// writer published for the sample, so they see exactly the image's crop and flip. A new geometric
// rule is one function that fills a plan, and its test. An image with several views
// (ImageTransform::views) has them all in one plan, which ImageWriter executes from one decode.
//
// Guarantees: plan_image() is a pure function of its arguments, the same on every platform
// (SampleRng: no std:: distributions). View v draws from SampleRng(seed, epoch, index, v); view 0
// draws from SampleRng(seed, epoch, index), so a one-view plan is today's choose_crop() box, bit
// for bit. Every view's box lies inside the image (x, y >= 0, x + width <= the image's width,
// likewise for y), and is at least 1 x 1 for an image of at least 1 x 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "conveyor/sample_source.h"

namespace conveyor {

// One output view of an image.
struct ViewPlan {
  // The source box, in the pixels of the upright image (after any EXIF orientation).
  int x = 0, y = 0, width = 0, height = 0;
  bool flip = false;  // mirrored left to right after the resize
  // The view's output size: the box is resized to out_width x out_height.
  int out_width = 0, out_height = 0;
  int view = 0;   // the view's number: its random stream is (seed, epoch, index, view)
  int group = 0;  // the index of its group in ImageTransform::views (0 without views)

  bool operator==(const ViewPlan&) const = default;
};

// What an image becomes: its upright size and its views, in output order.
struct ImagePlan {
  int width = 0, height = 0;  // the upright image's size
  std::vector<ViewPlan> views;

  bool operator==(const ImagePlan&) const = default;
};

// The plan that `transform` makes of sample `index`'s image of width x height (upright pixels) in
// (seed, epoch): one view per view of each group (view_groups(transform): one view of the
// transform itself when it has no groups), in group order, numbered 0..N-1. Each is its group
// transform's size x size, its box chosen by torchvision's rules for that transform's mode
// (RandomResizedCrop: 10 tries, then the center-crop fallback; Resize + CenterCrop; Resize), then
// a flip with its flip_probability, all drawn from the view's own stream.
// Requires width, height >= 1.
ImagePlan plan_image(const ImageTransform& transform, int width, int height, uint64_t seed,
                     uint64_t epoch, size_t index);

}  // namespace conveyor
