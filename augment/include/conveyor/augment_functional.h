// conveyor/augment_functional.h: the pixel functions behind the batch ops (conveyor/augment.h),
// each with the name and the semantics of torchvision.transforms.v2.functional on uint8 images.
//
// What it is for: the ops' building blocks, written once with ATen so that the same code runs on
// the CPU and on CUDA; the Python tests call them (conveyor._C.augment.functional) beside
// torchvision's to check that they agree.
//
// Requires: `image` is uint8, [..., 3, H, W] (channels first; any leading dimensions, each image
// transformed alike), on any device. Parameters as torchvision's (the factors >= 0, hue in
// [-0.5, 0.5], posterize bits in [0, 8], odd kernel sizes, sigmas > 0); a bad one throws
// std::invalid_argument naming the function and the value.
// Guarantees: a new uint8 tensor of the image's shape (the input is left unchanged), computed with
// the same ATen operations, in the same order and dtypes, as torchvision 0.26's kernels, so that
// the pure pixel maps (posterize, solarize, invert, equalize, autocontrast, brightness,
// contrast, saturation, grayscale) are exact and the interpolating and convolving ones
// (sharpness, hue, blur, affine, rotate) agree to the bounds in docs/augment.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace conveyor::augment_functional {

enum class Interpolation { kNearest, kBilinear };

// Photometric
at::Tensor adjust_brightness(const at::Tensor& image, double factor);
at::Tensor adjust_contrast(const at::Tensor& image, double factor);
at::Tensor adjust_saturation(const at::Tensor& image, double factor);  // AutoAugment's "Color"
at::Tensor adjust_hue(const at::Tensor& image, double factor);
at::Tensor adjust_sharpness(const at::Tensor& image, double factor);
// ITU-R 601-2 luma (0.2989, 0.587, 0.114), truncated to uint8, repeated on 3 channels.
at::Tensor rgb_to_grayscale(const at::Tensor& image);
at::Tensor posterize(const at::Tensor& image, int64_t bits);
// 255 - x where x >= threshold.
at::Tensor solarize(const at::Tensor& image, double threshold);
at::Tensor invert(const at::Tensor& image);
at::Tensor equalize(const at::Tensor& image);
at::Tensor autocontrast(const at::Tensor& image);
// kernel_size and sigma as (x, y).
at::Tensor gaussian_blur(const at::Tensor& image, std::vector<int64_t> kernel_size,
                         std::vector<double> sigma);
// timm's SolarizeAdd (not in torchvision): min(255, x + addition) where x < threshold.
at::Tensor solarize_add(const at::Tensor& image, int64_t addition, int64_t threshold = 128);

// Geometric (an inverse-mapped warp with grid_sample, zeros padding, align_corners false).
// `fill`: empty for torchvision's fill=None (outside pixels 0, no mask), else one value or one per
// channel. `center`: empty for the image's centre, else (x, y) in pixels.
at::Tensor affine(const at::Tensor& image, double angle, std::vector<double> translate,
                  double scale, std::vector<double> shear, Interpolation interpolation,
                  const std::vector<double>& fill, const std::vector<double>& center = {});
// Counter-clockwise by `angle` degrees about the centre, same size (expand=False).
at::Tensor rotate(const at::Tensor& image, double angle, Interpolation interpolation,
                  const std::vector<double>& fill);

}  // namespace conveyor::augment_functional

namespace conveyor::augment_functional {

// One op of the AutoAugment family by torchvision's name ("Identity", "ShearX", "ShearY",
// "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness",
// "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert"), and timm's "SolarizeAdd", at a
// signed magnitude, as torchvision's _AutoAugmentBase._apply_image_or_video_transform: shears
// tan(angle) = magnitude about the top-left corner, translations by int(magnitude) pixels, a
// rotation by magnitude degrees, the enhancements by factor 1 + magnitude, Posterize to
// int(magnitude) bits, Solarize at threshold 255 * magnitude, SolarizeAdd adding int(magnitude)
// below 128. Throws std::invalid_argument naming an unknown op.
at::Tensor apply_augment_op(const at::Tensor& image, const std::string& op, double magnitude,
                            Interpolation interpolation, const std::vector<double>& fill);

}  // namespace conveyor::augment_functional
