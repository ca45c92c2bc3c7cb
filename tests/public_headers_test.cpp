// public_headers_cxx17: the public headers compile as C++17 (this file is built with
// CXX_STANDARD 17 and -Wall -Wextra -Wpedantic -Werror), and the drop-in's templates instantiate
// there: LibTorch asks for C++17, so a drop-in for torch::data must compile wherever it does.
//
// Each public header is named on its own (not only through conveyor.h), so that a header reached
// only through the umbrella would still be checked if the umbrella stopped including it. main()
// runs what it instantiated and exits non-zero if a row is missing or delivered twice.
#include "conveyor/conveyor.h"

#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "conveyor/loader.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"
#include "conveyor/random.h"
#include "conveyor/torch_data.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/data.h>

#if __cplusplus != 201703L
#error "public_headers_test.cpp must be compiled as C++17 (CXX_STANDARD 17)"
#endif

namespace {

constexpr size_t kSamples = 10;

// Sample i: data float [2] filled with i, target int64 i.
class Numbers : public torch::data::datasets::Dataset<Numbers> {
 public:
  torch::data::Example<> get(size_t index) override {
    const auto v = static_cast<double>(index);
    return {torch::full({2}, v), torch::tensor(static_cast<int64_t>(index))};
  }
  std::optional<size_t> size() const override { return kSamples; }
};

// Counts each index once; false if one is missing or came twice.
bool each_once(const std::vector<int64_t>& seen, const char* what) {
  std::vector<int> count(kSamples, 0);
  for (int64_t i : seen) {
    if (i < 0 || static_cast<size_t>(i) >= kSamples) {
      std::fprintf(stderr, "%s: index %lld out of range\n", what, static_cast<long long>(i));
      return false;
    }
    ++count[static_cast<size_t>(i)];
  }
  for (size_t i = 0; i < kSamples; ++i) {
    if (count[i] != 1) {
      std::fprintf(stderr, "%s: sample %zu delivered %d times\n", what, i, count[i]);
      return false;
    }
  }
  return true;
}

// The drop-in, collated path: a per-sample dataset mapped with Stack<>().
bool drop_in() {
  auto loader = conveyor::make_data_loader(Numbers().map(torch::data::transforms::Stack<>()),
                                           conveyor::DataLoaderOptions(4).workers(2));
  std::vector<int64_t> seen;
  for (auto& batch : *loader) {
    for (int64_t r = 0; r < batch.data.size(0); ++r) {
      const int64_t target = batch.target[r].item<int64_t>();
      if (batch.data[r][1].item<float>() != static_cast<float>(target)) {
        std::fprintf(stderr, "drop-in: row %lld holds another sample's data\n",
                     static_cast<long long>(target));
        return false;
      }
      seen.push_back(target);
    }
  }
  return each_once(seen, "drop-in");
}

// conveyor::DataLoader over a SampleSource.
bool engine() {
  conveyor::LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  conveyor::DataLoader loader(std::make_shared<conveyor::PatternSource>(kSamples, 16), options);
  std::vector<int64_t> seen;
  for (conveyor::Batch& batch : loader) {
    for (size_t index : batch.indices) seen.push_back(static_cast<int64_t>(index));
  }
  return each_once(seen, "DataLoader");
}

}  // namespace

int main() {
  // A little of the lower headers too, so that their inline code is compiled here.
  conveyor::SampleRng rng(1, 2, 3);
  const bool rng_ok = rng.uniform(0.0, 1.0) < 1.0;
  const bool ok = drop_in() && engine() && rng_ok;
  std::printf("%s\n", ok ? "public headers: C++17, every row delivered once" : "FAILED");
  return ok ? 0 : 1;
}
