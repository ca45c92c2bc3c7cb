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
// The same seam runs Conveyor's own entropy decoder (jpeg_entropy.h, issue 35 step 4):
// install_own() replaces decode_mcu with one that fills the MCUs of the kept columns into
// libjpeg's block row with HuffmanScanDecoder::decode_mcu and parses every other MCU with
// skip_mcu (the discarded columns, and the NULL block rows of the rows libjpeg skips).
// libjpeg-turbo keeps the IDCT, the upsampling, the colour conversion, the DCT scaling and the
// crop. start() takes the scan when installed (right after jpeg_start_decompress, libjpeg has read
// no scan data: its source stands at the scan's first byte and its bit buffer is empty); a scan
// it refuses then is left to libjpeg. A refusal later in the scan cannot be handed back to libjpeg,
// whose bit position is lost: the replaced decode_mcu ends the libjpeg call in progress through
// the error manager (fail_with, libjpeg_errors.h) with own_refused() set, and the caller decodes
// the whole image again with the own decoder off. After the scan's last MCU the source is handed
// back standing at the EOI marker, so that libjpeg's marker reader (jpeg_finish_decompress) meets
// it without extraneous bytes.
//
// With an index store (jpeg_entropy_index.h, issue 35 step 3), the own decoder parses lazily: it
// decodes the MCUs libjpeg stores, starting each from the saved state nearest at or before it
// when that is ahead of where the decoder stands, and parses the rest of an MCU row only when the
// next row's start is not saved. It saves its state at every index point it passes, and
// finish_image() adds those to the store. The first decode of a file parses what it parses
// without the index; a later one skips every part of the scan an earlier decode parsed.
//
// Guarantees: installed only for a sequential (baseline or extended) Huffman-coded 8-bit file
// whose one scan holds every component (interleaved, or a one-component file, whose MCU is one
// block) and whose crop leaves at least one MCU column out; never for progressive,
// arithmetic-coded, multi-scan or lossless files. The MCU column is counted by the hook itself
// (libjpeg calls decode_mcu for every MCU of every row, left to right, both when it decodes rows
// and in jpeg_skip_scanlines), and follows the column of a call that libjpeg retries after a
// suspension; restart markers are processed by the wrapped decode_mcu either way (by the own
// decoder itself under install_own). Its state, the own decoder and its copy of the scan
// included, is one ColumnDiscard per decoder, found from cinfo->client_data; nothing global.
// Requires: a one-scan decode whose libjpeg error_exit longjmps (libjpeg_errors.h), as
// JpegDecoder's does: the own decoder's refusal leaves libjpeg through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

// jpeglib.h needs size_t and FILE declared first; it includes jconfig.h, which defines
// LIBJPEG_TURBO_VERSION_NUMBER in libjpeg-turbo.
#include <jpeglib.h>

#include "codec/jpeg_entropy.h"
#include "codec/jpeg_entropy_index.h"

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
    own_ = false;
    own_refused_ = false;
    indexing_ = false;
    index_found_ = false;
    discarded_ = 0;
    parsed_ = 0;
  }

  // Wraps cinfo->entropy->decode_mcu when the file and the crop qualify (above); returns whether
  // it did. (crop_x, crop_w) is the crop jpeg_crop_scanline returned, in output pixels.
  // Requires: cinfo->client_data == this.
  bool install(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w);

  // Replaces cinfo->entropy->decode_mcu with the own decoder when the file qualifies (as above,
  // whatever the crop's width) and HuffmanScanDecoder::start() takes its scan; returns whether it
  // did (false: libjpeg's decode_mcu is untouched, nothing of the scan was read). With
  // `discard_columns`, the MCUs outside the crop's iMCU columns are parsed without being stored,
  // as install() does; without, every MCU of a decoded row is stored. (crop_x, crop_w) is the
  // crop jpeg_crop_scanline returned, or the whole output width when there is none.
  // With `index` (not null), the file's entry is looked up by the hash of [data, data + size),
  // the whole data being decoded, and used and extended as above; finish_image() stores it.
  // Requires: cinfo->client_data == this; cinfo->src holds the rest of the file (jpeg_mem_src);
  // no row read or skipped yet.
  bool install_own(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w,
                   bool discard_columns, EntropyIndexStore* index = nullptr,
                   const uint8_t* data = nullptr, size_t size = 0);
  // The rows asked for were read: adds the states the own decoder saved to the index store.
  // Not called after a failed or refused decode, whose states are never stored.
  void finish_image();

  // Either hook is installed (own() says which).
  bool installed() const { return installed_; }
  // The own decoder replaces libjpeg's decode_mcu for this image.
  bool own() const { return own_; }
  // The own decoder refused the scan after its start: the libjpeg call that was decoding ended
  // through the error manager, and the image must be decoded again without the own decoder.
  bool own_refused() const { return own_refused_; }
  // MCUs of the last image whose coefficients the hook discarded instead of storing (in the rows
  // libjpeg decodes; not the MCUs of rows it skips).
  uint64_t discarded() const { return discarded_; }
  // MCUs of the last image the own decoder parsed (decoded or skipped).
  uint64_t parsed() const { return parsed_; }
  // The last image's file had an entry in the index store.
  bool index_found() const { return index_found_; }
  // The iMCU columns kept, [first, last], of `mcus_per_row`; valid while installed.
  JDIMENSION first_column() const { return first_; }
  JDIMENSION last_column() const { return last_; }
  JDIMENSION mcus_per_row() const { return mcus_per_row_; }

 private:
  // The checks both hooks make: the file is decoded by libjpeg's sequential Huffman decoder MCU
  // row by MCU row, and first_/last_/mcus_per_row_ are the crop's columns.
  bool qualifies(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w);
  static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
  static boolean decode_mcu_own(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
  // Brings the own decoder to MCU `target` (at or after where it stands), from the index's
  // nearest point when that is ahead, saving its state at the points it passes. False: refused.
  bool advance_to(uint64_t target);
  // Saves the own decoder's state when it stands at an index point not yet saved.
  void save_point();
  // The index has the state before MCU `mcu`.
  bool has_point(uint64_t mcu) const;

  HuffmanScanDecoder own_decoder_;  // reused across images: its tables and its copy of the scan
  boolean (*original_)(j_decompress_ptr, JBLOCKROW*) = nullptr;
  JDIMENSION mcus_per_row_ = 0;
  JDIMENSION first_ = 0, last_ = 0;  // the MCU columns whose blocks libjpeg transforms
  JDIMENSION column_ = 0;            // of the next decode_mcu call
  uint64_t discarded_ = 0;
  uint64_t parsed_ = 0;
  // The index: the store, this file's entry (reused across images), the MCU libjpeg asks for
  // next (the own decoder may stand before it).
  EntropyIndexStore* store_ = nullptr;
  FileIndex index_;
  uint64_t mcu_ = 0;
  bool indexing_ = false;
  bool index_found_ = false;
  bool index_changed_ = false;
  bool handed_back_ = false;  // the source was moved to EOI
  bool installed_ = false;
  bool own_ = false;
  bool own_refused_ = false;
};

}  // namespace conveyor::detail
