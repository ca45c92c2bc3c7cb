// A user project: find_package(conveyor), link conveyor::conveyor, include <conveyor/conveyor.h>
// (and nothing from LibTorch directly: the drop-in's header brings torch::data). Built by
// tests/install_test.sh as C++17 and as C++20; checks what both loaders deliver.
#include <conveyor/conveyor.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#if __cplusplus != (CONSUMER_CXX_STANDARD == 17 ? 201703L : 202002L)
#error "the consumer was not compiled with the C++ standard it was configured for"
#endif

namespace {

constexpr size_t kSamples = 10;

// Sample i: data float [2] filled with i, target int64 i.
class Numbers : public torch::data::datasets::Dataset<Numbers> {
 public:
  torch::data::Example<> get(size_t index) override {
    return {torch::full({2}, static_cast<double>(index)),
            torch::tensor(static_cast<int64_t>(index))};
  }
  std::optional<size_t> size() const override { return kSamples; }
};

// A user's own SampleSource: sample i is 16 bytes of i and the label i.
class Indices : public conveyor::SampleSource {
 public:
  size_t size() const override { return kSamples; }
  std::vector<conveyor::FieldSpec> fields() const override {
    return {{"data", c10::ScalarType::Byte, {16}}, {"label", c10::ScalarType::Long, {}}};
  }
  void write_sample(const conveyor::SampleContext& ctx, std::byte* const* fields) override {
    std::memset(fields[0], static_cast<int>(ctx.index), 16);
    const auto label = static_cast<int64_t>(ctx.index);
    std::memcpy(fields[1], &label, sizeof label);
  }
};

// True if every index in [0, kSamples) came exactly once.
bool each_once(const std::vector<size_t>& seen, const char* what) {
  std::vector<int> count(kSamples, 0);
  for (size_t i : seen) {
    if (i >= kSamples || ++count[i] != 1) {
      std::printf("%s: index %zu out of range or delivered twice\n", what, i);
      return false;
    }
  }
  if (seen.size() != kSamples) {
    std::printf("%s: %zu of %zu samples delivered\n", what, seen.size(), kSamples);
    return false;
  }
  return true;
}

bool engine() {
  conveyor::LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  conveyor::DataLoader loader(std::make_shared<Indices>(), options);
  std::vector<size_t> seen;
  for (conveyor::Batch& batch : loader) {
    seen.insert(seen.end(), batch.indices.begin(), batch.indices.end());
  }
  std::printf("DataLoader: %s\n", loader.mode().c_str());
  return each_once(seen, "DataLoader");
}

bool drop_in() {
  auto loader = conveyor::make_data_loader(Numbers().map(torch::data::transforms::Stack<>()),
                                           conveyor::DataLoaderOptions(4).workers(2));
  std::vector<size_t> seen;
  for (auto& batch : *loader) {
    for (int64_t r = 0; r < batch.data.size(0); ++r) {
      const auto target = batch.target[r].item<int64_t>();
      if (batch.data[r][0].item<float>() != static_cast<float>(target)) {
        std::printf("drop-in: row of sample %lld holds another sample's data\n",
                    static_cast<long long>(target));
        return false;
      }
      seen.push_back(static_cast<size_t>(target));
    }
  }
  return each_once(seen, "drop-in");
}

}  // namespace

int main() {
  const bool ok = engine() && drop_in();
  std::printf("C++%d consumer: %s\n", CONSUMER_CXX_STANDARD,
              ok ? "both loaders delivered every sample once" : "FAILED");
  return ok ? 0 : 1;
}
