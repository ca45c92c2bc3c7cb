// JpegDecoder (conveyor/jpeg.h): libjpeg-turbo decodes of a region at the smallest DCT scale that
// covers it, through the restart segments where a file has them (jpeg_segments.h).
#include "conveyor/jpeg.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
// After jpeglib.h, which it needs.
#include <jerror.h>
#include <turbojpeg.h>

#include "codec/image_codec.h"
#include "codec/jpeg_column_discard.h"
#include "codec/jpeg_segments.h"
#include "codec/libjpeg_errors.h"

namespace conveyor {
namespace {

using detail::ErrorManager;
using detail::fail_with;
using detail::on_error;
using detail::on_message;

// DecodeLimits::max_scans, checked by libjpeg's progress monitor. libjpeg calls the monitor before
// each step of reading a multi-scan file's input (jpeg_start_decompress reads every scan of a
// progressive file, an iMCU row or a marker at a time), so a scan is seen once its SOS marker has
// been read and before its data is decoded. input_scan_number counts the image's SOS markers
// (libjpeg resets it with each header).
struct ScanLimit {
  jpeg_progress_mgr pub{};  // first: libjpeg holds a pointer to it
  int max_scans = 0;
  bool exceeded = false;  // the last failure was this limit
};

void check_scans(j_common_ptr cinfo) {
  auto* limit = reinterpret_cast<ScanLimit*>(cinfo->progress);
  if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number <= limit->max_scans) return;
  limit->exceeded = true;
  char text[JMSG_LENGTH_MAX];
  std::snprintf(text, sizeof text, "more than %d scans (DecodeLimits::max_scans)",
                limit->max_scans);
  fail_with(cinfo, text);
}

const char* color_space_name(J_COLOR_SPACE cs) {
  switch (cs) {
    case JCS_GRAYSCALE:
      return "gray";
    case JCS_YCbCr:
      return "ycbcr";
    case JCS_RGB:
      return "rgb";
    case JCS_CMYK:
      return "cmyk";
    case JCS_YCCK:
      return "ycck";
    default:
      return "unknown";
  }
}

int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

// The EXIF orientation (TIFF tag 0x0112 in IFD0) of an APP1 "Exif" payload; 1 when absent or
// malformed. Every offset is checked against the payload's length.
int exif_orientation(const uint8_t* p, size_t n) {
  static constexpr uint8_t kExif[6] = {'E', 'x', 'i', 'f', 0, 0};
  if (n < 6 + 8 || std::memcmp(p, kExif, 6) != 0) return 1;
  const uint8_t* tiff = p + 6;
  const size_t size = n - 6;
  bool little;
  if (tiff[0] == 'I' && tiff[1] == 'I') {
    little = true;
  } else if (tiff[0] == 'M' && tiff[1] == 'M') {
    little = false;
  } else {
    return 1;
  }
  auto u16 = [&](size_t o) -> unsigned {
    return little ? tiff[o] | tiff[o + 1] << 8 : tiff[o] << 8 | tiff[o + 1];
  };
  auto u32 = [&](size_t o) -> size_t {
    return little ? static_cast<size_t>(u16(o)) | static_cast<size_t>(u16(o + 2)) << 16
                  : static_cast<size_t>(u16(o)) << 16 | static_cast<size_t>(u16(o + 2));
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > size || size - ifd < 2) return 1;
  const size_t entries = u16(ifd);
  for (size_t i = 0; i < entries; ++i) {
    const size_t e = ifd + 2 + 12 * i;
    if (e > size || size - e < 12) return 1;
    if (u16(e) != 0x0112) continue;
    if (u16(e + 2) != 3 || u32(e + 4) != 1) return 1;  // one SHORT
    const unsigned v = u16(e + 8);
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  DecodeLimits limits;
  DecodeOptions options;
  std::vector<uint8_t> buffer;
  std::vector<JSAMPROW> rows;  // pointers into `buffer`, one per decoded row
  bool started = false;        // a header was read and the decompressor is mid-image
  ScanLimit scan_limit;
  // The file begin() read, for cutting restart segments out of it (jpeg_segments.h).
  const uint8_t* file = nullptr;
  size_t file_size = 0;
  bool layout_read = false;  // `layout` is this file's (valid only if segmentable)
  bool segmentable = false;
  detail::SegmentLayout layout;
  std::vector<uint8_t> segments;         // the small JPEG of the covering segments
  detail::ColumnDiscard column_discard;  // found by its decode_mcu through cinfo.client_data
  JpegEntropyPath entropy_path = JpegEntropyPath::kNone;
  bool own_entropy_retried = false;  // the last decode was redone without the own decoder
  // The data the decompressor reads: the file, or the small JPEG of its segments.
  const uint8_t* source = nullptr;
  size_t source_size = 0;

  State(DecodeLimits l, DecodeOptions o) : limits(l), options(o) {
    if (options.channels != 3 && options.channels != 4) {
      throw std::invalid_argument("DecodeOptions::channels must be 3 or 4");
    }
    if (limits.max_scans < 1) throw std::invalid_argument("DecodeLimits::max_scans must be >= 1");
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    jpeg_create_decompress(&cinfo);
    cinfo.client_data = &column_discard;
    scan_limit.pub.progress_monitor = check_scans;
    scan_limit.max_scans = limits.max_scans;
    cinfo.progress = &scan_limit.pub;
    // Kept across images: APP1 (EXIF) markers are saved only when the orientation is wanted.
    if (options.read_orientation) jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
  }
  ~State() { jpeg_destroy_decompress(&cinfo); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Ends the current image: frees its memory and readies the decompressor for the next header.
  //
  // jpeg_abort_decompress frees every module of the image but leaves cinfo.cconvert and
  // cinfo.cquantize pointing at the freed memory. libjpeg-turbo before 3.1.2 (upstream commit
  // f158143e; Debian 12 ships 2.1.5) reads and writes through cinfo.cconvert in
  // jpeg_skip_scanlines whenever the next image uses merged upsampling (4:2:0 or 4:2:2 at 8/8
  // with fast upsampling), where no color converter is allocated. After a decode without merged
  // upsampling (4:4:4, gray, CMYK, any DCT scale below 8/8) that write landed in memory that
  // another module of the same decoder, or another thread, had since been given: the cause of
  // the intermittent "Bogus virtual array access" and "premature end of data segment" failures
  // on valid files (issue 10). Clearing both pointers here makes every libjpeg-turbo version
  // behave as the fixed one does; both are allocated afresh by jpeg_start_decompress when the
  // next image needs them.
  void abort() {
    jpeg_abort_decompress(&cinfo);
    cinfo.cconvert = nullptr;
    cinfo.cquantize = nullptr;
    started = false;
  }

  [[noreturn]] void fail() {
    std::string message = err.message;
    const bool rejected = scan_limit.exceeded;
    scan_limit.exceeded = false;
    abort();
    throw JpegError((rejected ? "JPEG rejected: " : "JPEG decode failed: ") + message);
  }

  // Reads the header and checks the limits. The libjpeg calls run under setjmp; no object with a
  // destructor lives in this frame across them.
  JpegHeader begin(const uint8_t* data, size_t size) {
    file = data;
    file_size = size;
    layout_read = false;
    return read_header(data, size);
  }

  JpegHeader read_header(const uint8_t* data, size_t size) {
    if (started) abort();
    if (size == 0) throw JpegError("JPEG decode failed: empty input");
    if (setjmp(err.jump)) fail();
    jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
    source = data;
    source_size = size;
    started = true;
    if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
      abort();
      throw JpegError("JPEG decode failed: no image in the data (tables only)");
    }
    JpegHeader header;
    header.width = static_cast<int>(cinfo.image_width);
    header.height = static_cast<int>(cinfo.image_height);
    header.components = cinfo.num_components;
    header.progressive = cinfo.progressive_mode != 0;
    header.color_space = color_space_name(cinfo.jpeg_color_space);
    if (options.read_orientation) {
      for (jpeg_saved_marker_ptr m = cinfo.marker_list; m != nullptr; m = m->next) {
        if (m->marker != JPEG_APP0 + 1) continue;
        header.orientation = exif_orientation(m->data, m->data_length);
        if (header.orientation != 1) break;
      }
    }
    std::string over_limit =
        detail::pixel_limit_exceeded(cinfo.image_width, cinfo.image_height, limits);
    if (!over_limit.empty()) {
      abort();
      throw JpegError("JPEG rejected: " + over_limit);
    }
    if (header.width <= 0 || header.height <= 0) {
      abort();
      throw JpegError("JPEG decode failed: empty image");
    }
    return header;
  }

  // Where the rows of the last decode went; members rather than locals so that nothing in the
  // setjmp frame below changes after setjmp. [sx0, sx1) x [sy0, sy1) is the region asked for, in
  // scaled pixels; rows [dy0, dy1) of columns [crop_x, crop_x + crop_w) were decoded around it.
  struct Geometry {
    int sx0 = 0, sy0 = 0, sx1 = 0, sy1 = 0;
    int dy0 = 0, dy1 = 0;
    JDIMENSION crop_x = 0, crop_w = 0;
  } geometry;

  // Decodes the scaled region's rows into `buffer`, under setjmp, with the own entropy decoder
  // where `own_entropy` and the file allow. False: the own decoder refused the scan after its
  // start; the image is aborted, and must be decoded again from its header without it.
  bool read_rows(int scale, int x, int y, int width, int height, bool cmyk, bool own_entropy) {
    entropy_path = JpegEntropyPath::kNone;
    column_discard.reset();
    if (setjmp(err.jump)) {
      if (!column_discard.own_refused()) fail();
      abort();
      return false;
    }
    cinfo.out_color_space = cmyk ? JCS_CMYK : options.channels == 4 ? JCS_EXT_RGBX : JCS_RGB;
    cinfo.scale_num = static_cast<unsigned>(scale);
    cinfo.scale_denom = 8;
    // Off: at 8/8 with 4:2:0 or 4:2:2 libjpeg-turbo then upsamples and converts colors in one
    // SIMD pass (merged upsampling).
    cinfo.do_fancy_upsampling = options.fast_upsampling ? FALSE : TRUE;
    jpeg_start_decompress(&cinfo);
    Geometry& g = geometry;
    const int out_w = static_cast<int>(cinfo.output_width);
    const int out_h = static_cast<int>(cinfo.output_height);
    // The region in scaled pixels, rounded outwards.
    g.sx1 = std::min(out_w, ceil_div(static_cast<long long>(x + width) * scale, 8));
    g.sy1 = std::min(out_h, ceil_div(static_cast<long long>(y + height) * scale, 8));
    g.sx0 = std::min(static_cast<int>(static_cast<long long>(x) * scale / 8), g.sx1 - 1);
    g.sy0 = std::min(static_cast<int>(static_cast<long long>(y) * scale / 8), g.sy1 - 1);
    // Fancy upsampling filters each chroma sample with its neighbours, which a crop or a skip
    // cuts off: the region's edge pixels would come out as if the image ended there. Decoding one
    // iMCU more on every side (clamped to the image) gives the filter its true neighbours, so
    // the region is exactly that of a full decode.
    int margin_x = 0, margin_y = 0;
    if (cinfo.do_fancy_upsampling) {
      for (int ci = 0; ci < cinfo.num_components; ++ci) {
        if (cinfo.comp_info[ci].h_samp_factor != cinfo.max_h_samp_factor) {
          margin_x = cinfo.min_DCT_scaled_size * cinfo.max_h_samp_factor;
        }
        if (cinfo.comp_info[ci].v_samp_factor != cinfo.max_v_samp_factor) {
          margin_y = cinfo.min_DCT_scaled_size * cinfo.max_v_samp_factor;
        }
      }
    }
    int dx0 = std::max(0, g.sx0 - margin_x), dx1 = std::min(out_w, g.sx1 + margin_x);
    // A crop that leaves a component fewer than 2 samples wide makes jpeg_crop_scanline
    // re-initialise the upsampler in place, and libjpeg-turbo (2.1.5, and upstream still) then
    // writes a separate upsampler's fields past the end of a merged upsampler's smaller struct,
    // into the decoder's memory pool. A crop at least two iMCU columns wide never does (not seen
    // to change pixels, but an out-of-bounds write all the same; only boxes a few pixels wide
    // are widened).
    const int min_crop = 2 * cinfo.min_DCT_scaled_size * cinfo.max_h_samp_factor;
    if (dx1 - dx0 < min_crop) {
      dx1 = std::min(out_w, dx0 + min_crop);
      dx0 = std::max(0, dx1 - min_crop);
    }
    g.dy0 = std::max(0, g.sy0 - margin_y);
    g.dy1 = std::min(out_h, g.sy1 + margin_y);
    g.crop_x = static_cast<JDIMENSION>(dx0);
    g.crop_w = static_cast<JDIMENSION>(dx1 - dx0);
    const bool cropped = g.crop_w < cinfo.output_width;
    if (cropped) jpeg_crop_scanline(&cinfo, &g.crop_x, &g.crop_w);
    // The small JPEG of a file's restart segments differs with each box: not indexed.
    detail::EntropyIndexStore* index =
        options.entropy_index && source == file ? &options.entropy_index->store() : nullptr;
    if (!(own_entropy &&
          column_discard.install_own(&cinfo, g.crop_x, g.crop_w, options.discard_outside_crop,
                                     index, source, source_size)) &&
        cropped && options.discard_outside_crop) {
      column_discard.install(&cinfo, g.crop_x, g.crop_w);
    }
    entropy_path = column_discard.own()         ? JpegEntropyPath::kOwnDecoder
                   : column_discard.installed() ? JpegEntropyPath::kDiscardOutsideCrop
                                                : JpegEntropyPath::kLibjpeg;
    const size_t row_bytes =
        static_cast<size_t>(g.crop_w) * static_cast<size_t>(cinfo.output_components);
    const size_t count = static_cast<size_t>(g.dy1 - g.dy0);
    if (buffer.size() < row_bytes * count) buffer.resize(row_bytes * count);
    if (rows.size() < count) rows.resize(count);
    for (size_t i = 0; i < count; ++i) rows[i] = buffer.data() + i * row_bytes;
    if (g.dy0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(g.dy0));
    // Asking for every remaining row at once lets libjpeg write whole row groups in place (one
    // row at a time, the merged upsampler copies every second row through a spare row).
    while (cinfo.output_scanline < static_cast<JDIMENSION>(g.dy1)) {
      const JDIMENSION done = cinfo.output_scanline - static_cast<JDIMENSION>(g.dy0);
      jpeg_read_scanlines(&cinfo, rows.data() + done,
                          static_cast<JDIMENSION>(g.dy1) - cinfo.output_scanline);
    }
    column_discard.finish_image();
    // Rows below the region are never decoded.
    abort();
    return true;
  }

  // Where the file's restart intervals tile its MCU rows and the box leaves whole intervals out
  // (columns beside it, rows above it), replaces the file being decoded with the small JPEG of
  // the intervals that cover the box (jpeg_segments.h), and moves (x, y) into it. The box keeps
  // one MCU of margin wherever fancy upsampling filters across an MCU edge, so that its pixels are
  // exactly those of the whole file's decode; rows below the box are never decoded either way.
  void cut_to_segments(int& x, int& y, int width, int height) {
    if (!options.restart_segments || file == nullptr) return;
    if (!layout_read) {
      segmentable = detail::read_segment_layout(file, file_size, layout);
      layout_read = true;
    }
    if (!segmentable) return;
    const detail::SegmentLayout& l = layout;
    int c0 = x / l.mcu_width, c1 = ceil_div(x + width, l.mcu_width);
    int r0 = y / l.mcu_height, r1 = ceil_div(y + height, l.mcu_height);
    if (!options.fast_upsampling) {
      for (int ci = 0; ci < cinfo.num_components; ++ci) {
        if (cinfo.comp_info[ci].h_samp_factor != cinfo.max_h_samp_factor) {
          c0 = std::max(0, x / l.mcu_width - 1);
          c1 = std::min(l.mcus_per_row, ceil_div(x + width, l.mcu_width) + 1);
        }
        if (cinfo.comp_info[ci].v_samp_factor != cinfo.max_v_samp_factor) {
          r0 = std::max(0, y / l.mcu_height - 1);
          r1 = std::min(l.mcu_rows, ceil_div(y + height, l.mcu_height) + 1);
        }
      }
    }
    c0 = c0 / l.interval * l.interval;
    c1 = std::min(l.mcus_per_row, ceil_div(c1, l.interval) * l.interval);
    if (c0 == 0 && c1 == l.mcus_per_row && r0 == 0) return;  // nothing to leave out
    detail::write_segment_jpeg(file, l, c0, c1, r0, r1, segments);
    read_header(segments.data(), segments.size());
    x -= c0 * l.mcu_width;
    y -= r0 * l.mcu_height;
  }

  DecodedImage finish(int x, int y, int width, int height, int min_width, int min_height) {
    const int full_w = static_cast<int>(cinfo.image_width);
    const int full_h = static_cast<int>(cinfo.image_height);
    x = std::clamp(x, 0, full_w - 1);
    y = std::clamp(y, 0, full_h - 1);
    width = std::clamp(width, 1, full_w - x);
    height = std::clamp(height, 1, full_h - y);

    const int scale = detail::dct_scale_for(width, height, min_width, min_height, options);
    const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    const bool adobe_inverted = cinfo.saw_Adobe_marker != 0;
    cut_to_segments(x, y, width, height);
    own_entropy_retried = false;
    if (!read_rows(scale, x, y, width, height, cmyk, options.own_entropy_decoder)) {
      // The own decoder met something it does not take in the scan (libjpeg may take it, or
      // report it): the whole image again on libjpeg's path, whose pixels or error are the
      // decode's, as with the option off.
      own_entropy_retried = true;
      read_header(source, source_size);
      read_rows(scale, x, y, width, height, cmyk, false);
    }
    const JDIMENSION crop_w = geometry.crop_w;
    const int rows = geometry.dy1 - geometry.dy0;
    const int sx0 = geometry.sx0, sx1 = geometry.sx1;
    const JDIMENSION crop_x = geometry.crop_x;

    const size_t channels = static_cast<size_t>(options.channels);
    if (cmyk) {
      // In place, 4 bytes per pixel -> `channels`, front to back (the write never overtakes the
      // read).
      const size_t pixels = static_cast<size_t>(crop_w) * static_cast<size_t>(rows);
      uint8_t* p = buffer.data();
      for (size_t i = 0; i < pixels; ++i) {
        unsigned c = p[4 * i], m = p[4 * i + 1], yel = p[4 * i + 2], k = p[4 * i + 3];
        if (!adobe_inverted) {
          c = 255 - c;
          m = 255 - m;
          yel = 255 - yel;
          k = 255 - k;
        }
        p[channels * i] = static_cast<uint8_t>(c * k / 255);
        p[channels * i + 1] = static_cast<uint8_t>(m * k / 255);
        p[channels * i + 2] = static_cast<uint8_t>(yel * k / 255);
      }
    }
    DecodedImage image;
    image.channels = options.channels;
    image.stride = static_cast<size_t>(crop_w) * channels;
    image.pixels = buffer.data() + static_cast<size_t>(geometry.sy0 - geometry.dy0) * image.stride +
                   static_cast<size_t>(sx0 - static_cast<int>(crop_x)) * channels;
    image.width = sx1 - sx0;
    image.height = geometry.sy1 - geometry.sy0;
    image.scale = scale;
    return image;
  }
};

namespace detail {

int dct_scale_for(int width, int height, int min_width, int min_height,
                  const DecodeOptions& options) {
  for (int m = 1; m < 8; ++m) {
    // By default 1/8, 2/8, 4/8 and 8/8: the sizes libjpeg-turbo has SIMD IDCTs for (jpeg.h).
    if (!options.any_scale && (options.dct_scales >> m & 1u) == 0) continue;
    if (ceil_div(static_cast<long long>(width) * m, 8) >= min_width &&
        ceil_div(static_cast<long long>(height) * m, 8) >= min_height) {
      return m;
    }
  }
  return 8;
}

}  // namespace detail

JpegEntropyIndex::JpegEntropyIndex(size_t budget_bytes)
    : store_(std::make_unique<detail::EntropyIndexStore>(budget_bytes)) {}
JpegEntropyIndex::JpegEntropyIndex(size_t budget_bytes, std::filesystem::path file)
    : JpegEntropyIndex(budget_bytes) {
  file_ = std::move(file);
  if (budget_bytes == 0 || file_.empty()) return;
  loaded_ = detail::load_index_file(file_, *store_);
  saved_changes_ = store_->changes();
}
JpegEntropyIndex::~JpegEntropyIndex() {
  if (file_.empty() || store_->budget_bytes() == 0 || store_->changes() == saved_changes_) return;
  try {
    save();
  } catch (...) {  // best effort, as documented: save() reports errors
  }
}
void JpegEntropyIndex::save() {
  if (file_.empty() || store_->budget_bytes() == 0) return;
  const uint64_t changes = store_->changes();
  detail::save_index_file(file_, *store_);
  saved_changes_ = changes;
}
size_t JpegEntropyIndex::budget_bytes() const { return store_->budget_bytes(); }
size_t JpegEntropyIndex::bytes() const { return store_->bytes(); }
size_t JpegEntropyIndex::files() const { return store_->files(); }

JpegDecoder::JpegDecoder(DecodeLimits limits, DecodeOptions options)
    : state_(std::make_unique<State>(limits, options)) {}
JpegDecoder::~JpegDecoder() = default;
JpegDecoder::JpegDecoder(JpegDecoder&&) noexcept = default;
JpegDecoder& JpegDecoder::operator=(JpegDecoder&&) noexcept = default;

JpegHeader JpegDecoder::read_header(const uint8_t* data, size_t size) {
  JpegHeader header = state_->begin(data, size);
  state_->abort();
  return header;
}

JpegHeader JpegDecoder::begin(const uint8_t* data, size_t size) {
  return state_->begin(data, size);
}

DecodedImage JpegDecoder::finish_region(int x, int y, int width, int height, int min_width,
                                        int min_height) {
  if (!state_->started) throw std::logic_error("JpegDecoder::finish_region without begin");
  return state_->finish(x, y, width, height, min_width, min_height);
}

JpegEntropyStats JpegDecoder::last_entropy_stats() const {
  JpegEntropyStats stats;
  stats.path = state_->entropy_path;
  stats.mcus_discarded = state_->column_discard.discarded();
  stats.own_decoder_retried = state_->own_entropy_retried;
  stats.mcus_parsed = state_->column_discard.parsed();
  stats.index_found = state_->column_discard.index_found();
  return stats;
}

DecodedImage JpegDecoder::decode(const uint8_t* data, size_t size) {
  JpegHeader header = state_->begin(data, size);
  return state_->finish(0, 0, header.width, header.height, header.width, header.height);
}

DecodedImage JpegDecoder::decode_region(const uint8_t* data, size_t size, int x, int y, int width,
                                        int height, int min_width, int min_height) {
  state_->begin(data, size);
  return state_->finish(x, y, width, height, min_width, min_height);
}

}  // namespace conveyor
