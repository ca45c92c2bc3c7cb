// conveyor._C.augment: the batch ops of conveyor/augment.h (issue 34) for Python, each a
// factory that returns an opaque BatchOp; python/conveyor/augment.py gives them torchvision's
// class names. LoaderOptions.batch_transform takes one (its getter gives the op's name, so that
// DataLoader.options stays plain values). An op added in C++ is one m.def here.
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"

namespace conveyor::python {
namespace {

using Op = std::shared_ptr<BatchOp>;

// The ops are immutable (apply is const); pybind11 holds them as shared_ptr<BatchOp>.
Op held(std::shared_ptr<const BatchOp> op) { return std::const_pointer_cast<BatchOp>(op); }

augment_functional::Interpolation interpolation_of(const std::string& name) {
  if (name == "nearest") return augment_functional::Interpolation::kNearest;
  if (name == "bilinear") return augment_functional::Interpolation::kBilinear;
  throw std::invalid_argument(
      "conveyor: interpolation must be \"nearest\" or \"bilinear\", not \"" + name + "\"");
}

py::tuple drawn(const DrawnParam& d) { return py::make_tuple(d.op, d.name, d.value); }

}  // namespace

py::dict augment_record(const AugmentRecord& record) {
  py::list rows;
  for (const auto& row : record.rows) {
    py::list draws;
    for (const DrawnParam& d : row) draws.append(drawn(d));
    rows.append(draws);
  }
  py::list batch;
  for (const DrawnParam& d : record.batch) batch.append(drawn(d));
  py::dict out;
  out["rows"] = rows;
  out["batch"] = batch;
  if (!record.fields.empty()) {
    // {field: {"rows": [row][view][draw], "batch": [...]}} (a plain image field: one view)
    py::dict fields;
    for (const FieldRecord& f : record.fields) {
      py::list by_row;
      const py::dict draws = augment_record(f.draws);
      const py::list flat = draws["rows"];
      for (size_t r = 0; r * f.views < flat.size(); ++r) {
        py::list views;
        for (size_t v = 0; v < f.views; ++v) views.append(flat[r * f.views + v]);
        by_row.append(views);
      }
      py::dict one;
      one["rows"] = by_row;
      one["batch"] = draws["batch"];
      if (draws.contains("fields")) one["fields"] = draws["fields"];
      fields[py::str(f.field)] = one;
    }
    out["fields"] = fields;
  }
  return out;
}

void bind_augment(py::module_& m) {
  py::module_ a = m.def_submodule("augment", "conveyor/augment.h: batch ops");
  py::class_<BatchOp, Op>(a, "BatchOp", "conveyor::BatchOp (conveyor/augment.h)")
      .def_property_readonly("name", &BatchOp::name)
      .def("__repr__", &BatchOp::name);
  a.def(
      "compose",
      [](const std::vector<Op>& ops) {
        return held(compose(std::vector<std::shared_ptr<const BatchOp>>(ops.begin(), ops.end())));
      },
      py::arg("ops"));
  a.def(
      "per_field",
      [](const std::vector<std::pair<std::string, std::vector<Op>>>& pipelines) {
        std::vector<FieldPipeline> fields;
        for (const auto& [field, ops] : pipelines) {
          fields.push_back(
              {field, std::vector<std::shared_ptr<const BatchOp>>(ops.begin(), ops.end())});
        }
        return held(per_field(std::move(fields)));
      },
      py::arg("pipelines"));
  a.def(
      "normalize",
      [](std::vector<float> mean, std::vector<float> std, c10::ScalarType dtype,
         std::string image) {
        NormalizeOptions o;
        o.mean = std::move(mean);
        o.std = std::move(std);
        o.dtype = dtype;
        return held(normalize(o, std::move(image)));
      },
      py::arg("mean"), py::arg("std"), py::arg("dtype"), py::arg("image"));
  a.def(
      "random_erasing",
      [](double p, double scale_min, double scale_max, double ratio_min, double ratio_max,
         std::vector<double> value, std::string image) {
        return held(random_erasing(
            {p, scale_min, scale_max, ratio_min, ratio_max, std::move(value), std::move(image)}));
      },
      py::arg("p"), py::arg("scale_min"), py::arg("scale_max"), py::arg("ratio_min"),
      py::arg("ratio_max"), py::arg("value"), py::arg("image"));
  a.def(
      "mixup_cutmix",
      [](double mixup_alpha, double cutmix_alpha, double switch_prob, double label_smoothing,
         int64_t num_classes, std::string image, std::string label) {
        return held(mixup_cutmix({mixup_alpha, cutmix_alpha, switch_prob, label_smoothing,
                                  num_classes, std::move(image), std::move(label)}));
      },
      py::arg("mixup_alpha"), py::arg("cutmix_alpha"), py::arg("switch_prob"),
      py::arg("label_smoothing"), py::arg("num_classes"), py::arg("image"), py::arg("label"));
  a.def(
      "mixup",
      [](double alpha, int64_t num_classes, double label_smoothing, std::string image,
         std::string label) {
        return held(mixup(alpha, num_classes, label_smoothing, std::move(image), std::move(label)));
      },
      py::arg("alpha"), py::arg("num_classes"), py::arg("label_smoothing"), py::arg("image"),
      py::arg("label"));
  a.def(
      "cutmix",
      [](double alpha, int64_t num_classes, double label_smoothing, std::string image,
         std::string label) {
        return held(
            cutmix(alpha, num_classes, label_smoothing, std::move(image), std::move(label)));
      },
      py::arg("alpha"), py::arg("num_classes"), py::arg("label_smoothing"), py::arg("image"),
      py::arg("label"));
  a.def(
      "color_jitter",
      [](std::vector<double> brightness, std::vector<double> contrast,
         std::vector<double> saturation, std::vector<double> hue, double p, std::string image) {
        ColorJitterOptions o;
        o.brightness_min = brightness.at(0);
        o.brightness_max = brightness.at(1);
        o.contrast_min = contrast.at(0);
        o.contrast_max = contrast.at(1);
        o.saturation_min = saturation.at(0);
        o.saturation_max = saturation.at(1);
        o.hue_min = hue.at(0);
        o.hue_max = hue.at(1);
        o.p = p;
        o.image = std::move(image);
        return held(color_jitter(std::move(o)));
      },
      py::arg("brightness"), py::arg("contrast"), py::arg("saturation"), py::arg("hue"),
      py::arg("p"), py::arg("image"));
  a.def(
      "random_grayscale",
      [](double p, std::string image) { return held(random_grayscale(p, std::move(image))); },
      py::arg("p"), py::arg("image"));
  a.def(
      "gaussian_blur",
      [](std::vector<int64_t> kernel_size, double sigma_min, double sigma_max, double p,
         std::string image) {
        return held(
            gaussian_blur({std::move(kernel_size), sigma_min, sigma_max, p, std::move(image)}));
      },
      py::arg("kernel_size"), py::arg("sigma_min"), py::arg("sigma_max"), py::arg("p"),
      py::arg("image"));
  a.def(
      "random_solarize",
      [](double threshold, double p, std::string image) {
        return held(random_solarize(threshold, p, std::move(image)));
      },
      py::arg("threshold"), py::arg("p"), py::arg("image"));
  a.def(
      "trivial_augment_wide",
      [](int64_t num_magnitude_bins, const std::string& interpolation, std::vector<double> fill,
         std::string image) {
        return held(trivial_augment_wide({num_magnitude_bins, interpolation_of(interpolation),
                                          std::move(fill), std::move(image)}));
      },
      py::arg("num_magnitude_bins"), py::arg("interpolation"), py::arg("fill"), py::arg("image"));
  a.def(
      "rand_augment",
      [](int64_t num_ops, double magnitude, int64_t num_magnitude_bins,
         const std::string& interpolation, std::vector<double> fill, std::string image) {
        RandAugmentOptions o;
        o.num_ops = num_ops;
        o.magnitude = magnitude;
        o.num_magnitude_bins = num_magnitude_bins;
        o.interpolation = interpolation_of(interpolation);
        o.fill = std::move(fill);
        o.image = std::move(image);
        return held(rand_augment(std::move(o)));
      },
      py::arg("num_ops"), py::arg("magnitude"), py::arg("num_magnitude_bins"),
      py::arg("interpolation"), py::arg("fill"), py::arg("image"));
  a.def(
      "timm_rand_augment",
      [](const std::string& config, std::optional<std::string> interpolation,
         std::optional<std::vector<double>> fill, std::string image) {
        RandAugmentOptions o = parse_timm_rand_augment(config);
        if (interpolation) o.interpolation = interpolation_of(*interpolation);
        if (fill) o.fill = std::move(*fill);
        o.image = std::move(image);
        return held(rand_augment(std::move(o)));
      },
      py::arg("config"), py::arg("interpolation"), py::arg("fill"), py::arg("image"));
  a.def(
      "auto_augment",
      [](const std::string& interpolation, std::vector<double> fill, std::string image) {
        return held(
            auto_augment({interpolation_of(interpolation), std::move(fill), std::move(image)}));
      },
      py::arg("interpolation"), py::arg("fill"), py::arg("image"));
  a.def(
      "augment_steps",
      [](const Op& op, uint64_t seed, size_t count, int64_t h, int64_t w) {
        // The steps op draws for dataset indices 0..count-1 of epoch 0 (the distribution tests).
        BatchContext ctx;
        ctx.seed = seed;
        ctx.indices.resize(count);
        for (size_t i = 0; i < count; ++i) ctx.indices[i] = i;
        std::vector<std::vector<std::pair<std::string, double>>> out(count);
        for (size_t i = 0; i < count; ++i) {
          SampleRng rng = ctx.sample_rng(i);
          for (auto& s : augment_draws::augment_steps(*op, rng, h, w)) {
            out[i].emplace_back(std::move(s.op), s.magnitude);
          }
        }
        return out;
      },
      py::arg("op"), py::arg("seed"), py::arg("count"), py::arg("height"), py::arg("width"));

  a.def(
      "apply",
      [](const Op& op, py::dict fields, uint64_t seed, uint64_t epoch, size_t sequence,
         std::vector<size_t> indices, std::vector<uint32_t> repeats, bool record) {
        // Runs op on a batch given as {name: tensor [B, ...]} (uint8 images, int64 labels, ...)
        // outside a loader, with the context a loader would give it; returns the new dict.
        BatchFields batch;
        for (const auto& [key, value] : fields) {
          const at::Tensor t = value.cast<at::Tensor>();
          std::vector<int64_t> shape(t.sizes().begin() + 1, t.sizes().end());
          batch.specs.push_back({key.cast<std::string>(), t.scalar_type(), shape});
          batch.tensors.push_back(t);
        }
        BatchContext ctx;
        ctx.seed = seed;
        ctx.epoch = epoch;
        ctx.sequence = sequence;
        ctx.indices = std::move(indices);
        ctx.repeats = std::move(repeats);
        AugmentRecord drawn;
        drawn.rows.resize(ctx.rows());
        if (record) ctx.record = &drawn;
        op->out_fields(batch.specs);  // what it cannot take is a ValueError, as for a loader
        {
          py::gil_scoped_release release;
          apply_op(*op, batch, ctx);
        }
        py::dict out;
        for (size_t i = 0; i < batch.specs.size(); ++i)
          out[py::str(batch.specs[i].name)] = batch.tensors[i];
        if (record) return py::make_tuple(out, augment_record(drawn));
        return py::make_tuple(out, py::none());
      },
      py::arg("op"), py::arg("fields"), py::arg("seed"), py::arg("epoch"), py::arg("sequence"),
      py::arg("indices"), py::arg("repeats") = std::vector<uint32_t>{}, py::arg("record") = false);

  namespace F = augment_functional;
  py::module_ f = a.def_submodule(
      "functional", "conveyor/augment_functional.h: torchvision v2's kernels on uint8 images");
  f.def("adjust_brightness", &F::adjust_brightness, py::arg("image"), py::arg("factor"));
  f.def("adjust_contrast", &F::adjust_contrast, py::arg("image"), py::arg("factor"));
  f.def("adjust_saturation", &F::adjust_saturation, py::arg("image"), py::arg("factor"));
  f.def("adjust_hue", &F::adjust_hue, py::arg("image"), py::arg("factor"));
  f.def("adjust_sharpness", &F::adjust_sharpness, py::arg("image"), py::arg("factor"));
  f.def("rgb_to_grayscale", &F::rgb_to_grayscale, py::arg("image"));
  f.def("posterize", &F::posterize, py::arg("image"), py::arg("bits"));
  f.def("solarize", &F::solarize, py::arg("image"), py::arg("threshold"));
  f.def("solarize_add", &F::solarize_add, py::arg("image"), py::arg("addition"),
        py::arg("threshold") = 128);
  f.def("invert", &F::invert, py::arg("image"));
  f.def("equalize", &F::equalize, py::arg("image"));
  f.def("autocontrast", &F::autocontrast, py::arg("image"));
  f.def("gaussian_blur", &F::gaussian_blur, py::arg("image"), py::arg("kernel_size"),
        py::arg("sigma"));
  f.def(
      "affine",
      [](const at::Tensor& image, double angle, std::vector<double> translate, double scale,
         std::vector<double> shear, const std::string& interpolation, std::vector<double> fill,
         std::vector<double> center) {
        return F::affine(image, angle, std::move(translate), scale, std::move(shear),
                         interpolation_of(interpolation), fill, center);
      },
      py::arg("image"), py::arg("angle"), py::arg("translate"), py::arg("scale"), py::arg("shear"),
      py::arg("interpolation"), py::arg("fill"), py::arg("center"));
  f.def(
      "rotate",
      [](const at::Tensor& image, double angle, const std::string& interpolation,
         std::vector<double> fill) {
        return F::rotate(image, angle, interpolation_of(interpolation), fill);
      },
      py::arg("image"), py::arg("angle"), py::arg("interpolation"), py::arg("fill"));
  f.def(
      "apply_augment_op",
      [](const at::Tensor& image, const std::string& op, double magnitude,
         const std::string& interpolation, std::vector<double> fill) {
        return F::apply_augment_op(image, op, magnitude, interpolation_of(interpolation), fill);
      },
      py::arg("image"), py::arg("op"), py::arg("magnitude"), py::arg("interpolation"),
      py::arg("fill"));
}

}  // namespace conveyor::python
