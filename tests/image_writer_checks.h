// tests/image_writer_checks.h: what the codec tests (png_test, webp_test) check of every file of
// their corpora against the plain reference of png_reference.h: the rows ImageWriter writes under
// a random crop, a centre crop and a whole-image resize equal expected_row's, and a decoder's
// regions equal the same region of the reference's full decode; and the error a file gives.
//
// The checks are gtest assertions in functions: a failure is fatal to the function, so a test
// calls them inside ASSERT_NO_FATAL_FAILURE to stop at the first difference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "conveyor/datasets.h"
#include "png_reference.h"

namespace conveyor::testing {

// The row (side x side x 3 bytes) that `writer` writes from `file` for `ctx`.
inline std::vector<uint8_t> written(ImageWriter& writer, const std::vector<uint8_t>& file,
                                    const SampleContext& ctx) {
  const int side = writer.transform().size;
  std::vector<uint8_t> row(static_cast<size_t>(side) * side * 3);
  writer.write(file.data(), file.size(), ctx, reinterpret_cast<std::byte*>(row.data()));
  return row;
}

// What writing `file` throws; "" where it writes.
inline std::string error_of(ImageWriter& writer, const std::vector<uint8_t>& file) {
  try {
    written(writer, file, SampleContext{});
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// One writer for each transform a corpus is checked under: RandomResizedCrop to 7 with a flip half
// the time, eval's centre crop (12 of 14), and the whole image resized to 16. A test keeps them
// for its whole corpus, so that decoders are reused across files and formats.
inline std::vector<ImageWriter> checked_writers() {
  ImageTransform train = ImageTransform::train(7);
  train.flip_probability = 0.5;
  ImageTransform eval = ImageTransform::eval(12, 14);
  ImageTransform whole = ImageTransform::train(16);
  whole.mode = ImageTransform::Mode::kResize;
  std::vector<ImageWriter> writers;
  for (const ImageTransform& t : {train, eval, whole}) writers.emplace_back(t);
  return writers;
}

// How many rows expect_rows_match compared, and how many of them were flipped.
struct RowCounts {
  size_t compared = 0;
  size_t flipped = 0;
};

// Under every writer, for the indices 0 .. count - 1 (seed first_seed + index, epoch index % 2):
// the row written from `file` equals expected_row(ref); a failure names `what` and the index.
// Adds the rows compared and those flipped to `counts`.
inline void expect_rows_match(std::vector<ImageWriter>& writers, const std::vector<uint8_t>& file,
                              const Reference& ref, size_t count, uint64_t first_seed,
                              const std::string& what, RowCounts& counts) {
  for (ImageWriter& writer : writers) {
    for (size_t index = 0; index < count; ++index) {
      const SampleContext ctx{0, index, first_seed + index, index % 2};
      ASSERT_EQ(written(writer, file, ctx), expected_row(ref, writer.transform(), ctx))
          << what << ", index " << index;
      ++counts.compared;
      counts.flipped +=
          choose_crop(writer.transform(), ref.width, ref.height, ctx.seed, ctx.epoch, ctx.index)
              .flip;
    }
  }
}

// `image`, a decoder's region (x, y) w x h at full size, is RGB w x h and equals that region of
// `ref`'s full decode; a failure names `what` and the region.
inline void expect_region_of(const Reference& ref, const DecodedImage& image, int x, int y, int w,
                             int h, const std::string& what) {
  ASSERT_EQ(image.width, w);
  ASSERT_EQ(image.height, h);
  ASSERT_EQ(image.channels, 3);
  for (int r = 0; r < h; ++r) {
    for (int c = 0; c < w; ++c) {
      for (int ch = 0; ch < 3; ++ch) {
        ASSERT_EQ(image.pixels[r * image.stride + c * 3 + ch],
                  ref.rgbx[((static_cast<size_t>(y) + r) * ref.width + x + c) * 4 + ch])
            << what << " region " << x << "," << y << " " << w << "x" << h;
      }
    }
  }
}

}  // namespace conveyor::testing
