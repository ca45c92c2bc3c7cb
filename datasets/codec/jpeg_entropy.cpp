// The own baseline entropy decoder (jpeg_entropy.h). Every rule that decides what is stored
// follows libjpeg-turbo's jdhuff.c (decode_mcu_slow, which decode_mcu_fast matches on valid
// data) and jpeg_make_d_derived_tbl; where libjpeg would warn and carry on, this refuses.
#include "codec/jpeg_entropy.h"

#include <cstring>

namespace conveyor::detail {
namespace {

// The zigzag order, with libjpeg's 16 extra entries for a run that overshoots the block: libjpeg
// (jutils.c) stores such a coefficient at position 63, and so does this.
constexpr std::array<uint8_t, 80> kNaturalOrder = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
    40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
    29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

// The padding after the de-stuffed scan: more than one MCU can consume (10 blocks of at most 64
// symbols of at most 31 bits) plus one 8-byte load, since the position is checked after each MCU.
constexpr size_t kPadding = 4096;

// HUFF_EXTEND: the signed value of `size` (1..15) value bits.
inline int32_t extend(uint32_t bits, int size) {
  return bits < (1u << (size - 1)) ? static_cast<int32_t>(bits) - (1 << size) + 1
                                   : static_cast<int32_t>(bits);
}

inline uint64_t load_big_endian_64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_bswap64(v);
}

}  // namespace

bool HuffmanLookup::build(const JHUFF_TBL& table, bool is_dc) {
  // Code lengths and codes in canonical order (jpeg_make_d_derived_tbl).
  std::array<uint8_t, 257> code_size{};
  std::array<uint32_t, 257> code{};
  int count = 0;
  for (int length = 1; length <= 16; ++length) {
    const int n = table.bits[length];
    if (count + n > 256) return false;
    for (int i = 0; i < n; ++i)
      code_size[static_cast<size_t>(count++)] = static_cast<uint8_t>(length);
  }
  code_size[static_cast<size_t>(count)] = 0;
  uint32_t next = 0;
  int size = code_size[0];
  for (int p = 0; code_size[static_cast<size_t>(p)] != 0;) {
    while (code_size[static_cast<size_t>(p)] == size) code[static_cast<size_t>(p++)] = next++;
    if (next >= (1u << size)) return false;  // the codes overflow their length
    next <<= 1;
    ++size;
  }
  int p = 0;
  for (int length = 1; length <= 16; ++length) {
    if (table.bits[length] != 0) {
      value_offset[static_cast<size_t>(length)] =
          p - static_cast<int32_t>(code[static_cast<size_t>(p)]);
      p += table.bits[length];
      max_code[static_cast<size_t>(length)] =
          static_cast<int32_t>(code[static_cast<size_t>(p - 1)]);
    } else {
      value_offset[static_cast<size_t>(length)] = 0;
      max_code[static_cast<size_t>(length)] = -1;
    }
  }
  max_code[17] = 0x7fffffff;
  std::memcpy(symbols.data(), table.huffval, symbols.size());
  if (is_dc) {
    for (int i = 0; i < count; ++i) {
      if (table.huffval[i] > 15) return false;
    }
  }
  // The look-up entries of the codes up to kLookupBits long.
  entries.fill(0);
  for (int i = 0; i < count; ++i) {
    const int length = code_size[static_cast<size_t>(i)];
    if (length > kLookupBits) break;  // canonical order: the rest are longer
    const uint32_t symbol = table.huffval[i];
    const int value_bits = static_cast<int>(symbol & 15);
    const int spare = kLookupBits - length;
    const uint32_t first = code[static_cast<size_t>(i)] << spare;
    for (uint32_t fill = 0; fill < (1u << spare); ++fill) {
      const uint32_t index = first | fill;
      int32_t entry = 0;
      if (length + value_bits <= kLookupBits) {
        int32_t value = 0;
        if (value_bits > 0) {
          value = extend((index >> (spare - value_bits)) & ((1u << value_bits) - 1), value_bits);
        }
        entry = static_cast<int32_t>(static_cast<uint32_t>(length + value_bits) | kComplete |
                                     symbol << 8 | static_cast<uint32_t>(value) << 16);
      } else {
        entry = static_cast<int32_t>(static_cast<uint32_t>(length) | symbol << 8);
      }
      entries[index] = entry;
    }
  }
  return true;
}

bool HuffmanScanDecoder::start(j_decompress_ptr cinfo) {
  refused_ = true;
  scan_ready_ = false;
  layout_ = ScanLayout{};
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8) return false;
  const int components = cinfo->comps_in_scan;
  if (components < 1 || components > 4 || components != cinfo->num_components) return false;
  if (cinfo->Ss != 0 || cinfo->Se != DCTSIZE2 - 1 || cinfo->Ah != 0 || cinfo->Al != 0) return false;
  if (cinfo->src == nullptr || cinfo->src->next_input_byte == nullptr) return false;

  // The MCU layout (libjpeg's per_scan_setup).
  layout_.components = components;
  if (components == 1) {
    const jpeg_component_info* c = cinfo->cur_comp_info[0];
    layout_.mcus_per_row = c->width_in_blocks;
    layout_.mcu_rows = c->height_in_blocks;
    layout_.blocks_in_mcu = 1;
    layout_.mcu_width[0] = layout_.mcu_height[0] = 1;
  } else {
    const long mcu_w = static_cast<long>(cinfo->max_h_samp_factor) * DCTSIZE;
    const long mcu_h = static_cast<long>(cinfo->max_v_samp_factor) * DCTSIZE;
    if (mcu_w <= 0 || mcu_h <= 0) return false;
    layout_.mcus_per_row = static_cast<uint32_t>((cinfo->image_width + mcu_w - 1) / mcu_w);
    layout_.mcu_rows = static_cast<uint32_t>((cinfo->image_height + mcu_h - 1) / mcu_h);
    for (int ci = 0; ci < components; ++ci) {
      const jpeg_component_info* c = cinfo->cur_comp_info[ci];
      const int blocks = c->h_samp_factor * c->v_samp_factor;
      if (c->h_samp_factor < 1 || c->v_samp_factor < 1 ||
          layout_.blocks_in_mcu + blocks > ScanLayout::kMaxBlocksInMcu) {
        return false;
      }
      layout_.mcu_width[static_cast<size_t>(ci)] = c->h_samp_factor;
      layout_.mcu_height[static_cast<size_t>(ci)] = c->v_samp_factor;
      for (int b = 0; b < blocks; ++b) {
        layout_.block_component[static_cast<size_t>(layout_.blocks_in_mcu++)] =
            static_cast<uint8_t>(ci);
      }
    }
  }
  if (layout_.total_mcus() == 0) return false;
  layout_.restart_interval = cinfo->restart_interval;

  // The tables, each built once.
  std::array<bool, 4> dc_built{}, ac_built{};
  for (int ci = 0; ci < components; ++ci) {
    const jpeg_component_info* c = cinfo->cur_comp_info[ci];
    const int dc = c->dc_tbl_no, ac = c->ac_tbl_no;
    if (dc < 0 || dc >= NUM_HUFF_TBLS || ac < 0 || ac >= NUM_HUFF_TBLS) return false;
    const auto d = static_cast<size_t>(dc), a = static_cast<size_t>(ac);
    if (!dc_built[d]) {
      if (cinfo->dc_huff_tbl_ptrs[d] == nullptr ||
          !dc_tables_[d].build(*cinfo->dc_huff_tbl_ptrs[d], true)) {
        return false;
      }
      dc_built[d] = true;
    }
    if (!ac_built[a]) {
      if (cinfo->ac_huff_tbl_ptrs[a] == nullptr ||
          !ac_tables_[a].build(*cinfo->ac_huff_tbl_ptrs[a], false)) {
        return false;
      }
      ac_built[a] = true;
    }
  }
  for (int b = 0; b < layout_.blocks_in_mcu; ++b) {
    const jpeg_component_info* c =
        cinfo->cur_comp_info[layout_.block_component[static_cast<size_t>(b)]];
    block_dc_[static_cast<size_t>(b)] = static_cast<uint8_t>(c->dc_tbl_no);
    block_ac_[static_cast<size_t>(b)] = static_cast<uint8_t>(c->ac_tbl_no);
  }

  // The de-stuffed copy of the scan, up to EOI, its restart segments noted. 0xFF 0x00 is one 0xFF
  // data byte; fill bytes (more 0xFF) may come before a marker only. 0xFF 0xFF .. 0x00, which
  // the standard does not allow, is refused: libjpeg-turbo's output for it depends on its path
  // (decode_mcu_fast takes the second 0xFF for a marker and hands the MCU to decode_mcu_slow,
  // which reads one 0xFF data byte but leaves in the blocks the coefficients of the fast path's
  // try that it does not overwrite; conveyor-entropy-fuzz's finding, 2026-12-04).
  const uint8_t* in = cinfo->src->next_input_byte;
  const size_t n = cinfo->src->bytes_in_buffer;
  scan_.resize(n + kPadding);
  segment_start_.assign(1, 0);
  segment_end_.clear();
  size_t out = 0, i = 0;
  bool ended = false;
  while (i < n) {
    const auto* ff = static_cast<const uint8_t*>(std::memchr(in + i, 0xFF, n - i));
    const size_t run = (ff == nullptr ? n : static_cast<size_t>(ff - in)) - i;
    std::memcpy(scan_.data() + out, in + i, run);
    out += run;
    i += run;
    if (i == n) break;
    ++i;  // the 0xFF
    const size_t first = i;
    while (i < n && in[i] == 0xFF) ++i;
    if (i == n) break;
    const uint8_t marker = in[i++];
    if (marker == 0x00) {
      if (i - 1 != first) return false;  // fill bytes before a stuffed 0xFF
      scan_[out++] = 0xFF;
    } else if (marker >= 0xD0 && marker <= 0xD7) {
      const size_t expected = 0xD0 + (segment_end_.size() % 8);
      if (layout_.restart_interval == 0 || marker != expected) return false;
      segment_end_.push_back(out);
      segment_start_.push_back(out);
    } else {
      ended = marker == 0xD9;  // EOI; any other marker (DNL, another scan) is refused
      input_bytes_ = first - 1;
      break;
    }
  }
  if (!ended) return false;
  segment_end_.push_back(out);
  std::memset(scan_.data() + out, 0, scan_.size() - out);
  const uint64_t segments =
      layout_.restart_interval == 0
          ? 1
          : (layout_.total_mcus() + layout_.restart_interval - 1) / layout_.restart_interval;
  if (segment_start_.size() != segments) return false;

  scan_ready_ = true;
  refused_ = false;
  mcu_ = 0;
  return enter_segment(0);
}

bool HuffmanScanDecoder::enter_segment(uint64_t segment) {
  if (segment >= segment_start_.size()) return refuse();
  next_byte_ = segment_start_[segment];
  buffer_ = 0;
  bits_ = 0;
  segment_end_bits_ = static_cast<uint64_t>(segment_end_[segment]) * 8;
  dc_predictor_.fill(0);
  return true;
}

EntropyState HuffmanScanDecoder::state() const {
  EntropyState s;
  s.bit_position = static_cast<uint64_t>(next_byte_) * 8 - static_cast<uint64_t>(bits_);
  s.next_mcu = mcu_;
  s.dc_predictor = dc_predictor_;
  return s;
}

bool HuffmanScanDecoder::restore(const EntropyState& state) {
  if (!scan_ready_ || state.next_mcu > layout_.total_mcus()) return refuse();
  // The segment that holds the position: the one of the MCU before, whose end a restart leaves.
  const uint64_t interval = layout_.restart_interval;
  const uint64_t segment =
      interval == 0 || state.next_mcu == 0 ? 0 : (state.next_mcu - 1) / interval;
  if (segment >= segment_start_.size()) return refuse();
  const uint64_t start_bits = static_cast<uint64_t>(segment_start_[segment]) * 8;
  const uint64_t end_bits = static_cast<uint64_t>(segment_end_[segment]) * 8;
  if (state.bit_position < start_bits || state.bit_position > end_bits) return refuse();
  refused_ = false;
  mcu_ = state.next_mcu;
  dc_predictor_ = state.dc_predictor;
  segment_end_bits_ = end_bits;
  next_byte_ = static_cast<size_t>(state.bit_position >> 3);
  buffer_ = load_big_endian_64(scan_.data() + next_byte_) << (state.bit_position & 7);
  bits_ = 56 - static_cast<int>(state.bit_position & 7);
  next_byte_ += 7;
  return true;
}

bool HuffmanScanDecoder::decode_mcu(JBLOCKROW* blocks) { return next_mcu<true>(blocks); }

bool HuffmanScanDecoder::skip_mcu() { return next_mcu<false>(nullptr); }

template <bool kStore>
bool HuffmanScanDecoder::next_mcu(JBLOCKROW* blocks) {
  if (refused_ || mcu_ >= layout_.total_mcus()) return refuse();
  const uint64_t interval = layout_.restart_interval;
  if (interval != 0 && mcu_ != 0 && mcu_ % interval == 0) {
    // The segment just decoded may end with fewer than 8 padding bits; libjpeg counts whole bytes
    // left in it as extraneous data (a warning, an error in JpegDecoder), so this refuses them.
    const uint64_t position = static_cast<uint64_t>(next_byte_) * 8 - static_cast<uint64_t>(bits_);
    if (segment_end_bits_ - position >= 8 || !enter_segment(mcu_ / interval)) return refuse();
  }
  // The bit reader in locals: `bits` valid bits at the top of `buffer`. The refill is
  // branchless: one load, and the bytes it completed are counted (56..63 bits valid after it).
  const uint8_t* const scan = scan_.data();
  uint64_t buffer = buffer_;
  int bits = bits_;
  size_t next_byte = next_byte_;
  const auto refill = [&] {
    buffer |= load_big_endian_64(scan + next_byte) >> bits;
    next_byte += static_cast<size_t>(63 - bits) >> 3;
    bits |= 56;
  };
  const auto consume = [&](int n) {
    buffer <<= n;
    bits -= n;
  };
  // The symbol of a code longer than the look-up, or -1 for a code in no table.
  const auto long_code = [&](const HuffmanLookup& table) -> int {
    for (int length = HuffmanLookup::kLookupBits + 1; length <= 16; ++length) {
      const auto code = static_cast<int32_t>(buffer >> (64 - length));
      if (code <= table.max_code[static_cast<size_t>(length)]) {
        const int32_t index = code + table.value_offset[static_cast<size_t>(length)];
        if (index < 0 || index > 255) return -1;
        consume(length);
        return table.symbols[static_cast<size_t>(index)];
      }
    }
    return -1;
  };
  // The value of a symbol's `size` value bits (0 for none).
  const auto value_of = [&](int size) -> int32_t {
    if (size == 0) return 0;
    const auto raw = static_cast<uint32_t>(buffer >> (64 - size));
    consume(size);
    return extend(raw, size);
  };

  bool ok = true;
  for (int b = 0; b < layout_.blocks_in_mcu && ok; ++b) {
    JCOEF* block = kStore ? blocks[b][0] : nullptr;
    // DC: the difference from the component's last DC value.
    refill();
    const HuffmanLookup& dc = dc_tables_[block_dc_[static_cast<size_t>(b)]];
    int32_t entry = dc.entries[buffer >> (64 - HuffmanLookup::kLookupBits)];
    int32_t difference;
    if (entry & HuffmanLookup::kComplete) {
      consume(entry & 31);
      difference = entry >> 16;
    } else {
      int symbol;
      if (entry & 31) {
        consume(entry & 31);
        symbol = (entry >> 8) & 0xFF;
      } else {
        symbol = long_code(dc);
        if (symbol < 0) {
          ok = false;
          break;
        }
      }
      difference = value_of(symbol);
    }
    int32_t& predictor = dc_predictor_[layout_.block_component[static_cast<size_t>(b)]];
    predictor =
        static_cast<int32_t>(static_cast<uint32_t>(predictor) + static_cast<uint32_t>(difference));
    if constexpr (kStore) block[0] = static_cast<JCOEF>(predictor);

    // AC: (run, size) symbols up to the end of the block or an end-of-block symbol.
    const HuffmanLookup& ac = ac_tables_[block_ac_[static_cast<size_t>(b)]];
    for (int k = 1; k < DCTSIZE2;) {
      if (bits < 31) refill();  // one symbol needs at most 16 + 15 bits
      entry = ac.entries[buffer >> (64 - HuffmanLookup::kLookupBits)];
      int symbol;
      int32_t value;
      if (entry & HuffmanLookup::kComplete) {
        consume(entry & 31);
        symbol = (entry >> 8) & 0xFF;
        value = entry >> 16;
      } else {
        if (entry & 31) {
          consume(entry & 31);
          symbol = (entry >> 8) & 0xFF;
        } else {
          symbol = long_code(ac);
          if (symbol < 0) {
            ok = false;
            break;
          }
        }
        value = value_of(symbol & 15);
      }
      const int run = symbol >> 4;
      if (symbol & 15) {
        k += run;
        if constexpr (kStore)
          block[kNaturalOrder[static_cast<size_t>(k)]] = static_cast<JCOEF>(value);
        ++k;
      } else {
        if (run != 15) break;  // end of block (libjpeg reads any run but 15 with size 0 so)
        k += 16;
      }
    }
  }
  buffer_ = buffer;
  bits_ = bits;
  next_byte_ = next_byte;
  // A bad code, or data running past its segment (libjpeg would warn and fill with zeros).
  if (!ok ||
      static_cast<uint64_t>(next_byte) * 8 - static_cast<uint64_t>(bits) > segment_end_bits_) {
    return refuse();
  }
  ++mcu_;
  return true;
}

}  // namespace conveyor::detail
