// conveyor-py-reference: runs the C++ DataLoader over an ImageFolder and writes what it delivers,
// so that the Python tests can check conveyor.DataLoader hands Python the same bytes.
//
//   conveyor-py-reference ROOT OUT WORKERS BATCH SEED EPOCHS CROP SHUFFLE(0|1)
//
// writes OUT.images (every batch's image bytes, in delivery order), OUT.labels (their int64
// labels) and OUT.indices (one line per batch: epoch, then the batch's dataset indices), using
// RandomResizedCrop(CROP) with flip (ImageTransform::train) and a RandomSampler(SEED) when
// SHUFFLE is 1, else the sequential order.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "conveyor/conveyor.h"

int main(int argc, char** argv) {
  if (argc != 9) {
    std::cerr << "usage: conveyor-py-reference ROOT OUT WORKERS BATCH SEED EPOCHS CROP SHUFFLE\n";
    return 2;
  }
  const std::string root = argv[1];
  const std::string out = argv[2];
  conveyor::LoaderOptions options;
  options.workers = std::stoul(argv[3]);
  options.batch_size = std::stoul(argv[4]);
  options.seed = std::stoull(argv[5]);
  const int epochs = std::stoi(argv[6]);
  const int crop = std::stoi(argv[7]);
  const bool shuffle = std::string(argv[8]) == "1";
  try {
    conveyor::DataLoader loader(
        conveyor::ImageSource::image_folder(root, conveyor::ImageTransform::train(crop)), options,
        shuffle ? conveyor::RandomSampler::make(options.seed)
                : conveyor::SequentialSampler::make());
    std::ofstream images(out + ".images", std::ios::binary);
    std::ofstream labels(out + ".labels", std::ios::binary);
    std::ofstream indices(out + ".indices");
    for (int e = 0; e < epochs; ++e) {
      for (conveyor::Batch& batch : loader) {
        const at::Tensor image = batch.images().contiguous();
        const at::Tensor label = batch.labels().contiguous();
        images.write(static_cast<const char*>(image.data_ptr()),
                     static_cast<std::streamsize>(image.nbytes()));
        labels.write(static_cast<const char*>(label.data_ptr()),
                     static_cast<std::streamsize>(label.nbytes()));
        indices << batch.epoch;
        for (size_t index : batch.indices) indices << ' ' << index;
        indices << '\n';
      }
    }
    if (!images || !labels || !indices) {
      std::cerr << "conveyor-py-reference: cannot write " << out << ".*\n";
      return 1;
    }
  } catch (const std::exception& error) {
    std::cerr << "conveyor-py-reference: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
