// conveyor._C.augment: the batch ops of conveyor/augment.h (issue 34) for Python, each a
// factory that returns an opaque BatchOp; python/conveyor/augment.py gives them torchvision's
// class names. LoaderOptions.batch_transform takes one (its getter gives the op's name, so that
// DataLoader.options stays plain values). An op added in C++ is one m.def here.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"

namespace conveyor::python {
namespace {

using Op = std::shared_ptr<BatchOp>;

// The ops are immutable (apply is const); pybind11 holds them as shared_ptr<BatchOp>.
Op held(std::shared_ptr<const BatchOp> op) { return std::const_pointer_cast<BatchOp>(op); }

}  // namespace

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
}

}  // namespace conveyor::python
