// tests/png_reference.h: the plain reference a PNG decode is checked against (png_test,
// conveyor-decode-check): libpng's full decode (the other library), expanded to RGB (palette
// looked up, gray replicated, low bit depths scaled, alpha stripped) with 16-bit samples kept and
// then rounded to 8 bits as ImageDecoder states, (v * 255 + 32767) / 65535; then choose_crop's box
// cut from it, libyuv's bilinear resize, the mirror and the layout, as ImageWriter applies them.
#pragma once

#include <png.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <libyuv.h>

#include "conveyor/datasets.h"
#include "png_writer.h"

namespace conveyor::testing {

// libpng's decode as RGBX; false when libpng refuses the file.
struct LibpngRead {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~LibpngRead() { png_destroy_read_struct(&png, &info, nullptr); }
};

struct Source {
  const std::vector<uint8_t>* bytes;
  size_t at;
};

inline void read_from(png_structp png, png_bytep out, png_size_t n) {
  auto* s = static_cast<Source*>(png_get_io_ptr(png));
  if (s->at + n > s->bytes->size()) png_error(png, "read past the end");
  std::memcpy(out, s->bytes->data() + s->at, n);
  s->at += n;
}

inline bool reference_rgbx(const std::vector<uint8_t>& file, int& width, int& height,
                           std::vector<uint8_t>& rgbx, std::vector<uint8_t>& decoded,
                           std::vector<png_bytep>& rows) {
  LibpngRead r;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  r.info = png_create_info_struct(r.png);
  Source source{&file, 0};
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_set_read_fn(r.png, &source, read_from);
  png_read_info(r.png, r.info);
  width = static_cast<int>(png_get_image_width(r.png, r.info));
  height = static_cast<int>(png_get_image_height(r.png, r.info));
  const int depth = png_get_bit_depth(r.png, r.info);
  png_set_expand(r.png);
  png_set_gray_to_rgb(r.png);
  png_set_strip_alpha(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  const size_t row_bytes = png_get_rowbytes(r.png, r.info);
  decoded.resize(row_bytes * static_cast<size_t>(height));
  rows.resize(static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) rows[static_cast<size_t>(y)] = &decoded[row_bytes * y];
  png_read_image(r.png, rows.data());
  rgbx.assign(static_cast<size_t>(width) * height * 4, 255);
  for (size_t p = 0; p < static_cast<size_t>(width) * height; ++p) {
    for (size_t c = 0; c < 3; ++c) {
      if (depth == 16) {
        const unsigned v = decoded[(p * 3 + c) * 2] << 8 | decoded[(p * 3 + c) * 2 + 1];
        rgbx[p * 4 + c] = static_cast<uint8_t>((v * 255 + 32767) / 65535);
      } else {
        rgbx[p * 4 + c] = decoded[p * 3 + c];
      }
    }
  }
  return true;
}

struct Reference {
  int width = 0, height = 0;
  std::vector<uint8_t> rgbx;
};

inline Reference reference_of(const PngFile& f) {
  Reference ref;
  std::vector<uint8_t> decoded;
  std::vector<png_bytep> rows;
  const bool ok = reference_rgbx(f.bytes, ref.width, ref.height, ref.rgbx, decoded, rows);
  if (!ok) throw std::runtime_error("libpng refuses " + describe(f.spec));
  return ref;
}

// What ImageWriter must write for `ref`: choose_crop's box cut from the full decode, resized with
// libyuv's bilinear filter when it is not already the output size, mirrored if flipped, as CHW.
inline std::vector<uint8_t> expected_row(const Reference& ref, const ImageTransform& t,
                                         const SampleContext& ctx) {
  const CropBox box = choose_crop(t, ref.width, ref.height, ctx.seed, ctx.epoch, ctx.index);
  const int side = t.size;
  const uint8_t* pixels = ref.rgbx.data() + (static_cast<size_t>(box.y) * ref.width + box.x) * 4;
  int stride = ref.width * 4;
  std::vector<uint8_t> scaled(static_cast<size_t>(side) * side * 4), mirrored(scaled.size());
  if (box.width != side || box.height != side) {
    libyuv::ARGBScale(pixels, stride, box.width, box.height, scaled.data(), side * 4, side, side,
                      libyuv::kFilterBilinear);
    pixels = scaled.data();
    stride = side * 4;
  }
  if (box.flip) {
    libyuv::ARGBMirror(pixels, stride, mirrored.data(), side * 4, side, side);
    pixels = mirrored.data();
    stride = side * 4;
  }
  std::vector<uint8_t> row(static_cast<size_t>(side) * side * 3);
  const size_t plane = static_cast<size_t>(side) * side;
  for (int y = 0; y < side; ++y) {
    for (int x = 0; x < side; ++x) {
      for (int c = 0; c < 3; ++c) {
        const size_t at = t.layout == ImageLayout::kHWC
                              ? (static_cast<size_t>(y) * side + x) * 3 + c
                              : c * plane + static_cast<size_t>(y) * side + x;
        row[at] = pixels[y * stride + x * 4 + c];
      }
    }
  }
  return row;
}

}  // namespace conveyor::testing
