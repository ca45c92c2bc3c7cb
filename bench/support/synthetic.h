// bench/support/synthetic.h: synthetic data for the benchmarks, the tests, the examples and the
// Python package's helpers (library conveyor_synthetic; not installed, not in conveyor::conveyor).
//
// What it is for: datasets that behave like real ones where it matters (photo-like JPEGs decode
// at the speed of photos), and a source whose bytes are known, for measuring and checking the
// engine without decoding. Guarantees: everything here is a pure function of its options and
// seed, on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "conveyor/datasets.h"

namespace conveyor {

// The photo-like synthetic dataset: an ImageFolder tree of JPEGs about 500x375 (some portrait and
// other sizes) with texture, edges and sensor-like noise, so that they decode at the speed of
// real photos (ImageNet averages about 110 kB). Deterministic in `seed`.
struct GeneratorOptions {
  size_t classes = 10;
  size_t images_per_class = 100;
  int quality = 90;
  uint64_t seed = 1;
  size_t threads = 0;  // 0: all cores
  // ImageNet-like mix of JPEG kinds instead of only baseline 4:2:0 YCbCr: of every 25 files
  // (by index, so any 25 consecutive ones hold each kind) one is gray, one CMYK with the Adobe
  // marker (inverted), one plain CMYK, one YCCK, two progressive 4:2:0 and one baseline 4:4:4.
  // The pixels are the same photos; the stamp differs, so use another root than the default's.
  bool mixed = false;
};
struct GeneratedDataset {
  std::filesystem::path root;
  size_t images = 0;
  uint64_t bytes = 0;
  bool reused = false;  // true when a complete dataset was already there
};
// Writes the dataset under `root` unless a complete one (with a matching stamp) is already there.
GeneratedDataset generate_image_folder(const std::filesystem::path& root,
                                       const GeneratorOptions& options);
// One photo-like JPEG, width x height, deterministic in `seed`.
std::vector<uint8_t> make_photo_jpeg(int width, int height, uint64_t seed, int quality = 90);
// A one-pixel grid, width x height (red: odd columns, green: odd rows, blue: odd 2 x 2 blocks) at
// quality 100 with 4:4:4 sampling: read one pixel off in either direction, or both, every pixel
// changes (the GPU decode tests' check of where a crop's region is read).
std::vector<uint8_t> make_grid_jpeg(int width, int height);

// A source of fixed-size fields filled with a deterministic pattern: a memcpy-sized "image" of
// `sample_bytes` bytes and the index as an int64 "label". With sample_bytes == 0 the only field is
// the label, for measuring the engine's own overhead.
class PatternSource : public SampleSource {
 public:
  explicit PatternSource(size_t size, size_t sample_bytes = 3 * 224 * 224);
  size_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override;
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override;
  // The byte sample `index` holds at offset `offset` of its image field.
  static uint8_t pattern_byte(size_t index, size_t offset);

 private:
  size_t size_;
  size_t sample_bytes_;
  std::vector<uint8_t> pattern_;
};

}  // namespace conveyor
