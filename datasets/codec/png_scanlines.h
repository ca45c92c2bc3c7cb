// datasets/codec/png_scanlines.h (build-only): a non-interlaced PNG's scanlines, inflated whole by
// libdeflate and unfiltered in place, for the PNG codec's fast path (png_decode.cpp).
//
// What it is for: libspng inflates through zlib, which on photos was 60-70% of a PNG's decode
// (BENCHMARKS.md, "PNG through libdeflate"); libdeflate inflates the same streams about twice as
// fast, but only whole buffers, which libspng cannot use. So the PNG decoder lets libspng read
// and check the header and every chunk before the image data (IHDR, PLTE, tRNS, ...), then hands
// the file to PngScanlines, which reads the image data itself: the IDAT chunks, their CRCs, the
// zlib stream (its Adler-32 checked by libdeflate), the chunks after it and IEND.
//
// What it guarantees: read() either succeeds, with every byte of every chunk from the first IDAT
// to IEND checked (lengths within the file, CRCs, IDATs consecutive, the stream inflating to
// exactly the rows IHDR declares, with nothing after it, every row's filter byte 0-4, no critical
// chunk but IEND after the image data), or returns a reason and leaves nothing half-done that a
// later call could read. It never throws on the file's content (only std::bad_alloc). A caller
// that gets a reason
// decodes the file with libspng instead, which names the damage: this reader never decides alone
// that a file is corrupt, so it accepts nothing libspng refuses in the image data, and refuses
// (to libspng) everything else it does not understand.
//
// Rows are unfiltered in order, in place: after unfilter_through(r), row(0) .. row(r) are the
// file's samples (SPNG_FMT_RAW: packed below 8 bits, big-endian at 16 bits), each row() bytes
// long and stride() bytes apart, until the next read().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

struct libdeflate_decompressor;

namespace conveyor::detail {

// What IHDR says of the rows: width x height pixels of `bits_per_pixel` (channels x bit depth,
// 1 to 64). Interlaced images are not read here.
struct PngRowLayout {
  uint32_t width = 0;
  uint32_t height = 0;
  int bits_per_pixel = 0;
};

class PngScanlines {
 public:
  PngScanlines();
  ~PngScanlines();
  PngScanlines(const PngScanlines&) = delete;
  PngScanlines& operator=(const PngScanlines&) = delete;

  // Reads the image data of the PNG `png` (`size` bytes, its signature and IHDR already checked
  // by libspng) whose rows are `layout`. Returns null on success, else a static string saying why
  // the file is left to libspng (a chunk past the file's end, a bad CRC, IDATs not consecutive,
  // no IEND, a stream that does not inflate to exactly the declared rows). Buffers are kept across
  // calls (one over 64 MiB is given back when an image needs under a quarter of it); `png` need
  // not outlive the call.
  const char* read(const uint8_t* png, size_t size, const PngRowLayout& layout);

  // Unfilters rows up to `last` (inclusive; rows before it already unfiltered are kept). Returns
  // false only when a row's filter byte is not 0-4, which read() refused already. Requires a
  // successful read() and last < height.
  bool unfilter_through(uint32_t last);

  // Row r's samples (requires r <= the last row unfiltered), stride() bytes after row r - 1's.
  const uint8_t* row(uint32_t r) const { return rows_.data() + r * stride_ + 1; }
  uint8_t* row(uint32_t r) { return rows_.data() + r * stride_ + 1; }
  size_t stride() const { return stride_; }
  size_t row_bytes() const { return stride_ - 1; }

 private:
  struct DecompressorFree {
    void operator()(libdeflate_decompressor* d) const;
  };
  std::unique_ptr<libdeflate_decompressor, DecompressorFree> inflater_;  // made by the first read()
  std::vector<uint8_t> idat_;  // the IDAT chunks' data, joined, when there is more than one
  std::vector<uint8_t> rows_;  // each row's filter byte, then its bytes
  std::vector<uint8_t> zero_;  // the row above the first: zeros
  size_t stride_ = 0;          // row_bytes() + 1
  size_t filter_bpp_ = 1;      // bytes a filter looks back: max(1, bits_per_pixel / 8)
  uint32_t height_ = 0;
  uint32_t unfiltered_ = 0;  // rows unfiltered so far
};

}  // namespace conveyor::detail
