// Where the benchmarks keep the generated photo-like datasets: $CONVEYOR_CACHE, else
// $XDG_CACHE_HOME/conveyor, else ~/.cache/conveyor. Shared by conveyor-bench and jpeg-bench so
// that both use the same files.
#pragma once

#include <cstdlib>
#include <string>

namespace conveyor::bench {

inline std::string cache_dir() {
  if (const char* c = std::getenv("CONVEYOR_CACHE")) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/conveyor";
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/conveyor";
  return "/tmp/conveyor-cache";
}

// The default dataset of conveyor-bench: 10 classes of `per_class` images.
inline std::string default_dataset_dir(size_t per_class) {
  return cache_dir() + "/datasets/photos-v1-10x" + std::to_string(per_class);
}

// conveyor-bench --dataset mixed: the same photos, a few percent of them gray, CMYK, YCCK,
// progressive or 4:4:4 (GeneratorOptions::mixed).
inline std::string mixed_dataset_dir(size_t per_class) {
  return cache_dir() + "/datasets/photos-mixed-v1-10x" + std::to_string(per_class);
}

}  // namespace conveyor::bench
