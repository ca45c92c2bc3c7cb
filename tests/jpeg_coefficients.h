// Test support (issue 35): a JPEG's quantized DCT coefficients two ways, libjpeg-turbo's
// jpeg_read_coefficients and Conveyor's own baseline entropy decoder
// (datasets/codec/jpeg_entropy.h), laid out alike so that they compare block for block; and the
// own decoder resumed from a saved state. Shared by tests/jpeg_entropy_test.cpp and the
// differential fuzz target tests/fuzz/entropy_fuzz.cpp.
#pragma once

#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "codec/jpeg_entropy.h"
#include "codec/libjpeg_errors.h"

namespace conveyor::testing {

// One component's coefficient blocks, as jpeg_read_coefficients lays them out (its width and
// height rounded up to the sampling factors).
struct Plane {
  JDIMENSION width = 0, height = 0;  // in blocks
  std::vector<JCOEF> coefficients;   // DCTSIZE2 per block, in row-major block order
  JBLOCKROW block(size_t index) {
    return reinterpret_cast<JBLOCKROW>(&coefficients[index * DCTSIZE2]);
  }
  bool operator==(const Plane& o) const {
    return width == o.width && height == o.height && coefficients == o.coefficients;
  }
};
using Coefficients = std::vector<Plane>;

inline void size_planes(const jpeg_decompress_struct& cinfo, Coefficients& out) {
  out.assign(static_cast<size_t>(cinfo.num_components), Plane{});
  for (int c = 0; c < cinfo.num_components; ++c) {
    const jpeg_component_info& info = cinfo.comp_info[c];
    auto& p = out[static_cast<size_t>(c)];
    const auto round_up = [](JDIMENSION v, int m) { return (v + m - 1) / m * m; };
    p.width = round_up(info.width_in_blocks, info.h_samp_factor);
    p.height = round_up(info.height_in_blocks, info.v_samp_factor);
    p.coefficients.assign(static_cast<size_t>(p.width) * p.height * DCTSIZE2, 0);
  }
}

inline void ignore_libjpeg_message(j_common_ptr, int) {}

// libjpeg's coefficients, or false when libjpeg fails (an error, or a warning when
// `warnings_fatal`, as Conveyor's decoder treats them) or the header claims more than
// `max_pixels` (a bound on the memory libjpeg takes for a fuzzed header).
inline bool libjpeg_coefficients(const uint8_t* file, size_t size, bool warnings_fatal,
                                 Coefficients& out,
                                 uint64_t max_pixels = std::numeric_limits<uint64_t>::max()) {
  jpeg_decompress_struct cinfo;
  detail::ErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = detail::on_error;
  err.pub.emit_message = warnings_fatal ? detail::on_message : ignore_libjpeg_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, file, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (static_cast<uint64_t>(cinfo.image_width) * cinfo.image_height > max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jvirt_barray_ptr* arrays = jpeg_read_coefficients(&cinfo);
  size_planes(cinfo, out);
  for (int c = 0; c < cinfo.num_components; ++c) {
    auto& p = out[static_cast<size_t>(c)];
    for (JDIMENSION row = 0; row < p.height; ++row) {
      JBLOCKARRAY rows = (*cinfo.mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(&cinfo),
                                                          arrays[c], row, 1, FALSE);
      std::memcpy(p.block(static_cast<size_t>(row) * p.width), rows[0], sizeof(JBLOCK) * p.width);
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// The blocks of MCU `mcu` in `planes`, in the scan's order (libjpeg's MCU_membership).
inline void mcu_blocks(const detail::ScanLayout& l, Coefficients& planes, uint64_t mcu,
                       JBLOCKROW* out) {
  const auto mx = static_cast<JDIMENSION>(mcu % l.mcus_per_row);
  const auto my = static_cast<JDIMENSION>(mcu / l.mcus_per_row);
  int b = 0;
  for (int c = 0; c < l.components; ++c) {
    const int w = l.mcu_width[static_cast<size_t>(c)], h = l.mcu_height[static_cast<size_t>(c)];
    auto& p = planes[static_cast<size_t>(c)];
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const JDIMENSION bx = mx * static_cast<JDIMENSION>(w) + static_cast<JDIMENSION>(x);
        const JDIMENSION by = my * static_cast<JDIMENSION>(h) + static_cast<JDIMENSION>(y);
        if (bx >= p.width || by >= p.height) throw std::logic_error("MCU outside the planes");
        out[b++] = p.block(static_cast<size_t>(by) * p.width + bx);
      }
    }
  }
}

enum class Own { kRefusedAtStart, kRefused, kDecoded, kNoHeader };

// Parses the header with libjpeg and decodes the scan with the own decoder, saving the state
// before every MCU in `states` when given. `decoder` is reused across files.
inline Own own_coefficients(const uint8_t* file, size_t size, detail::HuffmanScanDecoder& decoder,
                            Coefficients& out, std::vector<detail::EntropyState>* states) {
  jpeg_decompress_struct cinfo;
  detail::ErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = detail::on_error;
  err.pub.emit_message = ignore_libjpeg_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return Own::kNoHeader;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, file, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  // No libjpeg call (which could jump) from here on.
  Own result = Own::kDecoded;
  if (!decoder.start(&cinfo)) {
    result = Own::kRefusedAtStart;
  } else {
    size_planes(cinfo, out);
    const auto& l = decoder.layout();
    JBLOCKROW blocks[detail::ScanLayout::kMaxBlocksInMcu];
    if (states != nullptr) states->clear();
    for (uint64_t m = 0; m < l.total_mcus(); ++m) {
      if (states != nullptr) states->push_back(decoder.state());
      mcu_blocks(l, out, m, blocks);
      if (!decoder.decode_mcu(blocks)) {
        result = Own::kRefused;
        break;
      }
    }
  }
  jpeg_destroy_decompress(&cinfo);
  return result;
}

// Restores `decoder` to `state` (saved by own_coefficients before MCU `state.next_mcu`) and
// decodes the rest of the scan into `planes`, whose blocks from there on must be zero; the MCUs m
// with skip(m) are parsed by skip_mcu and stay zero. Returns the MCU at which the decoder refused
// (a refused restore counts as the state's MCU); total_mcus() when it decoded to the end and then
// refused one MCU more, as it must; total_mcus() + 1 when it decoded an MCU past the end.
template <class Skip>
uint64_t resume_coefficients(detail::HuffmanScanDecoder& decoder, const detail::EntropyState& state,
                             Coefficients& planes, Skip&& skip) {
  if (!decoder.restore(state)) return state.next_mcu;
  const auto& l = decoder.layout();
  JBLOCKROW blocks[detail::ScanLayout::kMaxBlocksInMcu];
  for (uint64_t m = state.next_mcu; m < l.total_mcus(); ++m) {
    mcu_blocks(l, planes, m, blocks);
    if (!(skip(m) ? decoder.skip_mcu() : decoder.decode_mcu(blocks))) return m;
  }
  JBLOCK spare[detail::ScanLayout::kMaxBlocksInMcu] = {};
  for (int b = 0; b < detail::ScanLayout::kMaxBlocksInMcu; ++b) blocks[b] = &spare[b];
  return decoder.decode_mcu(blocks) ? l.total_mcus() + 1 : l.total_mcus();
}

// The first MCU from `from` on whose blocks in `resumed` differ from `expected`'s, where the MCUs
// m with skip(m) must be zero instead; total_mcus() when none does.
template <class Skip>
uint64_t first_resumed_difference(const detail::ScanLayout& l, Coefficients& resumed,
                                  Coefficients& expected, uint64_t from, Skip&& skip) {
  JBLOCKROW got[detail::ScanLayout::kMaxBlocksInMcu], want[detail::ScanLayout::kMaxBlocksInMcu];
  const JBLOCK zero{};
  for (uint64_t m = from; m < l.total_mcus(); ++m) {
    mcu_blocks(l, resumed, m, got);
    mcu_blocks(l, expected, m, want);
    const bool skipped = skip(m);
    for (int b = 0; b < l.blocks_in_mcu; ++b) {
      if (std::memcmp(got[b], skipped ? &zero : want[b], sizeof(JBLOCK)) != 0) return m;
    }
  }
  return l.total_mcus();
}

}  // namespace conveyor::testing
