// The discard hook (jpeg_column_discard.h).
#include "codec/jpeg_column_discard.h"

namespace conveyor::detail {

bool ColumnDiscard::install(j_decompress_ptr cinfo, JDIMENSION crop_x, JDIMENSION crop_w) {
  installed_ = false;
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
  if (first_ == 0 && last_ + 1 >= mcus_per_row_) return false;  // every column is needed
  auto* entropy = reinterpret_cast<EntropyDecoderPrefix*>(cinfo->entropy);
  original_ = entropy->decode_mcu;
  if (original_ == nullptr) return false;
  entropy->decode_mcu = &ColumnDiscard::decode_mcu;
  column_ = 0;
  discarded_ = 0;
  installed_ = true;
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

}  // namespace conveyor::detail
