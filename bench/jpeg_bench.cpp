// Google Benchmark suite for the per-image cost of the JPEG pipeline on one thread, with the
// decode ceiling in the same run, on 300 files of the generated photo-like default dataset held in
// memory (no file system, no loader):
//   BM_Ceiling      full-size tjDecompress2 to RGB, what every loader that decodes whole images
//                   pays;
//   BM_DecodeCrop   JpegDecoder's decode of just the RandomResizedCrop box (rows down to its
//                   bottom, its columns, the smallest SIMD DCT scale that covers 224x224);
//   BM_ImageWriter  the whole sample: that decode, then libyuv's resize to 224x224, flip and
//                   split into CHW planes.
// A ratio BM_Ceiling time / BM_ImageWriter time above 1 is how much less work the pipeline does
// per image than a full decode.
// Run: build/bench/jpeg-bench [--benchmark_repetitions=5]
// The dataset is the one conveyor-bench generates (CONVEYOR_CACHE, else ~/.cache/conveyor); this
// generates it when it is missing.
#include <benchmark/benchmark.h>
#include <turbojpeg.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache_dir.h"
#include "conveyor/conveyor.h"

namespace conveyor {
namespace {

constexpr size_t kFiles = 300;

// The first kFiles files of the default dataset, spread over its classes, in memory; loaded
// afresh for each benchmark run (from the page cache after the first).
class JpegFiles : public benchmark::Fixture {
 public:
  void SetUp(const benchmark::State&) override {
    GeneratorOptions g;
    g.images_per_class = 150;  // conveyor-bench's default dataset: 1,500 images
    const std::string root = bench::default_dataset_dir(g.images_per_class);
    generate_image_folder(root, g);  // reuses a complete dataset
    auto source = ImageSource::image_folder(root, ImageTransform::train(224));
    const auto& items = source->items();
    files.clear();
    for (size_t i = 0; i < kFiles && i < items.size(); ++i) {
      files.emplace_back();
      read_file(items[i * items.size() / kFiles].path, files.back());
    }
  }
  void TearDown(const benchmark::State&) override { files.clear(); }

 protected:
  std::vector<std::vector<uint8_t>> files;
};

BENCHMARK_DEFINE_F(JpegFiles, Ceiling)(benchmark::State& state) {
  const auto& all = files;
  tjhandle handle = tjInitDecompress();
  std::vector<uint8_t> pixels;
  size_t i = 0;
  for (auto _ : state) {
    const auto& f = all[i++ % all.size()];
    int width = 0, height = 0, sub = 0, cs = 0;
    if (tjDecompressHeader3(handle, f.data(), f.size(), &width, &height, &sub, &cs) != 0 ||
        (pixels.resize(static_cast<size_t>(width) * height * 3),
         tjDecompress2(handle, f.data(), f.size(), pixels.data(), width, 0, height, TJPF_RGB, 0)) !=
            0) {
      state.SkipWithError(tjGetErrorStr2(handle));
      break;
    }
    benchmark::DoNotOptimize(pixels.data());
  }
  tjDestroy(handle);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_REGISTER_F(JpegFiles, Ceiling)->MinTime(2.0);

BENCHMARK_DEFINE_F(JpegFiles, DecodeCrop)(benchmark::State& state) {
  const auto& all = files;
  const ImageTransform transform = ImageTransform::train(224);
  DecodeOptions o;  // as ImageWriter decodes
  o.channels = 4;
  o.fast_upsampling = true;
  JpegDecoder decoder(DecodeLimits{}, o);
  size_t i = 0;
  for (auto _ : state) {
    const size_t k = i++;
    const auto& f = all[k % all.size()];
    const JpegHeader h = decoder.begin(f.data(), f.size());
    const CropBox b = choose_crop(transform, h.width, h.height, 0, k / all.size(), k % all.size());
    benchmark::DoNotOptimize(decoder.finish_region(b.x, b.y, b.width, b.height, 224, 224).pixels);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_REGISTER_F(JpegFiles, DecodeCrop)->MinTime(2.0);

BENCHMARK_DEFINE_F(JpegFiles, ImageWriter)(benchmark::State& state) {
  const auto& all = files;
  ImageWriter writer(ImageTransform::train(224));
  std::vector<std::byte> out(3 * 224 * 224);
  size_t i = 0;
  for (auto _ : state) {
    const size_t k = i++;
    const auto& f = all[k % all.size()];
    SampleContext ctx{0, k % all.size(), 0, k / all.size()};
    writer.write(f.data(), f.size(), ctx, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_REGISTER_F(JpegFiles, ImageWriter)->MinTime(2.0);

}  // namespace
}  // namespace conveyor

BENCHMARK_MAIN();
