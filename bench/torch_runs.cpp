// The references written the way a LibTorch user writes them today: a torch::data dataset whose
// get() decodes one image, torch::data's Stack collate and DataLoader, then .to(device).
//   torch:       full TurboJPEG decode, OpenCV crop + resize + flip, pinned non_blocking copy
//                when the device is CUDA;
//   torch-fused: the same loop, but get() calls Conveyor's fused decode-and-augment, so what is
//                left between it and Conveyor is the engine alone;
//   naive:       the torch run with pageable memory and a blocking .to(device) per batch.
#include <memory>

#include <torch/torch.h>
#include <turbojpeg.h>
#include <opencv2/imgproc.hpp>

#include "bench_runs.h"
#include "conveyor/conveyor.h"

namespace conveyor::bench {
namespace {

class PhotoDataset : public torch::data::datasets::Dataset<PhotoDataset> {
 public:
  PhotoDataset(std::shared_ptr<const std::vector<ImageItem>> items, ImageTransform transform,
               bool fused)
      : items_(std::move(items)), transform_(transform), fused_(fused) {}
  // torch::data copies a stateless dataset into each worker: each copy gets its own decoder.
  PhotoDataset(const PhotoDataset& other)
      : items_(other.items_), transform_(other.transform_), fused_(other.fused_) {}

  torch::data::Example<> get(size_t index) override {
    const ImageItem& item = (*items_)[index];
    read_file(item.path, file_);
    const int s = transform_.size;
    torch::Tensor image = torch::empty({3, s, s}, torch::kUInt8);
    if (fused_) {
      if (!writer_) writer_ = std::make_unique<ImageWriter>(transform_);
      writer_->write(file_.data(), file_.size(), SampleContext{0, index, 0, epoch_},
                     reinterpret_cast<std::byte*>(image.data_ptr<uint8_t>()));
    } else {
      if (handle_ == nullptr) handle_.reset(tjInitDecompress());
      int w = 0, h = 0, sub = 0, cs = 0;
      if (tjDecompressHeader3(handle_.get(), file_.data(), file_.size(), &w, &h, &sub, &cs) != 0) {
        throw std::runtime_error(item.path + ": " + tjGetErrorStr2(handle_.get()));
      }
      cv::Mat full(h, w, CV_8UC3);
      if (tjDecompress2(handle_.get(), file_.data(), file_.size(), full.data, w, 0, h, TJPF_RGB,
                        0) != 0) {
        throw std::runtime_error(item.path + ": " + tjGetErrorStr2(handle_.get()));
      }
      CropBox box = choose_crop(transform_, w, h, 0, epoch_, index);
      cv::Mat resized;
      cv::resize(full(cv::Rect(box.x, box.y, box.width, box.height)), resized, cv::Size(s, s), 0, 0,
                 cv::INTER_LINEAR);
      if (box.flip) cv::flip(resized, resized, 1);
      image =
          torch::from_blob(resized.data, {s, s, 3}, torch::kUInt8).permute({2, 0, 1}).contiguous();
    }
    return {image, torch::tensor(item.label, torch::kInt64)};
  }
  torch::optional<size_t> size() const override { return items_->size(); }

 private:
  struct TjDestroy {
    void operator()(void* h) const { tjDestroy(h); }
  };
  std::shared_ptr<const std::vector<ImageItem>> items_;
  ImageTransform transform_;
  bool fused_;
  uint64_t epoch_ = 0;
  std::vector<uint8_t> file_;
  std::unique_ptr<ImageWriter> writer_;
  std::unique_ptr<void, TjDestroy> handle_;
};

}  // namespace

RunResult run_torch_loader(const std::string& name, const BenchConfig& config) {
  const ImageTransform transform = ImageTransform::train(config.crop);
  auto source = ImageSource::image_folder(config.data, transform);
  auto items = std::make_shared<const std::vector<ImageItem>>(source->items());
  const bool fused = name == "torch-fused";
  const bool naive = name == "naive";
  torch::Device device(config.device);
  auto dataset = PhotoDataset(items, transform, fused).map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(dataset),
      torch::data::DataLoaderOptions().batch_size(config.batch_size).workers(config.workers));
  RunResult r;
  r.name = name;
  r.device = device.str();
  Progress progress(name, items->size() * config.epochs, config.progress);
  const double t0 = now_seconds();
  for (size_t e = 0; e < config.epochs; ++e) {
    for (auto& batch : *loader) {
      torch::Tensor images = batch.data;
      torch::Tensor labels = batch.target;
      if (device.is_cuda()) {
        if (naive) {
          images = images.to(device);
          labels = labels.to(device);
        } else {
          images = images.pin_memory().to(device, /*non_blocking=*/true);
          labels = labels.pin_memory().to(device, /*non_blocking=*/true);
        }
      }
      r.images += static_cast<uint64_t>(images.size(0));
      progress.update(r.images);
    }
  }
  if (device.is_cuda()) (void)torch::zeros({1}, torch::TensorOptions().device(device)).cpu();
  r.seconds = now_seconds() - t0;
  r.images_per_s = r.images / r.seconds;
  progress.finish();
  return r;
}

}  // namespace conveyor::bench
