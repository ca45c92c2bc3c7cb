// Normalize: the image field to floats by normalize_images()'s rule (conveyor/augment.h).
#include <sstream>

#include <ATen/ATen.h>

#include "conveyor/augment.h"

namespace conveyor {
namespace {

class Normalize final : public BatchOp {
 public:
  Normalize(const NormalizeOptions& options, std::string image)
      : options_(options), image_(std::move(image)) {}
  std::string name() const override {
    std::ostringstream out;
    out << "Normalize(mean=[" << options_.mean.at(0) << ", " << options_.mean.at(1) << ", "
        << options_.mean.at(2) << "], std=[" << options_.std.at(0) << ", " << options_.std.at(1)
        << ", " << options_.std.at(2) << "])";
    return out.str();
  }
  std::vector<FieldSpec> out_fields(std::vector<FieldSpec> in) const override {
    FieldSpec& f = in[BatchFields{in, {}}.find(image_)];
    const bool hwc = image_layout(f, name()) == ImageLayout::kHWC;
    if (f.dtype != c10::ScalarType::Byte) {
      throw std::invalid_argument(name() + ": field \"" + image_ + "\" is " +
                                  c10::toString(f.dtype) + ", not uint8");
    }
    f.sample_shape = {3, f.sample_shape[hwc ? 0 : 1], f.sample_shape[hwc ? 1 : 2]};
    f.dtype = options_.dtype;
    return in;
  }
  void apply(BatchFields& batch, const BatchContext&) const override {
    NormalizeOptions o = options_;
    o.hwc = image_layout(batch.spec(image_), name()) == ImageLayout::kHWC;
    at::Tensor& images = batch[image_];
    images = normalize_images(images, o);
  }

 private:
  NormalizeOptions options_;
  std::string image_;
};

}  // namespace

std::shared_ptr<const BatchOp> normalize(const NormalizeOptions& options, std::string image) {
  if (options.mean.size() != 3 || options.std.size() != 3) {
    throw std::invalid_argument("conveyor: Normalize needs 3 values of mean and of std");
  }
  return std::make_shared<const Normalize>(options, std::move(image));
}

}  // namespace conveyor
