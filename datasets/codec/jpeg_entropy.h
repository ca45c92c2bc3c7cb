// datasets/codec/jpeg_entropy.h (build-only): Conveyor's own entropy decoder for baseline JPEG
// scans (issue 35, step 2). JpegDecoder runs it in place of libjpeg-turbo's decode_mcu under
// DecodeOptions::own_entropy_decoder (jpeg_column_discard.h).
//
// What it is for: decoding the Huffman-coded coefficients of a sequential 8-bit JPEG faster than
// libjpeg-turbo does, and starting that decoding at any MCU whose state was saved (the per-file
// index of issue 35, step 3). libjpeg-turbo parses the headers; this decodes only the scan.
//
// Scope: 8-bit sequential Huffman (baseline or extended), one scan holding every component
// (interleaved, or a one-component file), any sampling factors whose MCU has at most 10 blocks
// (4:2:0, 4:2:2, 4:4:4, 4:4:0, 4:1:1, gray), with or without restart markers. Anything else is
// refused by start(): progressive, arithmetic-coded, 12-bit, lossless, multi-scan files, a scan
// whose tables are missing or invalid, a scan that does not end at EOI, fill bytes before a stuffed
// 0xFF (0xFF 0xFF 0x00, where libjpeg-turbo's output depends on its path).
//
// Speed design: the scan is copied once with its byte stuffing removed (0xFF00 -> 0xFF, fill
// bytes dropped) and its restart markers noted as segment offsets, so that the bit reader's refill
// is one branchless 64-bit load; short codes are looked up in one table whose entries also hold
// the run and the coefficient's value when code and value bits fit (kLookupBits); DC and AC are
// decoded by separate loops; skip_mcu is a variant that only advances.
//
// Guarantees: decode_mcu stores exactly what libjpeg-turbo's decode_mcu (jdhuff.c) stores for a
// file libjpeg decodes without a warning, or reports a refusal. Any anomaly (a code that is in no
// table, data running out of its segment, a missing or out-of-sequence restart marker, a whole
// byte or more left unread in a restart segment, which libjpeg reports as extraneous data) makes
// the call return false, never undefined behaviour; after a refusal the decoder refuses until the
// next start(). Reads nothing outside the copy it made.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

namespace conveyor::detail {

// A Huffman table prepared for decoding (one per DHT table the scan uses).
struct HuffmanLookup {
  // Codes up to this many bits are found with one look-up of the next kLookupBits bits.
  static constexpr int kLookupBits = 10;
  // Entry layout: bits 0..4 the bits to consume (0: the code is longer than kLookupBits), bit 5
  // set when those bits include the value bits (the entry is complete), bits 8..15 the symbol
  // (run << 4 | size), bits 16..31 the value (signed) of a complete entry.
  static constexpr uint32_t kComplete = 1u << 5;
  std::array<int32_t, 1 << kLookupBits> entries{};
  // Canonical decoding of the longer codes: a code of length l is valid when it is at most
  // max_code[l]; its symbol is symbols[code + value_offset[l]]. max_code[l] is -1 without codes.
  std::array<int32_t, 18> max_code{};
  std::array<int32_t, 17> value_offset{};
  std::array<uint8_t, 256> symbols{};

  // Prepares `table` as libjpeg's jpeg_make_d_derived_tbl does; false (refused) for a table
  // libjpeg rejects (more than 256 symbols, codes that overflow their length, a DC symbol above
  // 15).
  bool build(const JHUFF_TBL& table, bool is_dc);
};

// The MCU layout of the scan, as libjpeg's per_scan_setup computes it.
struct ScanLayout {
  static constexpr int kMaxBlocksInMcu = 10;  // D_MAX_BLOCKS_IN_MCU
  int components = 0;                         // in the scan (== in the file)
  int blocks_in_mcu = 0;
  uint32_t mcus_per_row = 0;
  uint32_t mcu_rows = 0;
  uint32_t restart_interval = 0;  // MCUs per restart segment; 0: no restart markers
  // For each block of an MCU, in order: its component's index in the scan.
  std::array<uint8_t, kMaxBlocksInMcu> block_component{};
  // Per scan component: the MCU's blocks of it across and down (1 x 1 for a one-component scan).
  std::array<int, 4> mcu_width{}, mcu_height{};

  uint64_t total_mcus() const { return static_cast<uint64_t>(mcus_per_row) * mcu_rows; }
};

// Where the decoder stands before an MCU: enough to start there again. The bit buffer is not
// part of it: it is a pure function of the bit position over the de-stuffed copy, reloaded by one
// 64-bit load when the state is restored.
struct EntropyState {
  uint64_t bit_position = 0;              // bits consumed from the de-stuffed scan
  uint64_t next_mcu = 0;                  // the MCU decoded next, in raster order
  std::array<int32_t, 4> dc_predictor{};  // per scan component
};

// Decodes one baseline scan's MCUs, in order or from saved states. Reusable across images.
class HuffmanScanDecoder {
 public:
  // Takes the tables and the layout from `cinfo` after jpeg_read_header (and optionally
  // jpeg_start_decompress, which reads no scan data for a one-scan file) and copies the scan
  // from cinfo->src's buffer, which must hold the rest of the file (a memory source, as
  // jpeg_mem_src's). Returns false (refused) for a file outside the scope above; cinfo is not
  // changed.
  bool start(j_decompress_ptr cinfo);

  const ScanLayout& layout() const { return layout_; }
  bool refused() const { return refused_; }
  // Every MCU of the scan has been decoded or skipped.
  bool finished() const { return mcu_ == layout_.total_mcus(); }
  // The MCU decoded or skipped next, in raster order.
  uint64_t next_mcu() const { return mcu_; }
  // The input bytes from the scan's first byte to its EOI marker (the marker's first 0xFF):
  // where libjpeg's source must stand after the scan for its marker reader to meet EOI (valid
  // after a successful start()).
  size_t input_bytes() const { return input_bytes_; }
  // Where the decoder stands (valid while not refused).
  EntropyState state() const;
  // Continues from a state this decoder saved for the same scan; false (and refused) for a state
  // that does not fit the scan.
  bool restore(const EntropyState& state);

  // Decodes the next MCU into blocks[0..blocks_in_mcu), which the caller zeroed (as libjpeg's
  // decode_mcu requires). False: refused.
  bool decode_mcu(JBLOCKROW* blocks);
  // Parses the next MCU without storing it (the DC predictors and the position advance).
  bool skip_mcu();

 private:
  template <bool kStore>
  bool next_mcu(JBLOCKROW* blocks);
  bool enter_segment(uint64_t segment);
  bool refuse() {
    refused_ = true;
    return false;
  }

  ScanLayout layout_;
  std::array<HuffmanLookup, 4> dc_tables_, ac_tables_;
  // Per block of the MCU: its tables' numbers (indices, not pointers: the decoder may be copied).
  std::array<uint8_t, ScanLayout::kMaxBlocksInMcu> block_dc_{}, block_ac_{};
  // The de-stuffed scan, followed by zeros so that a refill may read past the end.
  std::vector<uint8_t> scan_;
  std::vector<size_t> segment_start_, segment_end_;  // byte offsets in scan_, per restart segment
  size_t input_bytes_ = 0;                           // of the scan in the file, up to EOI
  // The bit reader: `bits` valid bits at the top of `buffer`; `next_byte` is the next to load.
  uint64_t buffer_ = 0;
  int bits_ = 0;
  size_t next_byte_ = 0;
  uint64_t segment_end_bits_ = 0;  // of the current segment
  uint64_t mcu_ = 0;
  std::array<int32_t, 4> dc_predictor_{};
  bool scan_ready_ = false;  // the last start() succeeded: the copy and its segments are whole
  bool refused_ = true;
};

}  // namespace conveyor::detail
