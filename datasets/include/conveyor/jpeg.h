// conveyor/jpeg.h: JPEG decoding with libjpeg-turbo, decoding only what is needed.
//
// What it is for: turning JPEG bytes into RGB uint8 pixels as cheaply as possible. A request names
// a region of the source image and the smallest size the caller needs it at; the decoder picks the
// smallest DCT scale M/8 that keeps the region at least that large, skips the rows above and below
// it (jpeg_skip_scanlines, and stopping after its last row) and decodes only the iMCU columns that
// cover it (jpeg_crop_scanline). By default M is one of 1, 2, 4, 8: the only sizes libjpeg-turbo
// has SIMD inverse DCTs for (the others run its scalar C IDCTs, and at 3/8, 5/8, 6/8 and 7/8 it
// also upsamples the chroma through a scalar IDCT of twice the size, e.g. 12x12 at 6/8); on
// photo-like 500x375 RandomResizedCrop boxes the SIMD-only choice and a larger resize cost 15%
// fewer instructions per image than any M. DecodeOptions::any_scale restores every M = 1..8.
// Scales above 8/8 (libjpeg-turbo's 9/8 .. 16/8) are never used: they run scalar IDCTs too and
// upsampling small crops after an 8/8 decode is cheaper.
//
// Requires: one JpegDecoder per thread; it is reused across images and is not thread-safe.
// Nothing of one image carries over to the next (libjpeg-turbo before 3.1.2, which Debian 12
// ships, leaves a dangling color converter behind that jpeg_skip_scanlines then writes through;
// the decoder clears it after every image).
// Guarantees: every JPEG that libjpeg-turbo reads decodes to RGB (baseline, progressive,
// arithmetic-coded, restart markers, any subsampling; grayscale is expanded to three channels;
// CMYK and YCCK, Adobe-inverted or not, are converted to RGB). Anything libjpeg-turbo reports as
// an error or as corrupt data (a truncated file among them) throws JpegError instead of returning
// a partly grey image. An image with more than DecodeLimits::max_pixels pixels is rejected after
// reading the header and before any pixel buffer is allocated; one with more than
// DecodeLimits::max_scans scans is rejected when its scan max_scans + 1 begins, before that scan's
// data is decoded. Nothing is thrown through libjpeg's C frames: its errors, and these limits
// checked inside its callbacks, leave them by longjmp and are thrown once libjpeg has returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor {

class JpegError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DecodeLimits {
  uint64_t max_pixels = 100'000'000;  // width x height above this is rejected (decompression bomb)
  // A file with more scans than this is rejected. Each scan of a progressive JPEG is a pass over
  // every block of its components, however few bytes it takes, and libjpeg-turbo before 3.0 has
  // no limit: 10,000 scans of a 10000x10000 image (2 MB) took 67.6 s to decode. Encoders write
  // about 10 (libjpeg's jpeg_simple_progression: 10 for color, 6 for gray); 500 is what
  // libjpeg-turbo's own fuzzers set as TJPARAM_SCANLIMIT (its default is no limit), and bounds
  // such a file at about 3.4 s (its 6.8 ms a scan; not measured here). At least 1.
  int max_scans = 500;
};

namespace detail {
class EntropyIndexStore;
}

// What JpegEntropyIndex found in its file at construction (JpegEntropyIndex::loaded()).
struct JpegEntropyIndexLoad {
  bool file_found = false;  // the path existed
  // Refused whole, nothing loaded: unreadable (a directory, no permission), or a header that is
  // not this format's (magic, version, byte order, point spacing), an empty file included.
  bool file_refused = false;
  std::string refusal;             // why it was refused whole, naming the path; empty otherwise
  size_t entries_loaded = 0;       // entries now held
  size_t entries_refused = 0;      // a failed checksum, a key seen before, or rest_dropped's entry
  size_t entries_over_budget = 0;  // valid, but left out to keep to the budget
  // An entry cut short by the file's end, or whose layout is inconsistent (so its length cannot
  // be trusted): it counts as refused, and the rest of the file is dropped.
  bool rest_dropped = false;
};

// An index of JPEG files' entropy-coded data, the companion of DecodeOptions::own_entropy_decoder
// (issue 35, step 3), in memory and optionally kept in a file between runs. While the own decoder
// decodes a file it saves its state (bit position and DC predictors) at the start of every MCU row
// and every 8 MCUs within it, where its decode passes; a later decode of the same bytes starts
// each of the crop's MCU rows at the saved state nearest at or before the crop's first column,
// and parses nothing above the crop. An index fills up over epochs: the first decode of a file
// parses what it parses without one. A file decoded from the restart segments that cover the box
// (DecodeOptions::restart_segments) needs no index and is not indexed. A 500x375 4:2:0 photo's
// entry holds 96 states of 12 bytes (about 1.3 KB with its bookkeeping, 1.2-1.4% of the files
// measured; BENCHMARKS.md); in the file it takes 1,200 bytes.
//
// With a file (the second constructor), the index starts with the file's entries (the most
// recently used first, up to the budget) and save() writes every entry held back to it, so that
// a run, or the next one, starts indexed. The file's layout is trusted in nothing: its header must
// be this format's, each entry's layout must be consistent and its checksum must hold, and an
// entry that fails is skipped and counted (loaded()); reading any file is memory-safe and bounded
// by its size. An entry is found only for the same bytes, so an entry of a file whose bytes have
// changed since (a stale entry) is never used; it stays in the file, taking space, until the
// budget pushes it out. The checksums catch corruption, not forgery: the file must be as trusted
// as the images, since an entry forged with a valid checksum (they are not cryptographic) can
// change the pixels of the image it names (a state at a wrong position that still parses cannot
// be told from a right one), though never read or write out of bounds.
//
// Requires: shared by any number of JpegDecoders, in any threads (one lock around each file's
// look-up and store, never held while decoding). Without the own decoder it is unused. Processes
// that save to the same file each write their own entries: the last save wins whole. A file, if
// given, as trusted as the images (above).
// Guarantees: the pixels, and the errors, are those of a decode without it. A file's entry is
// found only for the same bytes (a 64-bit hash of the whole data decoded, and its size) and the
// same scan layout, and only while its checksum holds (an entry that fails it is dropped); a
// state that does not fit the scan makes the own decoder refuse, and the image is decoded by
// libjpeg-turbo alone. At most `budget_bytes` are held; the least recently used files' entries
// leave first. A budget of 0 turns the index off (nothing is hashed or stored, and its file is
// neither read nor written).
class JpegEntropyIndex {
 public:
  static constexpr size_t kDefaultBudgetBytes = size_t{64} << 20;
  explicit JpegEntropyIndex(size_t budget_bytes = kDefaultBudgetBytes);
  // Loads `file` when it exists (loaded() says what it held); never throws for the file's
  // content or for a path that cannot be read.
  JpegEntropyIndex(size_t budget_bytes, std::filesystem::path file);
  // With a file, saves as save() does when an entry was added since the load or the last save;
  // best effort: a failed save here is skipped silently (call save() to see errors).
  ~JpegEntropyIndex();
  JpegEntropyIndex(const JpegEntropyIndex&) = delete;
  JpegEntropyIndex& operator=(const JpegEntropyIndex&) = delete;

  size_t budget_bytes() const;
  // The bytes held now, and the number of files indexed.
  size_t bytes() const;
  size_t files() const;
  // The file given (empty: none), and what its load found.
  const std::filesystem::path& file() const { return file_; }
  const JpegEntropyIndexLoad& loaded() const { return loaded_; }
  // Writes every entry held to the file, atomically: to a new file in the same directory, flushed
  // to disk, then renamed over it, so that a crash or a concurrent save never leaves a torn file
  // (and a failed save leaves the old one as it was). Safe alongside decodes (the entries are
  // copied under the lock). Does nothing without a file or with a budget of 0.
  // Throws std::runtime_error naming the path and the system's reason when it cannot write.
  void save();
  // The store JpegDecoder uses (codec/jpeg_entropy_index.h; internal).
  detail::EntropyIndexStore& store() const { return *store_; }

 private:
  std::unique_ptr<detail::EntropyIndexStore> store_;
  std::filesystem::path file_;
  JpegEntropyIndexLoad loaded_;
  uint64_t saved_changes_ = 0;  // the store's change count at the load or the last save
};

// DecodeOptions::dct_scales masks: bit M allows the scale M/8.
constexpr unsigned kFullDctScale = 1u << 8;
constexpr unsigned kSimdDctScales = 1u << 1 | 1u << 2 | 1u << 4 | kFullDctScale;
constexpr unsigned kAllDctScales = 0x1FEu;

// How a JpegDecoder decodes; fixed for its lifetime.
struct DecodeOptions {
  // 3: RGB pixels. 4: RGBX pixels (the fourth byte is unspecified), which libyuv resizes,
  // mirrors and splits into planes with its 4-byte-pixel SIMD kernels, faster than 3-byte pixels.
  int channels = 3;
  // Upsample subsampled chroma by replication (libjpeg-turbo's merged upsample + color conversion
  // at 8/8) instead of its triangle filter. Chroma edges move by up to one pixel; cheaper.
  bool fast_upsampling = false;
  // The DCT scales M/8 a region may be decoded at, as a mask of bits 1 << M (8/8 is always
  // allowed; 0 or kFullDctScale means full scale only, then a resize does all the shrinking).
  // The default, 1/8, 2/8, 4/8 and 8/8, are the scales libjpeg-turbo has SIMD IDCTs for, chosen
  // by measurement (BENCHMARKS.md, "DCT scaling").
  unsigned dct_scales = kSimdDctScales;
  // Consider every DCT scale M/8, M = 1..8 (overrides dct_scales).
  bool any_scale = false;
  // Read the EXIF orientation tag (APP1) into JpegHeader::orientation; otherwise it is 1.
  bool read_orientation = false;
  // Crop-proportional decoding: in a baseline file whose restart intervals tile its MCU rows
  // (conveyor-prepare --restart N writes such files), decode only the intervals that cover the
  // region, so the work follows the region's area. The pixels are the same either way.
  bool restart_segments = true;
  // In the rows of a region, parse the MCUs of the iMCU columns outside the crop without storing
  // their coefficients (libjpeg-turbo's discard path, as its jpeg_skip_scanlines does) instead of
  // decoding them in full. For sequential Huffman files with one scan (nearly every photo);
  // progressive, arithmetic-coded and multi-scan files are decoded as before. The pixels are the
  // same either way; off only to compare.
  bool discard_outside_crop = true;
  // Decode the entropy-coded data (the Huffman symbols, to coefficients) of sequential 8-bit
  // Huffman files with one scan with Conveyor's own decoder instead of libjpeg-turbo's (issue 35;
  // 1.34x libjpeg-turbo's speed alone, BENCHMARKS.md); libjpeg-turbo still parses the headers and
  // does the IDCT, upsampling, colour conversion, DCT scaling and crop. With
  // discard_outside_crop, the MCUs outside the crop's columns are parsed without being stored.
  // Guarantees: the pixels, and the errors, are libjpeg-turbo's. A file the own decoder does not
  // take (progressive, arithmetic-coded, 12-bit, multi-scan, a scan it finds anything odd in, at
  // its start or midway) is decoded, from its header again when midway, by libjpeg-turbo alone.
  // On by default (checked at 600,000 pairs by conveyor-decode-check, and fuzzed); off only to
  // compare.
  bool own_entropy_decoder = true;
  // With own_entropy_decoder: the index of the files' entropy-coded data that this decoder uses
  // and extends, shared with other decoders (JpegEntropyIndex). Null (the default): none.
  std::shared_ptr<JpegEntropyIndex> entropy_index = nullptr;
};

// How the entropy decoding of a JpegDecoder's last decode went, for statistics and tests.
enum class JpegEntropyPath {
  kNone,     // no decode yet, or the last one failed before decoding
  kLibjpeg,  // libjpeg-turbo's own: every MCU of the decoded rows in full
  // DecodeOptions::discard_outside_crop: the MCUs outside the crop's columns were parsed and
  // discarded, those inside decoded in full
  kDiscardOutsideCrop,
  // DecodeOptions::own_entropy_decoder: Conveyor's own decoder decoded the MCUs of the decoded
  // rows (the columns outside the crop parsed and discarded with discard_outside_crop)
  kOwnDecoder,
};

struct JpegEntropyStats {
  JpegEntropyPath path = JpegEntropyPath::kNone;
  // kDiscardOutsideCrop, kOwnDecoder: the MCUs whose coefficients were discarded rather than
  // stored.
  uint64_t mcus_discarded = 0;
  // The own decoder took the scan but refused it midway, and the image was decoded again without
  // it (`path` is then that decode's).
  bool own_decoder_retried = false;
  // kOwnDecoder: the MCUs the own decoder parsed (decoded or skipped); with an entropy index,
  // fewer once the file's entry covers the crop.
  uint64_t mcus_parsed = 0;
  // kOwnDecoder: the file had an entry in DecodeOptions::entropy_index.
  bool index_found = false;
};

struct JpegHeader {
  int width = 0;
  int height = 0;
  int components = 0;
  bool progressive = false;
  std::string color_space;  // "gray", "ycbcr", "rgb", "cmyk", "ycck" or "unknown"
  // EXIF orientation 1..8 (1: as stored; 2..8: how the stored pixels must be mirrored/rotated to
  // display upright, as in TIFF/EXIF). 1 when absent, malformed or not asked for.
  int orientation = 1;
};

// A decoded region: `height` rows of `width` pixels of `channels` bytes (RGB or RGBX, as
// DecodeOptions::channels asks), `stride` bytes apart. `scale` is the DCT
// numerator used (of 8); the region maps to source pixels by the factor scale/8. Valid until the
// next call on the same decoder.
struct DecodedImage {
  const uint8_t* pixels = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
  int channels = 3;
  int scale = 8;
};

class JpegDecoder {
 public:
  explicit JpegDecoder(DecodeLimits limits = {}, DecodeOptions options = {});
  ~JpegDecoder();
  JpegDecoder(JpegDecoder&&) noexcept;
  JpegDecoder& operator=(JpegDecoder&&) noexcept;
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads only the header. Throws JpegError on non-JPEG data.
  JpegHeader read_header(const uint8_t* data, size_t size);

  // Decodes the whole image at full size.
  DecodedImage decode(const uint8_t* data, size_t size);

  // Decodes the source region (x, y, width, height) at the smallest scale M/8 (M as the options
  // allow) whose scaled region is at least min_width x min_height (full scale if none is). The
  // returned image is exactly the scaled region (rounded outwards to whole pixels), and its
  // pixels are those of the same region of a full decode at the same scale and upsampling, for
  // every option set (bench/conveyor-decode-check verifies this on random boxes).
  DecodedImage decode_region(const uint8_t* data, size_t size, int x, int y, int width, int height,
                             int min_width, int min_height);

  // The same in two steps, for callers that choose the region from the header: begin() reads the
  // header (throwing as read_header does) and finish_region() decodes, as decode_region() does.
  // The data must stay valid until finish_region() returns.
  JpegHeader begin(const uint8_t* data, size_t size);
  DecodedImage finish_region(int x, int y, int width, int height, int min_width, int min_height);

  // The entropy path of the last decode (decode, decode_region or finish_region).
  JpegEntropyStats last_entropy_stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Encodes interleaved RGB pixels as a baseline JPEG (4:2:0), for generating test data.
std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality = 90);

// How encode_jpeg(rgb, width, height, EncodeOptions) writes a JPEG: every kind of file a decoder
// meets in real datasets, for test corpora, fuzz seeds and benchmarks.
struct EncodeOptions {
  enum class Color {
    kYCbCr,  // the usual photo
    kGray,   // one component (the RGB input's luma)
    kRgb,    // three components stored as RGB (no color transform)
    kCmyk,   // four components, the RGB input converted to CMYK
    kYcck,   // CMYK stored with the YCC transform (Photoshop's default for CMYK)
  };
  Color color = Color::kYCbCr;
  // Luma sampling factors against chroma (YCbCr and YCCK): 1x1 is 4:4:4, 2x1 4:2:2, 2x2 4:2:0,
  // 1x2 4:4:0, 4x1 4:1:1.
  int h_samp = 2;
  int v_samp = 2;
  int quality = 90;
  bool progressive = false;
  bool arithmetic = false;   // arithmetic entropy coding instead of Huffman
  int restart_interval = 0;  // MCUs between restart markers; 0: none
  int orientation = 0;       // 1..8: an EXIF APP1 with that orientation tag; 0: no EXIF
  bool exif_big_endian = false;
  // CMYK and YCCK: write the Adobe APP14 marker, whose files store inverted CMYK (0 = full ink),
  // as Photoshop does. Without it the CMYK values are stored as they are (0 = no ink).
  bool adobe_marker = true;
};
// Throws JpegError when libjpeg-turbo refuses the options (e.g. sampling factors above 4).
std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height,
                                 const EncodeOptions& options);
// The CMYK values (inverted as Adobe files store them when `adobe`) that encode_jpeg stores for
// one RGB pixel; the decoder turns them back into that RGB up to rounding.
void rgb_to_cmyk(const uint8_t* rgb, uint8_t* cmyk, bool adobe);

}  // namespace conveyor
