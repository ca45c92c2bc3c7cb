// PngScanlines (png_scanlines.h): a non-interlaced PNG's image data read with libdeflate.
#include "codec/png_scanlines.h"

#include <libdeflate.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace conveyor::detail {

namespace {

uint32_t load_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// A chunk's length, type, data and CRC (PNG 1.2, section 5.3): 12 bytes around its data.
constexpr size_t kChunkOverhead = 12;
constexpr size_t kSignatureBytes = 8;
constexpr uint32_t kMaxChunkLength = 0x7fffffffu;  // PNG's bound on a chunk's length
// A buffer over this size, once an image needs under a quarter of it, is given back: one huge
// PNG in a dataset does not pin its size in every worker for the rest of the run.
constexpr size_t kKeptBytes = size_t{64} << 20;

void fit(std::vector<uint8_t>& buffer, size_t bytes) {
  if (buffer.capacity() > kKeptBytes && bytes < buffer.capacity() / 4) {
    std::vector<uint8_t>().swap(buffer);
  }
  buffer.resize(bytes);
}

bool chunk_is(const uint8_t* chunk, const char (&type)[5]) {
  return std::memcmp(chunk + 4, type, 4) == 0;
}

// One row's unfiltering (PNG 1.2, section 6): `cur` holds the filtered bytes, `prev` the row above
// (unfiltered, or zeros), `bpp` the bytes a filter looks back (BPP known at compile time for the
// common layouts, so that the per-byte loops unroll).
template <size_t BPP>
void unfilter_row(uint8_t filter, uint8_t* cur, const uint8_t* prev, size_t n, size_t bpp_rt) {
  const size_t bpp = BPP != 0 ? BPP : bpp_rt;
  switch (filter) {
    case 1:  // Sub
      for (size_t i = bpp; i < n; ++i) cur[i] = static_cast<uint8_t>(cur[i] + cur[i - bpp]);
      break;
    case 2:  // Up
      for (size_t i = 0; i < n; ++i) cur[i] = static_cast<uint8_t>(cur[i] + prev[i]);
      break;
    case 3:  // Average
      for (size_t i = 0; i < bpp && i < n; ++i) {
        cur[i] = static_cast<uint8_t>(cur[i] + (prev[i] >> 1));
      }
      for (size_t i = bpp; i < n; ++i) {
        cur[i] = static_cast<uint8_t>(cur[i] + ((cur[i - bpp] + prev[i]) >> 1));
      }
      break;
    case 4:  // Paeth: the one of left, above and upper-left nearest to left + above - upper-left
      for (size_t i = 0; i < bpp && i < n; ++i) cur[i] = static_cast<uint8_t>(cur[i] + prev[i]);
      for (size_t i = bpp; i < n; ++i) {
        const int a = cur[i - bpp], b = prev[i], c = prev[i - bpp];
        const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
        const int predictor = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
        cur[i] = static_cast<uint8_t>(cur[i] + predictor);
      }
      break;
    default:  // 0, None; the caller refused anything above 4
      break;
  }
}

using UnfilterRow = void (*)(uint8_t, uint8_t*, const uint8_t*, size_t, size_t);

UnfilterRow unfilter_for(size_t bpp) {
  switch (bpp) {
    case 1:
      return unfilter_row<1>;
    case 2:
      return unfilter_row<2>;
    case 3:
      return unfilter_row<3>;
    case 4:
      return unfilter_row<4>;
    default:
      return unfilter_row<0>;
  }
}

}  // namespace

void PngScanlines::DecompressorFree::operator()(libdeflate_decompressor* d) const {
  libdeflate_free_decompressor(d);
}

PngScanlines::PngScanlines() = default;

PngScanlines::~PngScanlines() = default;

const char* PngScanlines::read(const uint8_t* png, size_t size, const PngRowLayout& layout) {
  height_ = 0;
  unfiltered_ = 0;
  if (layout.width == 0 || layout.height == 0 || layout.bits_per_pixel <= 0) {
    return "no rows";
  }
  const uint64_t row_bytes =
      (uint64_t{layout.width} * static_cast<uint64_t>(layout.bits_per_pixel) + 7) / 8;
  const uint64_t total = (row_bytes + 1) * layout.height;
  // The chunks: walked from after the signature; the IDATs' data noted (one IDAT is inflated
  // where it lies, several are joined first).
  const uint8_t* first_idat = nullptr;
  size_t first_idat_size = 0;
  size_t idat_chunks = 0;
  size_t idat_bytes = 0;
  bool idat_ended = false;  // a chunk other than IDAT came after the IDATs
  bool iend = false;
  size_t at = kSignatureBytes;
  while (at + kChunkOverhead <= size) {
    const uint8_t* chunk = png + at;
    const uint32_t length = load_be32(chunk);
    if (length > kMaxChunkLength || length > size - at - kChunkOverhead) {
      return "a chunk runs past the file's end";
    }
    const bool idat = chunk_is(chunk, "IDAT");
    if (idat && idat_ended) return "IDAT chunks are not consecutive";
    if (idat_chunks > 0 && !idat) {
      // After the image data libspng refuses a chunk type that is not four letters, and every
      // critical chunk (an upper-case first letter) but IEND: so does this reader.
      for (int k = 4; k < 8; ++k) {
        const uint8_t letter = static_cast<uint8_t>(chunk[k] & ~0x20);
        if (letter < 'A' || letter > 'Z') return "a chunk type after the image data is not letters";
      }
      if ((chunk[4] & 0x20) == 0 && !chunk_is(chunk, "IEND")) {
        return "a critical chunk after the image data";
      }
    }
    if (idat || idat_chunks > 0) {  // the chunks before the first IDAT were libspng's to check
      const uint32_t crc = libdeflate_crc32(0, chunk + 4, size_t{length} + 4);
      if (crc != load_be32(chunk + 8 + length)) return "a chunk's CRC does not match";
    }
    if (idat) {
      if (idat_chunks++ == 0) {
        first_idat = chunk + 8;
        first_idat_size = length;
      }
      idat_bytes += length;
    } else if (idat_chunks > 0) {
      idat_ended = true;
    }
    at += kChunkOverhead + length;
    if (chunk_is(chunk, "IEND")) {
      iend = true;
      break;
    }
  }
  if (idat_chunks == 0) return "no IDAT chunk";
  if (!iend) return "no IEND chunk";
  const uint8_t* stream = first_idat;
  if (idat_chunks > 1) {
    fit(idat_, idat_bytes);
    size_t filled = 0;
    for (size_t pos = static_cast<size_t>(first_idat - png) - 8; filled < idat_bytes;) {
      const uint32_t length = load_be32(png + pos);
      std::memcpy(idat_.data() + filled, png + pos + 8, length);
      filled += length;
      pos += kChunkOverhead + length;
    }
    stream = idat_.data();
  } else {
    idat_bytes = first_idat_size;
  }
  // begin() refused a file too short for its rows, so `total` is within deflate's 1032:1 of the
  // file's size.
  if (!inflater_) {  // made at the first PNG, not for every decoder that never meets one
    inflater_.reset(libdeflate_alloc_decompressor());
    if (!inflater_) throw std::bad_alloc();
  }
  fit(rows_, total);
  size_t consumed = 0;
  const libdeflate_result result = libdeflate_zlib_decompress_ex(
      inflater_.get(), stream, idat_bytes, rows_.data(), rows_.size(), &consumed, nullptr);
  if (result != LIBDEFLATE_SUCCESS) return "the image data do not inflate to the declared rows";
  if (consumed != idat_bytes) return "data after the image data's zlib stream";
  stride_ = static_cast<size_t>(row_bytes) + 1;
  // libspng reads a row ahead of the one asked for, and so refuses the rows just above a bad
  // filter byte: every row's is checked here, and a file with one goes to libspng, which decodes
  // what it decoded before (the rows of a region well above the damage) or names the damage.
  for (uint64_t r = 0; r < layout.height; ++r) {
    if (rows_[static_cast<size_t>(r) * stride_] > 4) return "a row's filter byte is not 0-4";
  }
  filter_bpp_ = std::max<size_t>(1, static_cast<size_t>(layout.bits_per_pixel) / 8);
  if (zero_.size() < stride_) zero_.assign(stride_, 0);
  height_ = layout.height;
  return nullptr;
}

bool PngScanlines::unfilter_through(uint32_t last) {
  const UnfilterRow unfilter = unfilter_for(filter_bpp_);
  const size_t n = stride_ - 1;
  for (; unfiltered_ <= last && unfiltered_ < height_; ++unfiltered_) {
    uint8_t* line = rows_.data() + unfiltered_ * stride_;
    const uint8_t filter = line[0];
    if (filter > 4) return false;
    const uint8_t* prev = unfiltered_ == 0 ? zero_.data() + 1 : line - stride_ + 1;
    unfilter(filter, line + 1, prev, n, filter_bpp_);
  }
  return true;
}

}  // namespace conveyor::detail
