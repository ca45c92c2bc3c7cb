// The image field (conveyor/fields.h): a JPEG, PNG or WebP member decoded and transformed by
// ImageWriter into its output's channels and dtype (ImageOutput).
#include <memory>
#include <stdexcept>
#include <string>

#include "fields/field_writer.h"

namespace conveyor::detail {

namespace {

class ImageFieldWriter final : public FieldWriter {
 public:
  ImageFieldWriter(std::string name, const ImageTransform& transform, const ImageOutput& output)
      : name_(std::move(name)), writer_(transform, output) {}

  void write(const Member& member, const SampleContext& ctx, std::byte* row) override {
    if (member.encoding != MemberEncoding::kFile) {
      throw_unreadable(name_, member, "an image file (decoded pixels are an array field's)");
    }
    writer_.write(member.data, member.size, ctx, row);
  }

  void write_rows(const Member& member, const SampleContext& ctx, std::byte* const* rows) override {
    if (member.encoding != MemberEncoding::kFile) {
      throw_unreadable(name_, member, "an image file (decoded pixels are an array field's)");
    }
    writer_.write_groups(member.data, member.size, ctx, rows);
  }

  const ImagePlan* published_plan() const override { return &writer_.last_plan(); }

  Timing last_timing() const override {
    const ImageWriter::Timing t = writer_.last_timing();
    return {static_cast<uint64_t>(t.decode.count()), static_cast<uint64_t>(t.transform.count()),
            writer_.last_scale()};
  }

 private:
  std::string name_;
  ImageWriter writer_;
};

}  // namespace

std::unique_ptr<FieldWriter> make_image_writer(const std::string& name, const Field& field) {
  return std::make_unique<ImageFieldWriter>(name, field.transform, field.output);
}

}  // namespace conveyor::detail
