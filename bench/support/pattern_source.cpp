// PatternSource (synthetic.h): fields filled with a pattern, for the engine's own costs.
#include <cstring>
#include <vector>

#include "synthetic.h"

namespace conveyor {

PatternSource::PatternSource(size_t size, size_t sample_bytes)
    : size_(size), sample_bytes_(sample_bytes), pattern_(sample_bytes + 251) {
  for (size_t i = 0; i < pattern_.size(); ++i) pattern_[i] = static_cast<uint8_t>(i % 251);
}

std::vector<FieldSpec> PatternSource::fields() const {
  std::vector<FieldSpec> f;
  if (sample_bytes_ > 0) {
    f.push_back({"image", c10::ScalarType::Byte, {static_cast<int64_t>(sample_bytes_)}});
  }
  f.push_back({"label", c10::ScalarType::Long, {}});
  return f;
}

void PatternSource::write_sample(const SampleContext& ctx, std::byte* const* fields) {
  size_t f = 0;
  if (sample_bytes_ > 0) {
    std::memcpy(fields[f++], pattern_.data() + ctx.index % 251, sample_bytes_);
  }
  const auto label = static_cast<int64_t>(ctx.index);
  std::memcpy(fields[f], &label, sizeof label);
}

uint8_t PatternSource::pattern_byte(size_t index, size_t offset) {
  return static_cast<uint8_t>((offset + index % 251) % 251);
}

}  // namespace conveyor
