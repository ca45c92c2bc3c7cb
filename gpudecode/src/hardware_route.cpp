// hardware_route(): which JPEGs nvJPEG's hardware backend takes, from the header that
// libjpeg-turbo reads (see conveyor/gpu_decode.h).
#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>

#include "conveyor/gpu_decode.h"
#include "conveyor/jpeg.h"

namespace conveyor {
namespace {

// What the routing needs from a header: plain data, so that the setjmp frame holds nothing with
// a destructor.
struct HeaderFacts {
  int width = 0, height = 0;
  int components = 0;
  int precision = 8;
  bool progressive = false;
  bool arithmetic = false;
  J_COLOR_SPACE color = JCS_UNKNOWN;
  int h[4] = {}, v[4] = {};
};

struct RouteErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<RouteErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}
void on_message(j_common_ptr, int) {}  // warnings do not change the route

// Reads the header into `facts`; false (and err.message) when libjpeg-turbo cannot.
bool read_facts(const uint8_t* data, size_t size, HeaderFacts& facts, RouteErrorManager& err) {
  jpeg_decompress_struct cinfo{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  facts.width = static_cast<int>(cinfo.image_width);
  facts.height = static_cast<int>(cinfo.image_height);
  facts.components = cinfo.num_components;
  facts.precision = cinfo.data_precision;
  facts.progressive = cinfo.progressive_mode != 0;
  facts.arithmetic = cinfo.arith_code != 0;
  facts.color = cinfo.jpeg_color_space;
  for (int c = 0; c < cinfo.num_components && c < 4; ++c) {
    facts.h[c] = cinfo.comp_info[c].h_samp_factor;
    facts.v[c] = cinfo.comp_info[c].v_samp_factor;
  }
  jpeg_destroy_decompress(&cinfo);
  return true;
}

}  // namespace

HardwareRoute hardware_route(const uint8_t* data, size_t size) {
  HeaderFacts facts;
  RouteErrorManager err;
  if (!read_facts(data, size, facts, err)) {
    throw JpegError(std::string("not a readable JPEG header: ") + err.message);
  }
  auto cpu = [](std::string reason) { return HardwareRoute{false, std::move(reason)}; };
  if (facts.progressive) return cpu("progressive");
  if (facts.arithmetic) return cpu("arithmetic-coded");
  if (facts.precision != 8) return cpu(std::to_string(facts.precision) + "-bit samples");
  if (facts.color == JCS_CMYK) return cpu("CMYK");
  if (facts.color == JCS_YCCK) return cpu("YCCK");
  if (facts.components == 1) return HardwareRoute{true, {}};
  if (facts.components != 3) return cpu(std::to_string(facts.components) + " components");
  if (facts.color != JCS_YCbCr) return cpu("3 components stored as RGB");
  if (facts.h[1] != 1 || facts.v[1] != 1 || facts.h[2] != 1 || facts.v[2] != 1) {
    return cpu("subsampled luma or chroma factors other than 1x1");
  }
  const int h = facts.h[0], v = facts.v[0];
  if ((h == 1 || h == 2) && (v == 1 || v == 2)) return HardwareRoute{true, {}};  // 444 422 420 440
  if (h == 4 && v == 1) return cpu("4:1:1 sampling");
  if (h == 4 && v == 2) return cpu("4:1:0 sampling");
  return cpu("luma sampling " + std::to_string(h) + "x" + std::to_string(v));
}

}  // namespace conveyor
