// augment/src/cpu_kernels.h (detail): fused CPU loops behind two pixel functions of
// conveyor/augment_functional.h, used for uint8 images on the CPU; the ATen code stays the
// reference, and the path taken everywhere else (CUDA).
//
// adjust_hue_cpu: torchvision's _rgb_to_hsv, shift and _hsv_to_rgb, one pixel at a time in float32
// with the same operations in the same order as the ATen code, so the bytes are the same
// (augment_test's CpuKernels.HueIsTheAtenCodeByteForByte checks it on random images).
// gaussian_blur_cpu: the same Gaussian weights and reflect padding, applied as two 1-D passes
// (rows, then columns) in float32 instead of torchvision's one 2-D convolution: the sums round
// apart, so a pixel may differ by 1 level (CpuKernels.BlurIsWithinOneLevelOfTheAtenCode measures
// it; docs/augment.md states the bound).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace conveyor::augment_detail {

// The ATen code of each (functional.cpp): the reference, and the path off the CPU.
at::Tensor adjust_hue_aten(const at::Tensor& image, double factor);
at::Tensor gaussian_blur_aten(const at::Tensor& image, std::vector<int64_t> kernel_size,
                              std::vector<double> sigma);
// torchvision's _get_gaussian_kernel1d: float32 weights of `size` taps summing to 1.
at::Tensor gaussian_kernel1d(int64_t size, double sigma, c10::Device device);

// Whether the fused loops take `image`: uint8 [..., 3, H, W] on the CPU.
bool cpu_kernel_takes(const at::Tensor& image);

// Requires cpu_kernel_takes(image) and factor in [-0.5, 0.5].
at::Tensor adjust_hue_cpu(const at::Tensor& image, double factor);

// Requires cpu_kernel_takes(image), and the 1-D weights of each axis (odd lengths, each less
// than twice the side it runs along, as reflect padding requires).
at::Tensor gaussian_blur_cpu(const at::Tensor& image, const std::vector<float>& weights_x,
                             const std::vector<float>& weights_y);

}  // namespace conveyor::augment_detail
