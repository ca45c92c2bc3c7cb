// The references written the way a LibTorch user writes them today: a torch::data dataset whose
// get() decodes one image, torch::data's Stack collate and DataLoader, then .to(device).
//   torch:       full TurboJPEG decode (CMYK and YCCK via TJPF_CMYK, converted: UserJpegDecoder),
//                OpenCV crop + resize + flip, pinned non_blocking copy when the device is CUDA;
//   torch-fused: the same loop, but get() calls Conveyor's fused decode-and-augment, so what is
//                left between it and Conveyor is the engine alone;
//   naive:       the torch run with pageable memory and a blocking .to(device) per batch.
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include <torch/torch.h>
#include <opencv2/imgproc.hpp>

#include "bench_runs.h"
#include "conveyor/conveyor.h"

namespace conveyor::bench {
namespace {

// What the workers' copies of a dataset count together.
struct ReferenceCounters {
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> skipped{0};
};

class PhotoDataset : public torch::data::datasets::Dataset<PhotoDataset> {
 public:
  PhotoDataset(std::string name, std::shared_ptr<const std::vector<ImageItem>> items,
               ImageTransform transform, bool fused, bool skip,
               std::shared_ptr<ReferenceCounters> counters)
      : name_(std::move(name)),
        items_(std::move(items)),
        transform_(transform),
        fused_(fused),
        skip_(skip),
        counters_(std::move(counters)) {}
  // torch::data copies a stateless dataset into each worker: each copy gets its own decoder.
  PhotoDataset(const PhotoDataset& other)
      : name_(other.name_),
        items_(other.items_),
        transform_(other.transform_),
        fused_(other.fused_),
        skip_(other.skip_),
        counters_(other.counters_) {}

  // A file that fails applies --on-error as Conveyor does: under raise the error names the
  // reference and the file; under skip the next index that loads takes its place.
  torch::data::Example<> get(size_t index) override {
    for (size_t attempt = 0;; ++attempt) {
      const size_t i = (index + attempt) % items_->size();
      const ImageItem& item = (*items_)[i];
      try {
        return {load(item, i), torch::tensor(item.label, torch::kInt64)};
      } catch (const std::exception& e) {
        counters_->errors++;
        if (!skip_ || attempt + 1 > kMaxSubstitutes) {
          throw std::runtime_error(reference_error(name_, item.path, e.what()));
        }
        counters_->skipped++;
      }
    }
  }
  torch::optional<size_t> size() const override { return items_->size(); }

 private:
  torch::Tensor load(const ImageItem& item, size_t index) {
    read_file(item.path, file_);
    const int s = transform_.size;
    if (fused_) {
      torch::Tensor image = torch::empty({3, s, s}, torch::kUInt8);
      if (!writer_) writer_ = std::make_unique<ImageWriter>(transform_);
      writer_->write(file_.data(), file_.size(), SampleContext{0, index, 0, epoch_},
                     reinterpret_cast<std::byte*>(image.data_ptr<uint8_t>()));
      return image;
    }
    if (!decoder_) decoder_ = std::make_unique<UserJpegDecoder>();
    int w = 0, h = 0;
    decoder_->decode(file_, pixels_, w, h);
    cv::Mat full(h, w, CV_8UC3, pixels_.data());
    CropBox box = choose_crop(transform_, w, h, 0, epoch_, index);
    cv::Mat resized;
    cv::resize(full(cv::Rect(box.x, box.y, box.width, box.height)), resized, cv::Size(s, s), 0, 0,
               cv::INTER_LINEAR);
    if (box.flip) cv::flip(resized, resized, 1);
    return torch::from_blob(resized.data, {s, s, 3}, torch::kUInt8).permute({2, 0, 1}).contiguous();
  }

  std::string name_;
  std::shared_ptr<const std::vector<ImageItem>> items_;
  ImageTransform transform_;
  bool fused_;
  bool skip_;
  std::shared_ptr<ReferenceCounters> counters_;
  uint64_t epoch_ = 0;
  std::vector<uint8_t> file_, pixels_;
  std::unique_ptr<ImageWriter> writer_;
  std::unique_ptr<UserJpegDecoder> decoder_;
};

}  // namespace

RunResult run_torch_loader(const std::string& name, const BenchConfig& config) {
  const ImageTransform transform = ImageTransform::train(config.crop);
  auto source = ImageSource::image_folder(config.data, transform);
  auto items = std::make_shared<const std::vector<ImageItem>>(source->items());
  const bool fused = name == "torch-fused";
  const bool naive = name == "naive";
  torch::Device device(config.device);
  auto counters = std::make_shared<ReferenceCounters>();
  auto dataset = PhotoDataset(name, items, transform, fused, config.skip, counters)
                     .map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(dataset),
      torch::data::DataLoaderOptions().batch_size(config.batch_size).workers(config.workers));
  RunResult r;
  r.name = name;
  r.device = device.str();
  Progress progress(name, items->size() * config.epochs, config.progress);
  const double t0 = now_seconds();
  const double cpu0 = process_cpu_seconds();
  double last = t0;
  try {
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
        const double t = now_seconds();
        r.batch_ms.push_back((t - last) * 1000.0);
        last = t;
        progress.update(r.images);
      }
    }
  } catch (const torch::data::WorkerException& e) {
    // The reference's own error (naming it and the file), not torch::data's wrapper around it.
    progress.finish(r.images);
    std::rethrow_exception(e.original_exception);
  }
  if (device.is_cuda()) (void)torch::zeros({1}, torch::TensorOptions().device(device)).cpu();
  r.seconds = now_seconds() - t0;
  r.cpu_seconds = process_cpu_seconds() - cpu0;
  r.images_per_s = r.images / r.seconds;
  r.errors = counters->errors;
  r.skipped = counters->skipped;
  progress.finish(r.images);
  r.timeline = progress.take_timeline();
  r.workers = config.workers;
  r.active_workers = config.workers;
  return r;
}

}  // namespace conveyor::bench
