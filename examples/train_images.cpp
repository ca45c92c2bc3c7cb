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
#include <cstdlib>
#include <string>

#include "conveyor/conveyor.h"
#include "synthetic.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Settings {
  std::string data;
  std::string generate;
  size_t classes = 4;
  size_t per_class = 16;
  int size = 64;
  size_t batch = 16;
  size_t workers = 2;
  int epochs = 2;
  size_t steps = 0;
  double lr = 0.05;
  uint64_t seed = 0;
};

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr,
               "train_images: %s\n"
               "usage: train_images (--data DIR | --generate DIR) [--classes N] [--per-class N]\n"
               "       [--size N] [--batch N] [--workers N] [--epochs N] [--steps N] [--lr X]\n"
               "       [--seed N]\n",
               problem);
  std::exit(2);
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(("missing the value of " + arg).c_str());
    const std::string value = argv[++i];
    const auto number = [&] { return std::strtoull(value.c_str(), nullptr, 10); };
    if (arg == "--data") {
      s.data = value;
    } else if (arg == "--generate") {
      s.generate = value;
    } else if (arg == "--classes") {
      s.classes = number();
    } else if (arg == "--per-class") {
      s.per_class = number();
    } else if (arg == "--size") {
      s.size = static_cast<int>(number());
    } else if (arg == "--batch") {
      s.batch = number();
    } else if (arg == "--workers") {
      s.workers = number();
    } else if (arg == "--epochs") {
      s.epochs = static_cast<int>(number());
    } else if (arg == "--steps") {
      s.steps = number();
    } else if (arg == "--lr") {
      s.lr = std::strtod(value.c_str(), nullptr);
    } else if (arg == "--seed") {
      s.seed = number();
    } else {
      usage(("unknown option " + arg).c_str());
    }
  }
  if (s.data.empty() == s.generate.empty()) usage("give either --data or --generate");
  if (s.size < 8 || s.batch == 0) usage("--size must be at least 8 and --batch at least 1");
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
  std::string root = settings.data;
  if (!settings.generate.empty()) {
    conveyor::GeneratorOptions generator;
    generator.classes = settings.classes;
    generator.images_per_class = settings.per_class;
    generator.threads = settings.workers;
    const conveyor::GeneratedDataset made =
        conveyor::generate_image_folder(settings.generate, generator);
    std::printf("dataset: %zu images in %s (%s)\n", made.images, made.root.c_str(),
                made.reused ? "reused" : "generated");
    root = made.root.string();
  }

  const torch::Device device = conveyor::cuda_available() ? torch::kCUDA : torch::kCPU;
  auto source = conveyor::ImageSource::image_folder(
      root, conveyor::ImageTransform::train(settings.size));  // RandomResizedCrop + flip
  const int64_t classes = static_cast<int64_t>(source->classes().size());
  auto loader =
      conveyor::make_data_loader(std::move(source), conveyor::DataLoaderOptions(settings.batch)
                                                        .workers(settings.workers)
                                                        .drop_last(true)
                                                        .pin_memory(true)
                                                        .device(device)
                                                        .seed(settings.seed));
  std::printf("training on %s, %lld classes\n", device.str().c_str(),
              static_cast<long long>(classes));

  torch::manual_seed(static_cast<uint64_t>(settings.seed));
  SmallCnn model(classes);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(settings.lr).momentum(0.9));

  size_t step = 0;
  for (int epoch = 0; epoch < settings.epochs; ++epoch) {
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
