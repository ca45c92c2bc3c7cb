// train_images: a small CNN trained on an ImageFolder through Conveyor's image pipeline.
//
// Each worker decodes JPEGs with libjpeg-turbo (only the RandomResizedCrop box, at the smallest
// DCT scale that covers it), resizes, flips and writes the uint8 image straight into a batch slot;
// with a GPU the slots are pinned and each batch is copied on a side stream while the previous
// step computes, then normalized on the device. Without a GPU the same loop runs on the CPU.
// Every step prints how long the loop waited for its batch and the images per second.
//
// Usage:
//   train_images --data DIR                 an ImageFolder (DIR/<class>/<image>.jpg)
//   train_images --generate DIR             first writes a small photo-like ImageFolder to DIR
// Settings (defaults are tiny, so it runs on a CPU in seconds):
//   --classes N (4) --per-class N (16)      size of the generated dataset
//   --size N (64) --batch N (16) --workers N (2) --epochs N (2) --steps N (0: whole epochs)
//   --lr X (0.05) --seed N (0)
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "conveyor/conveyor.h"
#include "image_folder_cli.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Settings {
  conveyor::examples::FolderSettings folder;
  int size = 64;
  size_t steps = 0;
  double lr = 0.05;
};

// The command line (CLI11, as conveyor-bench and conveyor-prepare): --help lists every option with
// its default; a usage error prints the problem and exits with status 2.
Settings parse(int argc, char** argv) {
  Settings s;
  CLI::App app(
      "train_images: a small CNN trained on an ImageFolder through Conveyor's image "
      "pipeline");
  conveyor::examples::add_source_options(app, s.folder, "train");
  conveyor::examples::add_generator_options(app, s.folder);
  app.add_option("--size", s.size, "output side of each image (at least 8)")
      ->capture_default_str()
      ->check(CLI::Range(8, 4096));
  conveyor::examples::add_loop_options(app, s.folder);
  app.add_option("--steps", s.steps, "stop after this many steps (0: whole epochs)")
      ->capture_default_str();
  app.add_option("--lr", s.lr, "SGD learning rate")->capture_default_str();
  conveyor::examples::add_seed_option(app, s.folder);
  conveyor::examples::parse_or_exit(app, argc, argv, s.folder);
  return s;
}

// conv-relu-pool twice, global average pool, linear.
struct SmallCnnImpl : torch::nn::Module {
  explicit SmallCnnImpl(int64_t classes)
      : features(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)),
                 torch::nn::BatchNorm2d(16), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
                 torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                 torch::nn::BatchNorm2d(32), torch::nn::ReLU(),
                 torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions(1)),
                 torch::nn::Flatten()),
        head(32, classes) {
    register_module("features", features);
    register_module("head", head);
  }
  torch::Tensor forward(torch::Tensor x) { return head(features->forward(x)); }
  torch::nn::Sequential features;
  torch::nn::Linear head;
};
TORCH_MODULE(SmallCnn);

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse(argc, argv);
  const std::string root = conveyor::examples::image_folder_root(settings.folder);

  const torch::Device device = conveyor::cuda_available() ? torch::kCUDA : torch::kCPU;
  auto source = conveyor::ImageSource::image_folder(
      root, conveyor::ImageTransform::train(settings.size));  // RandomResizedCrop + flip
  const int64_t classes = static_cast<int64_t>(source->classes().size());
  auto loader = conveyor::make_data_loader(
      std::move(source), conveyor::examples::loader_options(settings.folder, device));
  std::printf("training on %s, %lld classes\n", device.str().c_str(),
              static_cast<long long>(classes));

  torch::manual_seed(static_cast<uint64_t>(settings.folder.seed));
  SmallCnn model(classes);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(settings.lr).momentum(0.9));

  size_t step = 0;
  for (int epoch = 0; epoch < settings.folder.epochs; ++epoch) {
    auto asked = Clock::now();  // when the loop asked for the next batch
    for (auto it = loader->begin(); it != loader->end(); ++it) {
      const auto arrived = Clock::now();
      conveyor::Batch& batch = *it;
      // uint8 [B,3,S,S] on the device -> normalized float, on the device.
      torch::Tensor images = conveyor::normalize_images(batch.images());
      torch::Tensor labels = batch.labels();
      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
      loss.backward();
      optimizer.step();
      const double loss_value = loss.item<double>();  // waits for the device
      const auto done = Clock::now();
      std::printf(
          "epoch %d step %zu: loss %.4f  waited for data %.2f ms  step %.2f ms  %.0f "
          "images/s\n",
          epoch, step, loss_value, ms_between(asked, arrived), ms_between(asked, done),
          static_cast<double>(batch.size()) / (ms_between(asked, done) / 1000.0));
      ++step;
      if (settings.steps != 0 && step >= settings.steps) break;
      asked = Clock::now();
    }
    if (settings.steps != 0 && step >= settings.steps) break;
  }

  const conveyor::LoaderStats stats = loader->stats();
  std::printf("%s\n", loader->mode().c_str());
  std::printf("loader: %llu batches, %llu samples, %llu skipped, %llu errors\n",
              static_cast<unsigned long long>(stats.batches),
              static_cast<unsigned long long>(stats.samples),
              static_cast<unsigned long long>(stats.skipped),
              static_cast<unsigned long long>(stats.errors));
  for (const conveyor::SkippedSample& s : stats.skipped_samples) {
    std::printf("  skipped %s: %s\n", s.path.c_str(), s.message.c_str());
  }
  std::printf("time: workers decoding %.3f s (summed), issuing copies %.3f s, loop waited %.3f s\n",
              stats.fill_seconds, stats.copy_issue_seconds, stats.wait_seconds);
  std::printf("slots:");
  for (size_t state = 0; state < stats.slot_states.size(); ++state) {
    std::printf(" %s %zu", conveyor::to_string(static_cast<conveyor::SlotState>(state)),
                stats.slot_states[state]);
  }
  std::printf("\n");
  return stats.batches > 0 ? 0 : 1;
}
