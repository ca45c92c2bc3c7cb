// encode_jpeg and rgb_to_cmyk (conveyor/jpeg.h): every kind of JPEG a dataset holds, written by
// libjpeg-turbo for test corpora, fuzz seeds and the synthetic datasets.
#include <algorithm>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <turbojpeg.h>

#include "codec/libjpeg_errors.h"
#include "conveyor/jpeg.h"

// After jpeglib.h (libjpeg_errors.h), which it needs.
#include <jerror.h>

namespace conveyor {

using detail::ErrorManager;
using detail::on_error;

std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality) {
  tjhandle handle = tjInitCompress();
  if (handle == nullptr) throw JpegError("tjInitCompress failed");
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  int rc =
      tjCompress2(handle, rgb, width, 0, height, TJPF_RGB, &out, &out_size, TJSAMP_420, quality, 0);
  std::vector<uint8_t> result;
  std::string message = rc != 0 ? tjGetErrorStr2(handle) : "";
  if (rc == 0) result.assign(out, out + out_size);
  tjFree(out);
  tjDestroy(handle);
  if (rc != 0) throw JpegError("JPEG encode failed: " + message);
  return result;
}

void rgb_to_cmyk(const uint8_t* rgb, uint8_t* cmyk, bool adobe) {
  // Inverted values (255 = no ink) as the decoder reads Adobe files: R = C * K / 255.
  const unsigned k = std::max({rgb[0], rgb[1], rgb[2]});
  for (int i = 0; i < 3; ++i) {
    cmyk[i] = k == 0 ? 0 : static_cast<uint8_t>((rgb[i] * 255u + k / 2) / k);
  }
  cmyk[3] = static_cast<uint8_t>(k);
  if (!adobe) {
    for (int i = 0; i < 4; ++i) cmyk[i] = static_cast<uint8_t>(255 - cmyk[i]);
  }
}

namespace {

// An APP1 payload holding only the EXIF orientation tag in IFD0.
std::vector<uint8_t> exif_orientation_payload(int orientation, bool big_endian) {
  std::vector<uint8_t> p = {'E', 'x', 'i', 'f', 0, 0};
  auto u16 = [&](unsigned v) {
    const uint8_t hi = static_cast<uint8_t>(v >> 8), lo = static_cast<uint8_t>(v);
    p.push_back(big_endian ? hi : lo);
    p.push_back(big_endian ? lo : hi);
  };
  auto u32 = [&](unsigned v) {
    u16(big_endian ? v >> 16 : v & 0xFFFF);
    u16(big_endian ? v & 0xFFFF : v >> 16);
  };
  p.push_back(big_endian ? 'M' : 'I');
  p.push_back(big_endian ? 'M' : 'I');
  u16(42);
  u32(8);       // IFD0 right after the header
  u16(1);       // one entry
  u16(0x0112);  // Orientation
  u16(3);       // SHORT
  u32(1);       // one value, stored in the first two bytes of the value field
  u16(static_cast<unsigned>(orientation));
  u16(0);
  u32(0);  // no next IFD
  return p;
}

// The libjpeg calls of encode_jpeg, under setjmp: nothing with a destructor lives in this frame.
// Returns false (with err.message set) when libjpeg reports an error.
// A libjpeg destination that writes into a std::vector, so that an error (a longjmp out of
// libjpeg mid-image) neither leaks nor frees twice, as jpeg_mem_dest's buffer can.
struct VectorDestination {
  jpeg_destination_mgr pub{};
  std::vector<uint8_t>* out;

  explicit VectorDestination(std::vector<uint8_t>& o) : out(&o) {
    pub.init_destination = init;
    pub.empty_output_buffer = grow;
    pub.term_destination = term;
  }
  static VectorDestination& of(j_compress_ptr c) {
    return *reinterpret_cast<VectorDestination*>(c->dest);  // pub is the first member
  }
  // Gives libjpeg the bytes from `used` to the end of `out`, `out` grown to at least `size`.
  static void expose(j_compress_ptr c, size_t used, size_t size) {
    VectorDestination& d = of(c);
    bool grown = false;
    try {
      d.out->resize(size);
      grown = true;
    } catch (...) {  // nothing may be thrown through libjpeg's frames
    }
    if (!grown) {  // error_exit longjmps: never from inside the catch block
      c->err->msg_code = JERR_OUT_OF_MEMORY;
      (*c->err->error_exit)(reinterpret_cast<j_common_ptr>(c));
    }
    d.pub.next_output_byte = d.out->data() + used;
    d.pub.free_in_buffer = size - used;
  }
  static void init(j_compress_ptr c) { expose(c, 0, 64 * 1024); }
  static boolean grow(j_compress_ptr c) {  // called when the whole buffer is full
    const size_t used = of(c).out->size();
    expose(c, used, 2 * used);
    return TRUE;
  }
  static void term(j_compress_ptr c) {
    VectorDestination& d = of(c);
    d.out->resize(d.out->size() - d.pub.free_in_buffer);
  }
};
static_assert(std::is_standard_layout_v<VectorDestination>);

bool compress(jpeg_compress_struct& cinfo, ErrorManager& err, VectorDestination& dest,
              const uint8_t* pixels, int components, int width, int height, const EncodeOptions& o,
              const std::vector<uint8_t>& exif) {
  if (setjmp(err.jump)) return false;
  jpeg_create_compress(&cinfo);
  cinfo.dest = &dest.pub;
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = components;
  cinfo.in_color_space = components == 4 ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, o.quality, TRUE);
  using Color = EncodeOptions::Color;
  switch (o.color) {
    case Color::kYCbCr:
      jpeg_set_colorspace(&cinfo, JCS_YCbCr);
      break;
    case Color::kGray:
      jpeg_set_colorspace(&cinfo, JCS_GRAYSCALE);
      break;
    case Color::kRgb:
      jpeg_set_colorspace(&cinfo, JCS_RGB);
      break;
    case Color::kCmyk:
      jpeg_set_colorspace(&cinfo, JCS_CMYK);
      cinfo.write_Adobe_marker = o.adobe_marker ? TRUE : FALSE;
      break;
    case Color::kYcck:
      jpeg_set_colorspace(&cinfo, JCS_YCCK);
      break;
  }
  if (o.color == Color::kYCbCr || o.color == Color::kYcck) {
    for (int ci = 0; ci < cinfo.num_components; ++ci) {
      const bool full = ci == 0 || ci == 3;  // Y and K carry the full resolution
      cinfo.comp_info[ci].h_samp_factor = full ? o.h_samp : 1;
      cinfo.comp_info[ci].v_samp_factor = full ? o.v_samp : 1;
    }
  }
  if (o.progressive) jpeg_simple_progression(&cinfo);
  cinfo.arith_code = o.arithmetic ? TRUE : FALSE;
  cinfo.restart_interval = static_cast<unsigned>(o.restart_interval);
  jpeg_start_compress(&cinfo, TRUE);
  if (!exif.empty()) {
    jpeg_write_marker(&cinfo, JPEG_APP0 + 1, exif.data(), static_cast<unsigned>(exif.size()));
  }
  const size_t row_bytes = static_cast<size_t>(width) * static_cast<size_t>(components);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels) + cinfo.next_scanline * row_bytes;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  return true;
}

}  // namespace

std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height,
                                 const EncodeOptions& options) {
  if (width <= 0 || height <= 0) throw std::invalid_argument("encode_jpeg: empty image");
  using Color = EncodeOptions::Color;
  const bool cmyk = options.color == Color::kCmyk || options.color == Color::kYcck;
  std::vector<uint8_t> converted;
  const uint8_t* pixels = rgb;
  if (cmyk) {
    const size_t n = static_cast<size_t>(width) * static_cast<size_t>(height);
    converted.resize(n * 4);
    const bool adobe = options.adobe_marker || options.color == Color::kYcck;
    for (size_t i = 0; i < n; ++i) rgb_to_cmyk(rgb + 3 * i, converted.data() + 4 * i, adobe);
    pixels = converted.data();
  }
  std::vector<uint8_t> exif;
  if (options.orientation != 0) {
    exif = exif_orientation_payload(options.orientation, options.exif_big_endian);
  }
  jpeg_compress_struct cinfo{};
  ErrorManager err{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  std::vector<uint8_t> result;
  VectorDestination dest(result);
  const bool ok = compress(cinfo, err, dest, pixels, cmyk ? 4 : 3, width, height, options, exif);
  jpeg_destroy_compress(&cinfo);
  if (!ok) throw JpegError(std::string("JPEG encode failed: ") + err.message);
  return result;
}

}  // namespace conveyor
