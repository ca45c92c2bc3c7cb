#include <stdexcept>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "conveyor/internal/cuda_check.h"
#include "conveyor/prefetch.h"
#include "normalize_kernel.h"

namespace conveyor {

at::Tensor normalize_images(const at::Tensor& images, const NormalizeOptions& options) {
  if (images.scalar_type() != at::kByte || images.dim() != 4 ||
      images.size(options.hwc ? 3 : 1) != 3) {
    throw std::invalid_argument(std::string("normalize_images: expected uint8 ") +
                                (options.hwc ? "[B,H,W,3]" : "[B,3,H,W]") + ", got " +
                                std::string(images.toString()) + " of shape " +
                                c10::str(images.sizes()));
  }
  if (options.mean.size() != 3 || options.std.size() != 3) {
    throw std::invalid_argument("normalize_images: mean and std need 3 values each");
  }
  const auto dtype = options.dtype;
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) {
    throw std::invalid_argument("normalize_images: dtype must be float32, float16 or bfloat16");
  }
  const int64_t b = images.size(0);
  const int64_t h = images.size(options.hwc ? 1 : 2);
  const int64_t w = images.size(options.hwc ? 2 : 3);
  float scale[3], shift[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * options.std[c]);
    shift[c] = -options.mean[c] / options.std[c];
  }
  auto format =
      options.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (images.is_cuda()) {
    at::Tensor in = images.contiguous();
    c10::cuda::CUDAGuard guard(in.device());
    at::Tensor out = at::empty({b, 3, h, w}, in.options().dtype(dtype), format);
    detail::OutType type = dtype == at::kFloat  ? detail::OutType::kFloat32
                           : dtype == at::kHalf ? detail::OutType::kFloat16
                                                : detail::OutType::kBFloat16;
    cudaError_t err = detail::launch_normalize(in.data_ptr<uint8_t>(), out.data_ptr(), type, b, h,
                                               w, options.hwc, options.channels_last, scale, shift,
                                               c10::cuda::getCurrentCUDAStream().stream());
    detail::check_cuda(err, "normalize_images' kernel launch on " + in.device().str());
    return out;
  }
  at::Tensor x = options.hwc ? images.permute({0, 3, 1, 2}) : images;
  at::Tensor s = at::tensor(std::vector<float>(scale, scale + 3)).view({1, 3, 1, 1});
  at::Tensor t = at::tensor(std::vector<float>(shift, shift + 3)).view({1, 3, 1, 1});
  return (x.to(at::kFloat) * s + t).to(dtype).contiguous(format);
}

}  // namespace conveyor
