// drop_in: an ordinary LibTorch training loop over a torch::data dataset, switched to Conveyor.
//
// The dataset, the transforms, the model and the loop are what a LibTorch user already has. The
// switch is one name (torch::data:: -> conveyor::) plus, for the GPU, two options:
//
//   -  auto loader = torch::data::make_data_loader(
//   -      std::move(dataset), torch::data::DataLoaderOptions(64).workers(2));
//   +  auto loader = conveyor::make_data_loader(
//   +      std::move(dataset), conveyor::DataLoaderOptions(64).workers(2)
//   +                              .pin_memory(true).device(device));
//
// Because the dataset is a per-sample Dataset mapped with Normalize and Stack, Conveyor collates
// each sample straight into a (pinned) batch slot and copies it to the GPU on a side stream.
//
// Usage: drop_in [--torch] [--epochs N] [--workers N] [--batch N]
//   --torch  runs the same loop on torch::data's loader, for comparison.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "conveyor/conveyor.h"

namespace {

// Four classes of 8x8 single-channel "images": a bright quadrant per class, plus noise.
// Deterministic in the index, so every worker's copy returns the same sample.
class Quadrants : public torch::data::datasets::Dataset<Quadrants> {
 public:
  explicit Quadrants(size_t size) : size_(size) {}
  torch::data::Example<> get(size_t index) override {
    std::mt19937 rng(static_cast<uint32_t>(index));
    std::normal_distribution<float> noise(0.f, 0.3f);
    const int64_t label = static_cast<int64_t>(index % 4);
    torch::Tensor image = torch::empty({1, 8, 8});
    auto pixels = image.accessor<float, 3>();
    for (int y = 0; y < 8; ++y) {
      for (int x = 0; x < 8; ++x) {
        const int quadrant = (y / 4) * 2 + (x / 4);
        pixels[0][y][x] = (quadrant == label ? 1.f : 0.f) + noise(rng);
      }
    }
    return {image, torch::tensor(label)};
  }
  std::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
};

struct Settings {
  bool use_torch = false;
  int epochs = 3;
  size_t workers = 2;
  size_t batch = 64;
};

template <typename Loader>
void train(Loader& loader, torch::Device device, const Settings& settings) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(64, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int epoch = 0; epoch < settings.epochs; ++epoch) {
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, batches = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& batch : loader) {
      // With torch::data the batch is on the CPU; with Conveyor already on `device`.
      torch::Tensor data = batch.data.to(device), target = batch.target.to(device);
      optimizer.zero_grad();
      torch::Tensor output = model->forward(data);
      torch::Tensor loss = torch::nn::functional::cross_entropy(output, target);
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
      correct += output.argmax(1).eq(target).sum().item<int64_t>();
      seen += target.size(0);
      ++batches;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("epoch %d: loss %.4f  accuracy %.3f  %lld batches  %.0f samples/s\n", epoch,
                loss_sum / static_cast<double>(batches),
                static_cast<double>(correct) / static_cast<double>(seen),
                static_cast<long long>(batches), static_cast<double>(seen) / seconds);
  }
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "drop_in: %s needs a value\n", name);
        std::exit(2);
      }
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (arg == "--torch") {
      s.use_torch = true;
    } else if (arg == "--epochs") {
      s.epochs = static_cast<int>(value("--epochs"));
    } else if (arg == "--workers") {
      s.workers = static_cast<size_t>(value("--workers"));
    } else if (arg == "--batch") {
      s.batch = static_cast<size_t>(value("--batch"));
    } else {
      std::fprintf(stderr, "usage: drop_in [--torch] [--epochs N] [--workers N] [--batch N]\n");
      std::exit(2);
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse(argc, argv);
  const torch::Device device = conveyor::cuda_available() ? torch::kCUDA : torch::kCPU;
  auto dataset = Quadrants(4096)
                     .map(torch::data::transforms::Normalize<>(0.25, 0.5))
                     .map(torch::data::transforms::Stack<>());
  if (settings.use_torch) {
    auto loader = torch::data::make_data_loader(
        std::move(dataset),
        torch::data::DataLoaderOptions(settings.batch).workers(settings.workers));
    std::printf("torch::data loader, training on %s\n", device.str().c_str());
    train(*loader, device, settings);
  } else {
    auto loader =
        conveyor::make_data_loader(std::move(dataset), conveyor::DataLoaderOptions(settings.batch)
                                                           .workers(settings.workers)
                                                           .pin_memory(true)
                                                           .device(device));
    std::printf("conveyor loader, training on %s\n", device.str().c_str());
    train(*loader, device, settings);
    std::printf("%s\n", loader->mode().c_str());
    const conveyor::LoaderStats stats = loader->stats();
    std::printf("%llu batches, %llu samples; workers filled for %.3f s, the loop waited %.3f s\n",
                static_cast<unsigned long long>(stats.batches),
                static_cast<unsigned long long>(stats.samples), stats.fill_seconds,
                stats.wait_seconds);
  }
  return 0;
}
