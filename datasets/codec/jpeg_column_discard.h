// datasets/codec/jpeg_column_discard.h (build-only): the discard hook. In the rows of a region,
// libjpeg-turbo decodes every MCU of the row in full (Huffman symbols to stored coefficients) and
// only then leaves the IDCT out for the iMCU columns outside the crop jpeg_crop_scanline set. The
// hook wraps the entropy decoder's decode_mcu so that the MCUs in those columns take libjpeg's
// discard path instead (decode_mcu with a NULL block row, the path jpeg_skip_scanlines uses: the
// symbols are parsed and the DC predictors and bit position advance, nothing is stored). The
// pixels are the same; on photo-like files one decode costs 9% fewer instructions (issue 35).
//
// Requires: libjpeg-turbo's jpegint.h is not installed, so the entropy decoder is opaque.
// EntropyDecoderPrefix declares the only part the hook touches, the first two members of
// `struct jpeg_entropy_decoder`: start_pass and decode_mcu. They are the same, in that order, in
// IJG libjpeg 6b and every libjpeg-turbo from 1.5.0 (the first with the NULL discard path in
// decode_mcu_fast and decode_mcu_slow) to 3.2.0 (read in their jpegint.h and jdhuff.c); 3.0
// added members only after decode_mcu. Tested with 2.1.5 (Debian 12). kEntropyPrefixVerified
// is true only for that range of versions, checked when this is compiled: with any other libjpeg
// the hook is never installed and decoding is libjpeg's own.
//
// Guarantees: installed only for a sequential (baseline or extended) Huffman-coded 8-bit file
// whose one scan holds every component (interleaved, or a one-component file, whose MCU is one
// block) and whose crop leaves at least one MCU column out; never for progressive,
// arithmetic-coded, multi-scan or lossless files. The MCU column is counted by the hook itself
// (libjpeg calls decode_mcu for every MCU of every row, left to right, both when it decodes rows
// and in jpeg_skip_scanlines), and follows the column of a call that libjpeg retries after a
// suspension; restart markers are processed by the wrapped decode_mcu either way. Its state is
// one ColumnDiscard per decoder, found from cinfo->client_data; nothing global.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

// jpeglib.h needs size_t and FILE declared first; it includes jconfig.h, which defines
// LIBJPEG_TURBO_VERSION_NUMBER in libjpeg-turbo.
#include <jpeglib.h>

namespace conveyor::detail {

// The first members of libjpeg's `struct jpeg_entropy_decoder` (jpegint.h), and no more.
struct EntropyDecoderPrefix {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
};

#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && LIBJPEG_TURBO_VERSION_NUMBER >= 1005000 && \
    LIBJPEG_TURBO_VERSION_NUMBER < 3003000
inline constexpr bool kEntropyPrefixVerified = true;
#else
inline constexpr bool kEntropyPrefixVerified = false;
#endif

// The hook of one decoder. Reset before each image; install after jpeg_start_decompress and
// jpeg_crop_scanline, before the first row is read or skipped.
class ColumnDiscard {
 public:
  // Forgets the last image's hook (libjpeg frees its entropy decoder with the image).
  void reset() {
    installed_ = false;
    discarded_ = 0;
  }

  // Wraps cinfo->entropy->decode_mcu when the file and the crop qualify (above); returns whether
  // it did. (crop_x, crop_w) is the crop jpeg_crop_scanline returned, in output pixels.
  // Requires: cinfo->client_data == this.
  bool install(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w);

  bool installed() const { return installed_; }
  // MCUs of the last image whose coefficients the hook discarded instead of storing.
  uint64_t discarded() const { return discarded_; }
  // The iMCU columns kept, [first, last], of `mcus_per_row`; valid while installed.
  JDIMENSION first_column() const { return first_; }
  JDIMENSION last_column() const { return last_; }
  JDIMENSION mcus_per_row() const { return mcus_per_row_; }

 private:
  static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);

  boolean (*original_)(j_decompress_ptr, JBLOCKROW*) = nullptr;
  JDIMENSION mcus_per_row_ = 0;
  JDIMENSION first_ = 0, last_ = 0;  // the MCU columns whose blocks libjpeg transforms
  JDIMENSION column_ = 0;            // of the next decode_mcu call
  uint64_t discarded_ = 0;
  bool installed_ = false;
};

}  // namespace conveyor::detail
