// The mask field (conveyor/fields.h): a segmentation mask that follows an image field's plan
// (conveyor/image_plan.h). The mask is a gray or palette PNG read as its samples (the codec's
// samples mode: palette indices, never colours), cut with the image's view box, resized
// nearest-neighbour to the view's output size and mirrored with it, so no class id is ever
// blended with its neighbour and no value appears that the mask lacks.
//
// Nearest-neighbour by pixel centres, in exact integer arithmetic: output column i of a box of w
// source columns resized to S takes source column floor((i + 0.5) * w / S) = (2i + 1) * w / (2S)
// (PIL's NEAREST and torch's "nearest-exact"; the same centres as the image's bilinear resize, so
// the mask stays on its image's pixels). Rows likewise. A flip mirrors the output's columns.
//
// A mask that follows a group of views ([V,S,S]) reads the bounding box of the views' boxes
// once and resamples each view from its own box within it, so each view is the mask it would
// be alone.
#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/image_codec.h"
#include "fields/field_writer.h"

namespace conveyor::detail {

namespace {

class MaskFieldWriter final : public FieldWriter {
 public:
  MaskFieldWriter(std::string name, const Field& field, const FieldSpec& spec)
      : name_(std::move(name)),
        follows_(field.follows),
        dtype_(spec.dtype),
        side_(static_cast<int>(spec.sample_shape.back())),
        views_(spec.sample_shape.size() == 3 ? static_cast<size_t>(spec.sample_shape[0]) : 1) {}

  void write(const Member&, const SampleContext&, std::byte*) override {
    throw std::logic_error("conveyor: " + field_label(name_) + " written without its image's plan");
  }

  void write_following(const Member& member, const SampleContext&, const ImagePlan& plan,
                       std::byte* const* rows) override {
    if (member.encoding != MemberEncoding::kFile) {
      throw_unreadable(name_, member, "a mask file (a gray or palette PNG)");
    }
    const ImageFormat format = detect_format(member.data, member.size);
    if (format != ImageFormat::kPng) {
      throw std::runtime_error(field_label(name_) + ": a mask is a gray or palette PNG, not " +
                               (format == ImageFormat::kUnknown
                                    ? std::string("bytes of no known image format")
                                    : std::string("a ") + format_name(format) + " image"));
    }
    if (!decoder_) {
      DecodeOptions options;  // the samples mode reads no option but the limits
      decoder_ = make_image_decoder(ImageFormat::kPng, DecodeLimits{}, options);
    }
    if (plan.views.size() != views_) {
      throw std::logic_error("conveyor: " + field_label(name_) + " follows a plan of " +
                             std::to_string(plan.views.size()) + " views, not its " +
                             std::to_string(views_));
    }
    // The bounding box of the views' boxes, read once.
    int x0 = plan.width, y0 = plan.height, x1 = 0, y1 = 0;
    for (const ViewPlan& view : plan.views) {
      if (view.out_width != side_ || view.out_height != side_) {
        throw std::logic_error("conveyor: " + field_label(name_) + " follows a view of " +
                               std::to_string(view.out_width) + "x" +
                               std::to_string(view.out_height) + ", not " + std::to_string(side_) +
                               "x" + std::to_string(side_));
      }
      x0 = std::min(x0, view.x);
      y0 = std::min(y0, view.y);
      x1 = std::max(x1, view.x + view.width);
      y1 = std::max(y1, view.y + view.height);
    }
    SampleRegion region;
    try {
      const ImageInfo info = decoder_->begin(member.data, member.size);
      if (info.width != plan.width || info.height != plan.height) {
        throw std::runtime_error(
            "the mask is " + std::to_string(info.width) + "x" + std::to_string(info.height) +
            " and its image (field \"" + follows_ + "\") is " + std::to_string(plan.width) + "x" +
            std::to_string(plan.height) + " (upright): they must be the same size");
      }
      if (info.bit_depth == 16 && dtype_ == c10::ScalarType::Byte) {
        throw std::runtime_error("a 16-bit mask needs dtype int16 or int32 (it is declared uint8)");
      }
      region = decoder_->finish_samples(x0, y0, x1 - x0, y1 - y0);
    } catch (const std::logic_error&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(field_label(name_) + ": " + e.what());
    }
    const size_t view_bytes =
        static_cast<size_t>(side_) * static_cast<size_t>(side_) * c10::elementSize(dtype_);
    for (size_t v = 0; v < views_; ++v) {
      const int over = resample(region, plan.views[v], x0, y0, rows[0] + v * view_bytes);
      if (over >= 0) {
        throw std::runtime_error(field_label(name_) + ": the mask holds the id " +
                                 std::to_string(over) +
                                 ", over 32767, which dtype int16 cannot hold: declare int32");
      }
    }
  }

 private:
  // The view's box of `region` (which starts at x0, y0 of the mask) -> side_ x side_ by nearest
  // pixel centres, mirrored if the view is. Returns -1, or an id over 32767 that an int16 row
  // cannot hold (the row is then not used).
  int resample(const SampleRegion& region, const ViewPlan& view, int x0, int y0, std::byte* row) {
    const int64_t s = side_;
    const bool wide = region.bit_depth == 16;
    const int64_t left = view.x - x0;
    columns_.resize(static_cast<size_t>(side_));
    for (int64_t i = 0; i < s; ++i) {
      const int64_t from = left + (2 * i + 1) * view.width / (2 * s);
      columns_[static_cast<size_t>(view.flip ? s - 1 - i : i)] = static_cast<int>(from);
    }
    for (int64_t j = 0; j < s; ++j) {
      const int64_t from_row = view.y - y0 + (2 * j + 1) * view.height / (2 * s);
      const uint8_t* src = region.samples + static_cast<size_t>(from_row) * region.stride;
      if (dtype_ == c10::ScalarType::Byte) {
        auto* dst = reinterpret_cast<uint8_t*>(row) + j * s;
        for (int64_t i = 0; i < s; ++i) dst[i] = src[columns_[static_cast<size_t>(i)]];
        continue;
      }
      if (dtype_ == c10::ScalarType::Short) {
        auto* dst = reinterpret_cast<int16_t*>(row) + j * s;
        int largest = 0;
        for (int64_t i = 0; i < s; ++i) {
          const size_t c = static_cast<size_t>(columns_[static_cast<size_t>(i)]);
          int v = src[c];
          if (wide) {
            uint16_t w;
            std::memcpy(&w, src + 2 * c, sizeof w);
            v = w;
          }
          largest = std::max(largest, v);
          dst[i] = static_cast<int16_t>(v);
        }
        if (largest > 32767) return largest;
        continue;
      }
      auto* dst = reinterpret_cast<int32_t*>(row) + j * s;
      for (int64_t i = 0; i < s; ++i) {
        const size_t c = static_cast<size_t>(columns_[static_cast<size_t>(i)]);
        if (wide) {
          uint16_t v;
          std::memcpy(&v, src + 2 * c, sizeof v);
          dst[i] = v;
        } else {
          dst[i] = src[c];
        }
      }
    }
    return -1;
  }

  std::string name_;
  std::string follows_;
  c10::ScalarType dtype_;
  int side_;
  size_t views_;                           // the views it follows: a group's count, or 1
  std::unique_ptr<ImageDecoder> decoder_;  // PNG's, made on the first mask
  std::vector<int> columns_;               // the source column of each output column
};

}  // namespace

std::unique_ptr<FieldWriter> make_mask_writer(const std::string& name, const Field& field,
                                              const FieldSpec& spec) {
  return std::make_unique<MaskFieldWriter>(name, field, spec);
}

}  // namespace conveyor::detail
