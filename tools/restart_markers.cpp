// add_restart_markers: jpeg_read_coefficients -> jpeg_write_coefficients with a restart interval.
#include "restart_markers.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

// clang-format off
#include <jpeglib.h>  // after <cstdio>: it needs FILE and size_t
// clang-format on

namespace conveyor::tools {

namespace {

struct ErrorJump {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorJump*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void on_message(j_common_ptr, int) {}  // warnings are not errors here

bool starts_with(const jpeg_saved_marker_ptr m, const char* text, size_t length) {
  return m->data_length >= length && std::memcmp(m->data, text, length) == 0;
}

// The libjpeg calls, under setjmp: nothing with a destructor lives in this frame. Returns false
// with `err.message` set on a libjpeg error.
bool transcode(const uint8_t* data, size_t size, int target, ErrorJump& err,
               jpeg_decompress_struct& in, jpeg_compress_struct& out, unsigned char** buffer,
               unsigned long* length, int* interval, int* mcus_per_row) {
  if (setjmp(err.jump)) return false;
  jpeg_mem_src(&in, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&in, JPEG_COM, 0xFFFF);
  for (int m = 0; m < 16; ++m) jpeg_save_markers(&in, JPEG_APP0 + m, 0xFFFF);
  jpeg_read_header(&in, TRUE);
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&in);
  jpeg_mem_dest(&out, buffer, length);
  jpeg_copy_critical_parameters(&in, &out);
  out.optimize_coding = TRUE;
  out.arith_code = FALSE;
  // jpeg_copy_critical_parameters asks for a JFIF or Adobe marker by colour space; write one
  // only where the input had it: an Adobe marker would make plain CMYK read as inverted.
  out.write_JFIF_header = in.saw_JFIF_marker;
  out.write_Adobe_marker = in.saw_Adobe_marker;
  // An interleaved scan's MCU spans the largest sampling factors; a single-component scan's MCU
  // is one 8x8 block.
  const int mcu_width = in.num_components == 1 ? DCTSIZE : DCTSIZE * in.max_h_samp_factor;
  *mcus_per_row = static_cast<int>((in.image_width + static_cast<unsigned>(mcu_width) - 1) /
                                   static_cast<unsigned>(mcu_width));
  *interval = restart_interval_for(*mcus_per_row, target);
  out.restart_interval = static_cast<unsigned int>(*interval);
  jpeg_write_coefficients(&out, coefficients);
  for (jpeg_saved_marker_ptr m = in.marker_list; m != nullptr; m = m->next) {
    // libjpeg writes the JFIF and Adobe markers itself when the input had them.
    if (out.write_JFIF_header && m->marker == JPEG_APP0 && starts_with(m, "JFIF", 5)) continue;
    if (out.write_Adobe_marker && m->marker == JPEG_APP0 + 14 && starts_with(m, "Adobe", 5)) {
      continue;
    }
    jpeg_write_marker(&out, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(&out);
  jpeg_finish_decompress(&in);
  return true;
}

}  // namespace

int restart_interval_for(int mcus_per_row, int target) {
  if (mcus_per_row < 1 || target < 1) return 1;
  for (int d = std::min(target, mcus_per_row); d > 1; --d) {
    if (mcus_per_row % d == 0) return d;
  }
  return 1;
}

RestartRewrite add_restart_markers(const uint8_t* data, size_t size, int target_mcus) {
  ErrorJump err{};
  jpeg_decompress_struct in{};
  jpeg_compress_struct out{};
  // Both objects report through one error manager: errors in either land in transcode's setjmp.
  in.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  out.err = in.err;
  jpeg_create_decompress(&in);
  jpeg_create_compress(&out);
  unsigned char* buffer = nullptr;
  unsigned long length = 0;
  RestartRewrite result;
  const bool ok = transcode(data, size, target_mcus, err, in, out, &buffer, &length,
                            &result.interval, &result.mcus_per_row);
  jpeg_destroy_compress(&out);
  jpeg_destroy_decompress(&in);
  if (ok) result.jpeg.assign(buffer, buffer + length);
  std::free(buffer);  // jpeg_mem_dest's buffer (malloc'd by libjpeg), null if never written
  if (!ok) throw std::runtime_error(std::string("restart markers: ") + err.message);
  return result;
}

}  // namespace conveyor::tools
