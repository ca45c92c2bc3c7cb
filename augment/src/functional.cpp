// The pixel functions (conveyor/augment_functional.h): torchvision 0.26's v2 kernels for uint8
// images, operation for operation, so that the results agree bit for bit where the operations
// are the same (each function names the kernel it follows).
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "conveyor/augment_functional.h"
#include "cpu_kernels.h"

namespace conveyor::augment_functional {
namespace {

void check_image(const at::Tensor& image, const char* function) {
  if (image.scalar_type() != at::kByte || image.dim() < 3 || image.size(-3) != 3) {
    throw std::invalid_argument(
        std::string("conveyor: ") + function + " takes uint8 images [..., 3, H, W], not " +
        std::string(c10::toString(image.scalar_type())) + " " + c10::str(image.sizes()));
  }
}

void check_factor(double factor, const char* function) {
  if (!(factor >= 0)) {
    throw std::invalid_argument(std::string("conveyor: ") + function +
                                " needs a factor >= 0, not " + std::to_string(factor));
  }
}

// torchvision's _blend: image1 * ratio + image2 * (1 - ratio), clamped, truncated to uint8.
at::Tensor blend(const at::Tensor& image1, const at::Tensor& image2, double ratio) {
  return image1.mul(ratio).add_(image2, 1.0 - ratio).clamp_(0, 255).to(at::kByte);
}

// _rgb_to_grayscale_image(num_output_channels=1, preserve_dtype=False): float32 [..., 1, H, W].
at::Tensor luma(const at::Tensor& image) {
  const std::vector<at::Tensor> rgb = image.unbind(-3);
  return rgb[0].mul(0.2989).add_(rgb[1], 0.587).add_(rgb[2], 0.114).unsqueeze(-3);
}

// _get_inverse_affine_matrix(inverted=True).
std::vector<double> inverse_affine_matrix(double cx, double cy, double angle, double tx, double ty,
                                          double scale, double shear_x, double shear_y) {
  const double rot = angle * std::numbers::pi / 180.0;
  const double sx = shear_x * std::numbers::pi / 180.0;
  const double sy = shear_y * std::numbers::pi / 180.0;
  const double cos_sy = std::cos(sy);
  const double tan_sx = std::tan(sx);
  const double rot_minus_sy = rot - sy;
  const double cx_plus_tx = cx + tx;
  const double cy_plus_ty = cy + ty;
  const double a = std::cos(rot_minus_sy) / cos_sy;
  const double b = -(a * tan_sx + std::sin(rot));
  const double c = std::sin(rot_minus_sy) / cos_sy;
  const double d = std::cos(rot) - c * tan_sx;
  std::vector<double> m{d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0};
  m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
  m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
  return m;
}

// _affine_grid(theta, w, h, ow=w, oh=h).
at::Tensor affine_grid(const std::vector<double>& matrix, int64_t w, int64_t h,
                       const at::Device& device) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor theta =
      at::tensor(matrix, at::TensorOptions().dtype(at::kDouble)).to(options).reshape({1, 2, 3});
  at::Tensor base = at::empty({1, h, w, 3}, options);
  base.select(-1, 0).copy_(at::linspace((1.0 - static_cast<double>(w)) * 0.5,
                                        (static_cast<double>(w) - 1.0) * 0.5, w, options));
  base.select(-1, 1).copy_(at::linspace((1.0 - static_cast<double>(h)) * 0.5,
                                        (static_cast<double>(h) - 1.0) * 0.5, h, options)
                               .unsqueeze_(-1));
  base.select(-1, 2).fill_(1);
  const at::Tensor rescaled = theta.transpose(1, 2).div_(
      at::tensor({0.5 * static_cast<double>(w), 0.5 * static_cast<double>(h)},
                 at::TensorOptions().dtype(at::kDouble))
          .to(options));
  return base.view({1, h * w, 3}).bmm(rescaled).view({1, h, w, 2});
}

// _apply_grid_transform(img, grid, mode, fill).
at::Tensor apply_grid(const at::Tensor& image, const at::Tensor& grid, Interpolation mode,
                      const std::vector<double>& fill) {
  const int64_t h = image.size(-2), w = image.size(-1);
  at::Tensor img = image.reshape({-1, 3, h, w});
  const int64_t n = img.size(0);
  at::Tensor float_img = img.to(at::kFloat);
  at::Tensor g = n > 1 ? grid.expand({n, -1, -1, -1}) : grid;
  if (!fill.empty()) {
    float_img = at::cat({float_img, at::ones({n, 1, h, w}, float_img.options())}, 1);
  }
  // grid_sampler: interpolation 0 bilinear, 1 nearest; padding 0 zeros.
  float_img = at::grid_sampler(float_img, g, mode == Interpolation::kBilinear ? 0 : 1, 0, false);
  if (!fill.empty()) {
    at::Tensor mask = float_img.narrow(1, 3, 1).expand({n, 3, h, w});
    float_img = float_img.narrow(1, 0, 3);
    const at::Tensor fill_img = at::tensor(fill, at::TensorOptions().dtype(at::kDouble))
                                    .to(float_img.options())
                                    .view({1, -1, 1, 1});
    if (mode == Interpolation::kNearest) {
      float_img = at::where(mask < 0.5, fill_img.expand_as(float_img), float_img);
    } else {
      float_img = float_img.sub(fill_img).mul_(mask).add_(fill_img);
    }
  }
  return float_img.round_().to(at::kByte).reshape(image.sizes());
}

void check_fill(const std::vector<double>& fill, const char* function) {
  if (!fill.empty() && fill.size() != 1 && fill.size() != 3) {
    throw std::invalid_argument(std::string("conveyor: ") + function +
                                " takes no fill, one value or three");
  }
}

}  // namespace

at::Tensor adjust_brightness(const at::Tensor& image, double factor) {
  check_image(image, "adjust_brightness");
  check_factor(factor, "adjust_brightness");
  return image.mul(factor).clamp_(0, 255).to(at::kByte);
}

at::Tensor adjust_contrast(const at::Tensor& image, double factor) {
  check_image(image, "adjust_contrast");
  check_factor(factor, "adjust_contrast");
  const at::Tensor gray = luma(image).floor_();
  const at::Tensor mean = gray.mean({-3, -2, -1}, true);
  return blend(image, mean, factor);
}

at::Tensor adjust_saturation(const at::Tensor& image, double factor) {
  check_image(image, "adjust_saturation");
  check_factor(factor, "adjust_saturation");
  return blend(image, luma(image).floor_(), factor);
}

at::Tensor rgb_to_grayscale(const at::Tensor& image) {
  check_image(image, "rgb_to_grayscale");
  return luma(image).to(at::kByte).expand(image.sizes()).contiguous();
}

at::Tensor adjust_hue(const at::Tensor& image, double factor) {
  check_image(image, "adjust_hue");
  if (!(factor >= -0.5 && factor <= 0.5)) {
    throw std::invalid_argument("conveyor: adjust_hue needs a factor in [-0.5, 0.5], not " +
                                std::to_string(factor));
  }
  if (augment_detail::cpu_kernel_takes(image)) return augment_detail::adjust_hue_cpu(image, factor);
  return augment_detail::adjust_hue_aten(image, factor);
}

}  // namespace conveyor::augment_functional

namespace conveyor::augment_detail {

at::Tensor adjust_hue_aten(const at::Tensor& image, double factor) {
  const at::Tensor x = image.to(at::kFloat).mul_(1.0 / 255.0);
  // _rgb_to_hsv
  std::vector<at::Tensor> rgb = x.unbind(-3);
  auto [minc, maxc] = at::aminmax(x, -3);
  const at::Tensor eqc = maxc == minc;
  const at::Tensor channels_range = maxc - minc;
  const at::Tensor ones = at::ones_like(maxc);
  const at::Tensor s = channels_range / at::where(eqc, ones, maxc);
  const at::Tensor divisor = at::where(eqc, ones, channels_range).unsqueeze_(-3);
  std::vector<at::Tensor> c = ((maxc.unsqueeze(-3) - x) / divisor).unbind(-3);
  const at::Tensor &rc = c[0], &gc = c[1], &bc = c[2];
  at::Tensor mask_maxc_neq_r = maxc != rgb[0];
  const at::Tensor mask_maxc_eq_g = maxc == rgb[1];
  const at::Tensor hg = rc.add(2.0).sub_(bc).mul_(mask_maxc_eq_g.logical_and(mask_maxc_neq_r));
  const at::Tensor hr = bc.sub(gc).mul_(mask_maxc_neq_r.logical_not());
  const at::Tensor hb =
      gc.add(4.0).sub_(rc).mul_(mask_maxc_neq_r.logical_and_(mask_maxc_eq_g.logical_not()));
  at::Tensor h = hr.add(hg).add_(hb).mul_(1.0 / 6.0).add_(1.0).fmod_(1.0);
  // hue shift
  h.add_(factor).remainder_(1.0);
  // _hsv_to_rgb
  const at::Tensor& v = maxc;
  const at::Tensor h6 = h.mul(6);
  const at::Tensor i_float = at::floor(h6);
  const at::Tensor f = h6.sub(i_float);
  at::Tensor i = i_float.to(at::kInt);
  const at::Tensor sxf = s * f;
  const at::Tensor one_minus_s = 1.0 - s;
  const at::Tensor q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0);
  const at::Tensor t = sxf.add(one_minus_s).mul_(v).clamp_(0.0, 1.0);
  const at::Tensor p = one_minus_s.mul(v).clamp_(0.0, 1.0);
  i.remainder_(6);
  const at::Tensor vpqt = at::stack({v, p, q, t}, -3);
  const at::Tensor table =
      at::tensor({0, 2, 1, 1, 3, 0, 3, 0, 0, 2, 1, 1, 1, 1, 3, 0, 0, 2}, at::kLong)
          .view({3, 6})
          .to(image.device());
  std::vector<int64_t> select_shape{3};  // table[:, i]: [3, ...leading, H, W]
  select_shape.insert(select_shape.end(), image.sizes().begin(), image.sizes().end() - 3);
  select_shape.push_back(image.size(-2));
  select_shape.push_back(image.size(-1));
  at::Tensor select = table.index_select(1, i.flatten().to(at::kLong)).view(select_shape);
  if (select.dim() > 3) select = select.movedim(0, -3);
  const at::Tensor rgb_out = vpqt.gather(-3, select);
  // to_dtype_image(float -> uint8, scale=True)
  return rgb_out.mul(255.0 + 1.0 - 1e-3).to(at::kByte);
}

}  // namespace conveyor::augment_detail

namespace conveyor::augment_functional {

at::Tensor adjust_sharpness(const at::Tensor& image, double factor) {
  check_image(image, "adjust_sharpness");
  check_factor(factor, "adjust_sharpness");
  const int64_t h = image.size(-2), w = image.size(-1);
  if (image.numel() == 0 || h <= 2 || w <= 2) return image.clone();
  at::Tensor img = image.dim() > 4 ? image.reshape({-1, 3, h, w}) : image;
  const double a = 1.0 / 13.0, b = 5.0 / 13.0;
  const at::Tensor kernel =
      at::tensor({a, a, a, a, b, a, a, a, a}, at::TensorOptions().dtype(at::kDouble))
          .to(at::TensorOptions().dtype(at::kFloat).device(image.device()))
          .view({3, 3})
          .expand({3, 1, 3, 3});
  at::Tensor output = img.to(at::kFloat, false, true);
  at::Tensor blurred = at::conv2d(output, kernel, std::nullopt, at::IntArrayRef{1},
                                  at::IntArrayRef{0}, at::IntArrayRef{1}, 3)
                           .round_();
  at::Tensor view = output.narrow(-2, 1, h - 2).narrow(-1, 1, w - 2);
  view.add_(blurred.sub_(view), 1.0 - factor);
  return output.clamp_(0, 255).to(at::kByte).reshape(image.sizes());
}

at::Tensor posterize(const at::Tensor& image, int64_t bits) {
  check_image(image, "posterize");
  if (bits < 0 || bits > 8) {
    throw std::invalid_argument("conveyor: posterize needs bits in [0, 8], not " +
                                std::to_string(bits));
  }
  if (bits >= 8) return image.clone();
  const int64_t mask = ((int64_t{1} << bits) - 1) << (8 - bits);
  return image.bitwise_and(mask);
}

at::Tensor invert(const at::Tensor& image) {
  check_image(image, "invert");
  return image.bitwise_not();
}

at::Tensor solarize(const at::Tensor& image, double threshold) {
  check_image(image, "solarize");
  if (threshold > 255) {
    throw std::invalid_argument("conveyor: solarize needs a threshold <= 255, not " +
                                std::to_string(threshold));
  }
  return at::where(image.ge(threshold), image.bitwise_not(), image);
}

at::Tensor solarize_add(const at::Tensor& image, int64_t addition, int64_t threshold) {
  check_image(image, "solarize_add");
  const at::Tensor added = image.to(at::kShort).add_(addition).clamp_(0, 255).to(at::kByte);
  return at::where(image.lt(threshold), added, image);
}

at::Tensor autocontrast(const at::Tensor& image) {
  check_image(image, "autocontrast");
  if (image.numel() == 0) return image.clone();
  at::Tensor float_image = image.to(at::kFloat);
  at::Tensor minimum = float_image.amin({-2, -1}, true);
  const at::Tensor maximum = float_image.amax({-2, -1}, true);
  const at::Tensor eq = maximum == minimum;
  at::Tensor inv_scale = maximum.sub(minimum).mul_(1.0 / 255.0);
  minimum = minimum.masked_fill(eq, 0.0);
  inv_scale = inv_scale.masked_fill(eq, 1.0);
  return float_image.sub_(minimum).div_(inv_scale).clamp_(0, 255).to(at::kByte);
}

at::Tensor equalize(const at::Tensor& image) {
  check_image(image, "equalize");
  if (image.numel() == 0) return image.clone();
  const at::Tensor flat = image.flatten(-2).to(at::kLong);
  std::vector<int64_t> hist_shape(image.sizes().begin(), image.sizes().end() - 2);
  hist_shape.push_back(256);
  at::Tensor hist = at::zeros(hist_shape, flat.options().dtype(at::kInt));
  hist.scatter_add_(-1, flat, at::ones({1}, hist.options()).expand_as(flat));
  at::Tensor cum_hist = hist.cumsum(-1);  // int64, as torch's cumsum of int32
  const at::Tensor index = cum_hist.argmax(-1).unsqueeze_(-1);
  at::Tensor step = (flat.size(-1) - hist.gather(-1, index)).div_(255, "floor");
  const at::Tensor valid = step.ne(0);
  step.clamp_(1);
  cum_hist =
      cum_hist.narrow(-1, 0, 255).add(step.div(2, "floor")).div_(step, "floor").clamp_(0, 255);
  std::vector<int64_t> zero_shape = hist_shape;
  zero_shape.back() = 1;
  const at::Tensor lut =
      at::cat({at::zeros(zero_shape, image.options()), cum_hist.to(at::kByte)}, -1);
  const at::Tensor equalized = lut.gather(-1, flat).view_as(image);
  return at::where(valid.unsqueeze(-1), equalized, image);
}

at::Tensor gaussian_blur(const at::Tensor& image, std::vector<int64_t> kernel_size,
                         std::vector<double> sigma) {
  check_image(image, "gaussian_blur");
  if (kernel_size.size() == 1) kernel_size.push_back(kernel_size[0]);
  if (sigma.size() == 1) sigma.push_back(sigma[0]);
  if (kernel_size.size() != 2 || sigma.size() != 2 || kernel_size[0] % 2 == 0 ||
      kernel_size[1] % 2 == 0 || kernel_size[0] < 1 || kernel_size[1] < 1 || !(sigma[0] > 0) ||
      !(sigma[1] > 0)) {
    throw std::invalid_argument(
        "conveyor: gaussian_blur needs odd positive kernel sizes and sigmas > 0 (one or two of "
        "each)");
  }
  const int64_t h = image.size(-2), w = image.size(-1);
  if (augment_detail::cpu_kernel_takes(image) && kernel_size[0] / 2 < w &&
      kernel_size[1] / 2 < h) {  // else the ATen code, which refuses the padding as torch does
    const auto weights = [&](int64_t size, double s) {
      const at::Tensor k = augment_detail::gaussian_kernel1d(size, s, image.device());
      return std::vector<float>(k.data_ptr<float>(), k.data_ptr<float>() + k.numel());
    };
    return augment_detail::gaussian_blur_cpu(image, weights(kernel_size[0], sigma[0]),
                                             weights(kernel_size[1], sigma[1]));
  }
  return augment_detail::gaussian_blur_aten(image, kernel_size, sigma);
}

}  // namespace conveyor::augment_functional

namespace conveyor::augment_detail {

at::Tensor gaussian_kernel1d(int64_t size, double sigma, c10::Device device) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  const double lim = static_cast<double>(size - 1) / (2.0 * std::sqrt(2.0));
  return at::softmax(at::linspace(-lim, lim, size, options).div(sigma).pow(2).neg(), 0);
}

at::Tensor gaussian_blur_aten(const at::Tensor& image, std::vector<int64_t> kernel_size,
                              std::vector<double> sigma) {
  if (kernel_size.size() == 1) kernel_size.push_back(kernel_size[0]);
  if (sigma.size() == 1) sigma.push_back(sigma[0]);
  const int64_t h = image.size(-2), w = image.size(-1);
  const at::Tensor kernel2d =
      gaussian_kernel1d(kernel_size[1], sigma[1], image.device()).unsqueeze(-1) *
      gaussian_kernel1d(kernel_size[0], sigma[0], image.device());
  const at::Tensor kernel = kernel2d.expand({3, 1, kernel2d.size(0), kernel2d.size(1)});
  at::Tensor output = image.reshape({-1, 3, h, w}).to(at::kFloat);
  output = at::pad(output,
                   {kernel_size[0] / 2, kernel_size[0] / 2, kernel_size[1] / 2, kernel_size[1] / 2},
                   "reflect");
  output = at::conv2d(output, kernel, std::nullopt, at::IntArrayRef{1}, at::IntArrayRef{0},
                      at::IntArrayRef{1}, 3);
  return output.round_().to(at::kByte).reshape(image.sizes());
}

}  // namespace conveyor::augment_detail

namespace conveyor::augment_functional {

at::Tensor affine(const at::Tensor& image, double angle, std::vector<double> translate,
                  double scale, std::vector<double> shear, Interpolation interpolation,
                  const std::vector<double>& fill, const std::vector<double>& center) {
  check_image(image, "affine");
  check_fill(fill, "affine");
  if (translate.size() != 2 || shear.size() != 2 || !(scale > 0) ||
      (!center.empty() && center.size() != 2)) {
    throw std::invalid_argument(
        "conveyor: affine needs translate (x, y), shear (x, y), scale > 0 and no centre or (x, y)");
  }
  const int64_t h = image.size(-2), w = image.size(-1);
  double cx = 0, cy = 0;
  if (!center.empty()) {
    cx = center[0] - static_cast<double>(w) * 0.5;
    cy = center[1] - static_cast<double>(h) * 0.5;
  }
  const std::vector<double> m =
      inverse_affine_matrix(cx, cy, angle, translate[0], translate[1], scale, shear[0], shear[1]);
  return apply_grid(image, affine_grid(m, w, h, image.device()), interpolation, fill);
}

at::Tensor rotate(const at::Tensor& image, double angle, Interpolation interpolation,
                  const std::vector<double>& fill) {
  check_image(image, "rotate");
  check_fill(fill, "rotate");
  angle = std::fmod(angle, 360.0);  // Python's %: into [0, 360)
  if (angle < 0) angle += 360.0;
  if (angle == 0) return image.clone();
  if (angle == 180) return at::rot90(image, 2, {-2, -1}).contiguous();
  const int64_t h = image.size(-2), w = image.size(-1);
  if (h == w && angle == 90) return at::rot90(image, 1, {-2, -1}).contiguous();
  if (h == w && angle == 270) return at::rot90(image, 3, {-2, -1}).contiguous();
  const std::vector<double> m = inverse_affine_matrix(0, 0, -angle, 0, 0, 1.0, 0, 0);
  return apply_grid(image, affine_grid(m, w, h, image.device()), interpolation, fill);
}

}  // namespace conveyor::augment_functional

namespace conveyor::augment_functional {

at::Tensor apply_augment_op(const at::Tensor& image, const std::string& op, double magnitude,
                            Interpolation interpolation, const std::vector<double>& fill) {
  const double degrees_per_radian = 180.0 / std::numbers::pi;
  if (op == "Identity") return image.clone();
  if (op == "ShearX") {
    return affine(image, 0.0, {0, 0}, 1.0, {std::atan(magnitude) * degrees_per_radian, 0.0},
                  interpolation, fill, {0, 0});
  }
  if (op == "ShearY") {
    return affine(image, 0.0, {0, 0}, 1.0, {0.0, std::atan(magnitude) * degrees_per_radian},
                  interpolation, fill, {0, 0});
  }
  if (op == "TranslateX") {
    return affine(image, 0.0, {std::trunc(magnitude), 0}, 1.0, {0, 0}, interpolation, fill);
  }
  if (op == "TranslateY") {
    return affine(image, 0.0, {0, std::trunc(magnitude)}, 1.0, {0, 0}, interpolation, fill);
  }
  if (op == "Rotate") return rotate(image, magnitude, interpolation, fill);
  if (op == "Brightness") return adjust_brightness(image, 1.0 + magnitude);
  if (op == "Color") return adjust_saturation(image, 1.0 + magnitude);
  if (op == "Contrast") return adjust_contrast(image, 1.0 + magnitude);
  if (op == "Sharpness") return adjust_sharpness(image, 1.0 + magnitude);
  if (op == "Posterize") return posterize(image, static_cast<int64_t>(magnitude));
  if (op == "Solarize") {  // a threshold past 255 (timm's level 0) leaves the image
    return 255.0 * magnitude > 255.0 ? image.clone() : solarize(image, 255.0 * magnitude);
  }
  if (op == "AutoContrast") return autocontrast(image);
  if (op == "Equalize") return equalize(image);
  if (op == "Invert") return invert(image);
  if (op == "SolarizeAdd") return solarize_add(image, static_cast<int64_t>(magnitude));
  throw std::invalid_argument("conveyor: no augmentation op \"" + op + "\"");
}

}  // namespace conveyor::augment_functional
