// Test support: a valid progressive JPEG with as many scans as asked, for DecodeLimits::max_scans
// (issue 29: a file of many scans costs a pass over every block per scan).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

namespace conveyor::testing {

// A width x height gray progressive JPEG of exactly `scans` scans (64..694): the DC scan, then each
// of the 63 AC coefficients in a scan of its own, first at a reduced precision and then refined
// bit by bit (successive approximation, at most 10 bits at 8-bit precision), so that every scan is
// one libjpeg's encoder accepts and every decoder reads without a warning.
inline std::vector<uint8_t> progressive_jpeg_with_scans(int width, int height, int scans) {
  constexpr int kMaxRefinements = 10;
  if (scans < 64 || scans > 1 + 63 * (kMaxRefinements + 1)) std::abort();
  std::vector<jpeg_scan_info> script;
  script.push_back({1, {0}, 0, 0, 0, 0});
  int extra = scans - 64;  // refinement scans beyond one scan per coefficient
  for (int k = 1; k <= 63; ++k) {
    const int bits = extra < kMaxRefinements ? extra : kMaxRefinements;
    extra -= bits;
    script.push_back({1, {0}, k, k, 0, bits});
    for (int ah = bits; ah >= 1; --ah) script.push_back({1, {0}, k, k, ah, ah - 1});
  }
  std::vector<uint8_t> gray(static_cast<size_t>(width) * static_cast<size_t>(height));
  for (size_t i = 0; i < gray.size(); ++i) {
    gray[i] = static_cast<uint8_t>(i % static_cast<size_t>(width) * 3 + i * 7919 % 61);
  }
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = 1;
  cinfo.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&cinfo);
  cinfo.scan_info = script.data();
  cinfo.num_scans = static_cast<int>(script.size());
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row =
        gray.data() + static_cast<size_t>(cinfo.next_scanline) * static_cast<size_t>(width);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> file(out, out + size);
  std::free(out);
  return file;
}

}  // namespace conveyor::testing
