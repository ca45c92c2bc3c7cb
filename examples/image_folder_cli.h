// The command line and the data loader that the ImageFolder examples (train_images, views_loop)
// share: where the images come from (--data, or a folder --generate writes first), the generated
// folder's size, the loop's batch, workers and epochs, and the loader's options.
//
// What it is for: each example declares its own options between these, so its --help lists them
// in its own order, and reads the folder and makes its loader the same way as the others.
// Requires: CLI11 and conveyor_synthetic (generate_image_folder) linked into the example.
// Guarantees: a usage error prints the problem and exits with status 2, --help exits with 0.
#pragma once

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "conveyor/conveyor.h"
#include "synthetic.h"

namespace conveyor::examples {

// The settings these options fill, with their defaults (tiny, so that an example runs on a CPU
// in seconds).
struct FolderSettings {
  std::string data;       // an ImageFolder (DIR/<class>/<image>.jpg)
  std::string generate;   // or a folder to write first, then read
  size_t classes = 4;     // classes of the generated folder
  size_t per_class = 16;  // images per class of the generated folder
  size_t batch = 16;
  size_t workers = 2;  // decode threads (and the generator's)
  int epochs = 2;
  uint64_t seed = 0;  // the loader's seed
};

// --data and --generate (not both; parse_or_exit requires one), first in --help, whose option
// column it sets to 24 characters. `then` says what the example does with the folder ("train",
// "load").
inline void add_source_options(CLI::App& app, FolderSettings& s, const std::string& then) {
  app.get_formatter()->column_width(24);
  auto* data = app.add_option("--data", s.data, "an ImageFolder (DIR/<class>/<image>.jpg)");
  auto* generate = app.add_option(
      "--generate", s.generate, "first write a small photo-like ImageFolder to DIR, then " + then);
  data->excludes(generate);
}

// --classes and --per-class: the generated folder's size.
inline void add_generator_options(CLI::App& app, FolderSettings& s) {
  app.add_option("--classes", s.classes, "classes of the generated dataset")->capture_default_str();
  app.add_option("--per-class", s.per_class, "images per class of the generated dataset")
      ->capture_default_str();
}

// --batch, --workers and --epochs.
inline void add_loop_options(CLI::App& app, FolderSettings& s) {
  app.add_option("--batch", s.batch, "batch size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", s.workers, "decode threads")->capture_default_str();
  app.add_option("--epochs", s.epochs, "epochs")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

// --seed: the loader's seed.
inline void add_seed_option(CLI::App& app, FolderSettings& s) {
  app.add_option("--seed", s.seed, "the loader's seed")->capture_default_str();
}

// Parses argv into what the options were given; exits 0 after --help and 2 on a usage error
// (including neither or both of --data and --generate).
inline void parse_or_exit(CLI::App& app, int argc, char** argv, const FolderSettings& s) {
  try {
    app.parse(argc, argv);
    if (s.data.empty() == s.generate.empty()) {
      throw CLI::ValidationError("give either --data or --generate");
    }
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
}

// The folder to read: --data, or the one --generate names, written first (or reused where a
// complete one is there) and reported on stdout.
inline std::string image_folder_root(const FolderSettings& s) {
  if (s.generate.empty()) return s.data;
  GeneratorOptions generator;
  generator.classes = s.classes;
  generator.images_per_class = s.per_class;
  generator.threads = s.workers;
  const GeneratedDataset made = generate_image_folder(s.generate, generator);
  std::printf("dataset: %zu images in %s (%s)\n", made.images, made.root.c_str(),
              made.reused ? "reused" : "generated");
  return made.root.string();
}

// The loader's options: the batch, workers and seed given, whole batches only, pinned slots and
// batches delivered on `device`.
inline DataLoaderOptions loader_options(const FolderSettings& s, const torch::Device& device) {
  return DataLoaderOptions(s.batch)
      .workers(s.workers)
      .drop_last(true)
      .pin_memory(true)
      .device(device)
      .seed(s.seed);
}

}  // namespace conveyor::examples
