// Fused CPU loops for adjust_hue and gaussian_blur on uint8 images (cpu_kernels.h).
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

namespace conveyor::augment_detail {
namespace {

float clamp01(float x) { return std::min(std::max(x, 0.0f), 1.0f); }

// Reflect padding's source index for i in [-r, n + r) (torch's "reflect": no edge repeat).
int64_t reflect(int64_t i, int64_t n) {
  if (i < 0) return -i;
  if (i >= n) return 2 * (n - 1) - i;
  return i;
}

}  // namespace

bool cpu_kernel_takes(const at::Tensor& image) {
  return image.device().is_cpu() && image.scalar_type() == at::kByte && image.dim() >= 3 &&
         image.size(-3) == 3;
}

at::Tensor adjust_hue_cpu(const at::Tensor& image, double factor) {
  const at::Tensor in = image.contiguous();
  at::Tensor out = at::empty_like(in);
  const int64_t plane = in.size(-2) * in.size(-1);
  const int64_t images = plane == 0 ? 0 : in.numel() / (3 * plane);
  const auto scale = static_cast<float>(1.0 / 255.0);
  const auto sixth = static_cast<float>(1.0 / 6.0);
  const auto shift = static_cast<float>(factor);
  const auto to_byte = static_cast<float>(255.0 + 1.0 - 1e-3);
  const uint8_t* src = in.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t n = 0; n < images; ++n) {
    const uint8_t* rp = src + n * 3 * plane;
    uint8_t* op = dst + n * 3 * plane;
    for (int64_t k = 0; k < plane; ++k) {
      // _rgb_to_hsv
      const float r = static_cast<float>(rp[k]) * scale;
      const float g = static_cast<float>(rp[plane + k]) * scale;
      const float b = static_cast<float>(rp[2 * plane + k]) * scale;
      const float maxc = std::max(std::max(r, g), b);
      const float minc = std::min(std::min(r, g), b);
      const bool eqc = maxc == minc;
      const float range = maxc - minc;
      const float s = range / (eqc ? 1.0f : maxc);
      const float divisor = eqc ? 1.0f : range;
      const float rc = (maxc - r) / divisor;
      const float gc = (maxc - g) / divisor;
      const float bc = (maxc - b) / divisor;
      const bool neq_r = maxc != r;
      const bool eq_g = maxc == g;
      const float hg = ((rc + 2.0f) - bc) * static_cast<float>(eq_g && neq_r);
      const float hr = (bc - gc) * static_cast<float>(!neq_r);
      const float hb = ((gc + 4.0f) - rc) * static_cast<float>(neq_r && !eq_g);
      // fmod(x, 1) and remainder(x, 1) without the calls: x lies in [5/6, 11/6) here and the
      // shifted hue in [-0.5, 1.5), where x - 1 and x + 1 are what fmod and remainder give
      // (x - 1 is exact for x in [1, 2]).
      float h = ((hr + hg) + hb) * sixth + 1.0f;
      h = h >= 1.0f ? h - 1.0f : h;
      h = h + shift;
      h = h >= 1.0f ? h - 1.0f : (h < 0.0f ? h + 1.0f : h);
      // _hsv_to_rgb
      const float v = maxc;
      const float h6 = h * 6.0f;
      const float i_float = std::floor(h6);
      const float f = h6 - i_float;
      int i = static_cast<int>(i_float);
      const float sxf = s * f;
      const float one_minus_s = 1.0f - s;
      const float q = clamp01((1.0f - sxf) * v);
      const float t = clamp01((sxf + one_minus_s) * v);
      const float p = clamp01(one_minus_s * v);
      i = ((i % 6) + 6) % 6;
      const float vpqt[4] = {v, p, q, t};
      static constexpr int kTable[3][6] = {
          {0, 2, 1, 1, 3, 0}, {3, 0, 0, 2, 1, 1}, {1, 1, 3, 0, 0, 2}};
      op[k] = static_cast<uint8_t>(vpqt[kTable[0][i]] * to_byte);
      op[plane + k] = static_cast<uint8_t>(vpqt[kTable[1][i]] * to_byte);
      op[2 * plane + k] = static_cast<uint8_t>(vpqt[kTable[2][i]] * to_byte);
    }
  }
  return out.view(image.sizes());
}

at::Tensor gaussian_blur_cpu(const at::Tensor& image, const std::vector<float>& weights_x,
                             const std::vector<float>& weights_y) {
  const at::Tensor in = image.contiguous();
  at::Tensor out = at::empty_like(in);
  const int64_t h = in.size(-2), w = in.size(-1);
  const int64_t planes = h * w == 0 ? 0 : in.numel() / (h * w);
  const auto rx = static_cast<int64_t>(weights_x.size() / 2);
  const auto ry = static_cast<int64_t>(weights_y.size() / 2);
  std::vector<float> padded(static_cast<size_t>(w + 2 * rx));
  std::vector<float> rows(static_cast<size_t>(h * w));  // the row pass of one plane
  std::vector<float> acc(static_cast<size_t>(w));
  const uint8_t* src = in.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t c = 0; c < planes; ++c) {
    const uint8_t* plane = src + c * h * w;
    for (int64_t y = 0; y < h; ++y) {
      const uint8_t* row = plane + y * w;
      for (int64_t x = -rx; x < w + rx; ++x) {
        padded[static_cast<size_t>(x + rx)] = static_cast<float>(row[reflect(x, w)]);
      }
      float* into = rows.data() + y * w;
      std::fill(into, into + w, 0.0f);
      for (size_t j = 0; j < weights_x.size(); ++j) {
        const float weight = weights_x[j];
        const float* from = padded.data() + j;
        for (int64_t x = 0; x < w; ++x) into[x] += weight * from[x];
      }
    }
    uint8_t* plane_out = dst + c * h * w;
    for (int64_t y = 0; y < h; ++y) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t i = 0; i < weights_y.size(); ++i) {
        const float weight = weights_y[i];
        const float* from = rows.data() + reflect(y + static_cast<int64_t>(i) - ry, h) * w;
        for (int64_t x = 0; x < w; ++x) acc[static_cast<size_t>(x)] += weight * from[x];
      }
      for (int64_t x = 0; x < w; ++x) {
        // round half to even (torch.round), then to uint8; the weights sum to 1, so 0..255.
        const float rounded = std::nearbyint(acc[static_cast<size_t>(x)]);
        plane_out[y * w + x] = static_cast<uint8_t>(std::clamp(rounded, 0.0f, 255.0f));
      }
    }
  }
  return out.view(image.sizes());
}

}  // namespace conveyor::augment_detail
