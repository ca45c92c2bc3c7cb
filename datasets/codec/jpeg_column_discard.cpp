// The discard hook and the own entropy decoder behind it (jpeg_column_discard.h).
#include "codec/jpeg_column_discard.h"

#include "codec/libjpeg_errors.h"

namespace conveyor::detail {

bool ColumnDiscard::qualifies(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w) {
  if constexpr (!kEntropyPrefixVerified) return false;
  if (cinfo->client_data != this || cinfo->entropy == nullptr) return false;
  // Only libjpeg's sequential Huffman decoder (jdhuff.c) has the NULL discard path, and only a
  // single-scan file is decoded MCU row by MCU row as the rows are read (a multi-scan file is
  // read whole into coefficient arrays by jpeg_start_decompress). Ss/Se/Ah/Al of a sequential DCT
  // scan are 0/63/0/0 (a lossless scan's, in libjpeg-turbo 3, are not).
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->buffered_image) return false;
  if (cinfo->data_precision != 8) return false;
  if (cinfo->comps_in_scan != cinfo->num_components) return false;
  if (cinfo->Ss != 0 || cinfo->Se != DCTSIZE2 - 1 || cinfo->Ah != 0 || cinfo->Al != 0) {
    return false;
  }
  // The iMCU column width in output pixels, and the columns libjpeg transforms, exactly as
  // jpeg_crop_scanline computes them (jdapistd.c): a one-component scan's MCU is one block, so its
  // column is one block wide whatever the component's sampling factors say.
  const bool one_block_mcu = cinfo->comps_in_scan == 1 && cinfo->num_components == 1;
  const long align = one_block_mcu
                         ? cinfo->min_DCT_scaled_size
                         : static_cast<long>(cinfo->min_DCT_scaled_size) * cinfo->max_h_samp_factor;
  if (align <= 0 || cinfo->MCUs_per_row == 0 || crop_w == 0) return false;
  const long end = static_cast<long>(crop_x) + static_cast<long>(crop_w);
  first_ = static_cast<JDIMENSION>(static_cast<long>(crop_x) / align);
  last_ = static_cast<JDIMENSION>((end + align - 1) / align - 1);
  mcus_per_row_ = cinfo->MCUs_per_row;
  return reinterpret_cast<EntropyDecoderPrefix*>(cinfo->entropy)->decode_mcu != nullptr;
}

bool ColumnDiscard::install(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w) {
  installed_ = false;
  own_ = false;
  if (!qualifies(cinfo, crop_x, crop_w)) return false;
  if (first_ == 0 && last_ + 1 >= mcus_per_row_) return false;  // every column is needed
  auto* entropy = reinterpret_cast<EntropyDecoderPrefix*>(cinfo->entropy);
  original_ = entropy->decode_mcu;
  entropy->decode_mcu = &ColumnDiscard::decode_mcu;
  column_ = 0;
  discarded_ = 0;
  installed_ = true;
  return true;
}

bool ColumnDiscard::install_own(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w,
                                bool discard_columns, EntropyIndexStore* index, const uint8_t* data,
                                size_t size) {
  indexing_ = false;
  index_found_ = false;
  installed_ = false;
  own_ = false;
  own_refused_ = false;
  if (!qualifies(cinfo, crop_x, crop_w)) return false;
  if (!discard_columns) {
    first_ = 0;
    last_ = mcus_per_row_ - 1;
  }
  // libjpeg has read no scan data yet (its bit buffer is empty); a scan the own decoder refuses
  // here is libjpeg's, untouched.
  if (!own_decoder_.start(cinfo)) return false;
  // The same MCUs as libjpeg's coefficient controller asks for (per_scan_setup), or none.
  const ScanLayout& layout = own_decoder_.layout();
  if (layout.mcus_per_row != mcus_per_row_ ||
      layout.blocks_in_mcu != static_cast<int>(cinfo->blocks_in_MCU)) {
    return false;
  }
  auto* entropy = reinterpret_cast<EntropyDecoderPrefix*>(cinfo->entropy);
  original_ = entropy->decode_mcu;
  entropy->decode_mcu = &ColumnDiscard::decode_mcu_own;
  column_ = 0;
  discarded_ = 0;
  parsed_ = 0;
  mcu_ = 0;
  handed_back_ = false;
  if (index != nullptr && data != nullptr && index->budget_bytes() > 0) {
    store_ = index;
    index_.reset(hash_bytes(data, size), size, layout.mcus_per_row, layout.mcu_rows,
                 layout.restart_interval, static_cast<uint32_t>(layout.components));
    index_found_ = store_->find(index_);
    index_changed_ = false;
    indexing_ = true;
  }
  installed_ = true;
  own_ = true;
  return true;
}

void ColumnDiscard::finish_image() {
  if (indexing_ && index_changed_ && !own_refused_) store_->merge(index_);
  indexing_ = false;
}

bool ColumnDiscard::has_point(uint64_t mcu) const {
  const uint64_t column = mcu % index_.mcus_per_row;
  if (mcu / index_.mcus_per_row >= index_.mcu_rows || column % kIndexColumnStep != 0) return false;
  const size_t point = static_cast<size_t>(mcu / index_.mcus_per_row) * index_.points_per_row +
                       static_cast<size_t>(column / kIndexColumnStep);
  return index_.points[point].bit_position != IndexPoint::kAbsent;
}

void ColumnDiscard::save_point() {
  const uint64_t mcu = own_decoder_.next_mcu();
  const uint64_t column = mcu % index_.mcus_per_row;
  if (mcu / index_.mcus_per_row >= index_.mcu_rows || column % kIndexColumnStep != 0) return;
  const size_t point = static_cast<size_t>(mcu / index_.mcus_per_row) * index_.points_per_row +
                       static_cast<size_t>(column / kIndexColumnStep);
  IndexPoint& p = index_.points[point];
  if (p.bit_position != IndexPoint::kAbsent) return;
  const EntropyState state = own_decoder_.state();
  if (state.bit_position >= IndexPoint::kAbsent) return;
  IndexPoint saved;
  saved.bit_position = static_cast<uint32_t>(state.bit_position);
  for (size_t c = 0; c < state.dc_predictor.size(); ++c) {
    const int32_t dc = state.dc_predictor[c];
    if (dc < INT16_MIN || dc > INT16_MAX) return;  // never in a valid file; not saved
    saved.dc_predictor[c] = static_cast<int16_t>(dc);
  }
  p = saved;
  index_changed_ = true;
}

bool ColumnDiscard::advance_to(uint64_t target) {
  HuffmanScanDecoder& own = own_decoder_;
  if (own.next_mcu() < target) {
    // The nearest saved point at or before `target` that is ahead of the decoder.
    const size_t last = index_.points.size() - 1;
    const uint64_t row = target / index_.mcus_per_row;
    size_t point = row >= index_.mcu_rows
                       ? last
                       : static_cast<size_t>(row) * index_.points_per_row +
                             static_cast<size_t>(target % index_.mcus_per_row / kIndexColumnStep);
    for (;; --point) {
      const uint64_t mcu = index_.mcu_of(point);
      if (mcu <= own.next_mcu()) break;
      const IndexPoint& p = index_.points[point];
      if (p.bit_position != IndexPoint::kAbsent) {
        EntropyState state;
        state.bit_position = p.bit_position;
        state.next_mcu = mcu;
        for (size_t c = 0; c < state.dc_predictor.size(); ++c) {
          state.dc_predictor[c] = p.dc_predictor[c];
        }
        if (!own.restore(state)) return false;
        break;
      }
      if (point == 0) break;
    }
  }
  while (own.next_mcu() < target) {
    save_point();
    if (!own.skip_mcu()) return false;
    ++parsed_;
  }
  save_point();
  return true;
}

boolean ColumnDiscard::decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  auto* self = static_cast<ColumnDiscard*>(cinfo->client_data);
  const JDIMENSION column = self->column_;
  const bool discard = MCU_data != nullptr && (column < self->first_ || column > self->last_);
  const boolean decoded = self->original_(cinfo, discard ? nullptr : MCU_data);
  // FALSE: suspended (a suspending data source); libjpeg calls again for the same MCU.
  if (decoded) {
    self->column_ = column + 1 == self->mcus_per_row_ ? 0 : column + 1;
    if (discard) ++self->discarded_;
  }
  return decoded;
}

boolean ColumnDiscard::decode_mcu_own(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  auto* self = static_cast<ColumnDiscard*>(cinfo->client_data);
  HuffmanScanDecoder& own = self->own_decoder_;
  const JDIMENSION column = self->column_;
  const bool discard = MCU_data != nullptr && (column < self->first_ || column > self->last_);
  const bool store = MCU_data != nullptr && !discard;
  bool decoded = true;
  if (!self->indexing_) {
    decoded = store ? own.decode_mcu(MCU_data) : own.skip_mcu();
    ++self->parsed_;
  } else if (store) {
    // The MCU's coefficients are needed: from the nearest saved state, or where the decoder is.
    decoded = self->advance_to(self->mcu_) && own.decode_mcu(MCU_data);
    ++self->parsed_;
  } else if (column + 1 == self->mcus_per_row_ && !self->has_point(self->mcu_ + 1)) {
    // The row's end, and the next row's start is not saved: parse up to it (as libjpeg would),
    // which saves it. The scan's last MCU is always parsed, so the source reaches EOI.
    decoded = self->advance_to(self->mcu_ + 1);
  }
  if (!decoded) {
    // libjpeg's bit position is lost (it read nothing): only a new decode can take the file.
    self->own_refused_ = true;
    fail_with(reinterpret_cast<j_common_ptr>(cinfo), "the own entropy decoder refused the scan");
  }
  self->column_ = column + 1 == self->mcus_per_row_ ? 0 : column + 1;
  if (discard) ++self->discarded_;
  ++self->mcu_;
  if (own.finished() && !self->handed_back_) {
    self->handed_back_ = true;
    // The source stands at EOI, as libjpeg's decoder leaves it after a clean scan.
    jpeg_source_mgr* src = cinfo->src;
    src->next_input_byte += own.input_bytes();
    src->bytes_in_buffer -= own.input_bytes();
  }
  return TRUE;
}

}  // namespace conveyor::detail
