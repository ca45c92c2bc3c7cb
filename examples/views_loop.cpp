// views_loop: the data loop of self-supervised training with several views of each image
// (issue 33): DINOv2's 2 global and 8 local crops, or SimCLR's 2 views, from an ImageFolder.
//
// Each image is decoded once for all its views (the bounding box of their crops, at the finest
// DCT scale any view needs), and each view is resized and flipped from that decode into its
// group's batch field: "global" [B,2,3,224,224] and "local" [B,8,3,96,96] for DINOv2, "view"
// [B,2,3,224,224] for SimCLR. The loop prints each field's shape once, then images/s per epoch
// (a training step would go where the loop only touches the batch).
//
// Usage:
//   views_loop --data DIR [--recipe dinov2|simclr]   an ImageFolder (DIR/<class>/<image>.jpg)
//   views_loop --generate DIR                         first writes a small photo-like ImageFolder
// Settings: --recipe (dinov2) --classes N (4) --per-class N (16) --global N (224) --local N (96)
//   --batch N (16) --workers N (2) --epochs N (2) --seed N (0)
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "conveyor/conveyor.h"
#include "image_folder_cli.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  conveyor::examples::FolderSettings folder;
  std::string recipe = "dinov2";
  int global = 224;
  int local = 96;
};

// The command line (CLI11, as the other examples): --help lists every option with its default; a
// usage error prints the problem and exits with status 2.
Settings parse(int argc, char** argv) {
  Settings s;
  CLI::App app("views_loop: several views of each image (DINOv2, SimCLR) through Conveyor");
  conveyor::examples::add_source_options(app, s.folder, "load");
  app.add_option("--recipe", s.recipe, "the views: dinov2 (2 global + 8 local) or simclr (2)")
      ->capture_default_str()
      ->check(CLI::IsMember({"dinov2", "simclr"}));
  conveyor::examples::add_generator_options(app, s.folder);
  app.add_option("--global", s.global, "side of a global (or SimCLR) view")
      ->capture_default_str()
      ->check(CLI::Range(8, 4096));
  app.add_option("--local", s.local, "side of a local view (DINOv2)")
      ->capture_default_str()
      ->check(CLI::Range(8, 4096));
  conveyor::examples::add_loop_options(app, s.folder);
  conveyor::examples::add_seed_option(app, s.folder);
  conveyor::examples::parse_or_exit(app, argc, argv, s.folder);
  return s;
}

// torchvision's RandomResizedCrop(size, scale) with a horizontal flip half the time.
conveyor::ImageTransform random_resized_crop(int size, double scale_min, double scale_max) {
  conveyor::ImageTransform t = conveyor::ImageTransform::train(size);
  t.scale_min = scale_min;
  t.scale_max = scale_max;
  return t;
}

// DINOv2's groups (2 global views at area 0.32-1, 8 local at 0.05-0.32), or SimCLR's 2 views.
conveyor::ImageTransform views(const Settings& s) {
  conveyor::ImageTransform t;
  if (s.recipe == "simclr") {
    t.views = {{"view", 2, random_resized_crop(s.global, 0.08, 1.0)}};
  } else {
    t.views = {{"global", 2, random_resized_crop(s.global, 0.32, 1.0)},
               {"local", 8, random_resized_crop(s.local, 0.05, 0.32)}};
  }
  return t;
}

std::string shape_of(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "] " + std::string(c10::toString(t.scalar_type()));
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse(argc, argv);
  const std::string root = conveyor::examples::image_folder_root(settings.folder);

  const torch::Device device = conveyor::cuda_available() ? torch::kCUDA : torch::kCPU;
  auto source = conveyor::ImageSource::image_folder(root, views(settings));
  auto loader = conveyor::make_data_loader(
      std::move(source), conveyor::examples::loader_options(settings.folder, device));
  std::printf("%s views on %s\n", settings.recipe.c_str(), device.str().c_str());

  size_t batches = 0;
  for (int epoch = 0; epoch < settings.folder.epochs; ++epoch) {
    const auto started = Clock::now();
    size_t images = 0;
    double checksum = 0;
    for (auto it = loader->begin(); it != loader->end(); ++it) {
      conveyor::Batch& batch = *it;
      if (batches++ == 0) {
        for (size_t f = 0; f < batch.names.size(); ++f) {
          std::printf("  %s: %s\n", batch.names[f].c_str(), shape_of(batch.fields[f]).c_str());
        }
      }
      // A training step goes here; the loop reads one value of each view group so that the
      // batch is used.
      for (size_t f = 0; f + 1 < batch.fields.size(); ++f) {
        checksum += batch.fields[f].select(1, 0).flatten()[0].item<double>();
      }
      images += batch.size();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    std::printf("epoch %d: %zu images in %.3f s, %.0f images/s (checksum %.0f)\n", epoch, images,
                seconds, static_cast<double>(images) / seconds, checksum);
  }
  std::printf("%s\n", loader->mode().c_str());
  return batches > 0 ? 0 : 1;
}
