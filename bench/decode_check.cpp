// conveyor-decode-check: differential verification of Conveyor's fused decode path against plain
// full decodes, on many random (file, crop box, output size) pairs.
//
//   conveyor-decode-check [--data DIR] [--pairs N] [--threads T] [--seed S]
//                         [--write-corpus DIR] [--max-report K] [--stock-entropy]
//                         [--entropy-index] [--entropy-index-file PATH]
//
// Without --data it checks a generated corpus that covers baseline, progressive and arithmetic
// coding; 4:4:4, 4:2:2, 4:2:0, 4:4:0 and 4:1:1; gray, RGB, CMYK (with and without the Adobe
// marker) and YCCK; restart intervals, including intervals that tile the MCU rows of every shape,
// so that regions are decoded from the segments that cover them (crop-proportional decoding);
// sizes from 1x1 to 6000 px, odd sizes and extreme aspect ratios; all 8 EXIF orientations. Random
// boxes and output sizes make the decoders pick every DCT scale they can (1, 2, 4, 8 of 8, and 1..8
// with any_scale).
//
// It then checks PNG (every colour type, bit depth and interlacing, tests/png_writer.h):
// ImageWriter::write against libpng's full decode, cut at the same box, resized with the same
// libyuv filter, flipped and laid out (tests/png_reference.h). Tolerance: none (lossless). Then
// WebP (lossy and lossless, RGB and RGBA, tests/webp_reference.h) against libwebp's full decode
// and the same steps: tolerance none too, lossy included (the decoder crops with a margin, so its
// region is the full decode's). A summary line per codec precedes the last line, which counts all.
//
// Each pair makes two comparisons:
//   region  JpegDecoder::decode_region (one of six option sets: the loader's RGBX + fast
//           upsampling, the default RGB + fancy upsampling, both with any_scale, and both with
//           the discard hook off, DecodeOptions::discard_outside_crop) against the
//           same region cut from TurboJPEG's full decode of the whole image at the same DCT scale
//           with the same upsampling (TJFLAG_FASTUPSAMPLE where the fused path turns fancy
//           upsampling off). Tolerance: none; every byte must match.
//   sample  ImageWriter::write (what the loader runs: ROI decode at the chosen scale, bilinear
//           resize, EXIF orientation, flip, plane split) against the full decode at the same
//           scale, cut at the display box mapped to stored pixels (the EXIF definitions, written
//           out here independently of the loader's) and rounded outwards at that scale, resized
//           with the same libyuv bilinear filter, turned upright, flipped and laid
//           out. Tolerance: none.
// For samples that the fused path decoded below 8/8 it also reports the PSNR of the output
// against the 8/8 decode: what DCT scaling changes, for information, not a pass/fail criterion.
// TurboJPEG cannot be asked for every scale of a tiny image (it picks the largest factor of the
// same size); those references are libjpeg's plain full decode (every row, no skip, no crop).
//
// Every decoder and writer runs the own baseline entropy decoder (DecodeOptions::
// own_entropy_decoder, the default) against the same references, or libjpeg-turbo's with
// --stock-entropy; the counts of regions it took and of those it refused midway (decoded again on
// libjpeg's path) are printed. With --entropy-index, every decoder and writer of every thread
// shares one JpegEntropyIndex
// (issue 35, step 3): the pairs draw their files from the corpus at random, so each file is
// decoded many times, and the decodes after its first start from its entry (counted).
//
// Threads reuse their decoders and writers across files taken in random order, so that state
// carried from one decode to the next is exercised. The last line reads
// `N pairs, M mismatches, max abs diff D, min PSNR P dB`; the exit status is 1 on any mismatch,
// each of which is reported with the file, the box, the scale and the options.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

// jpeglib.h needs size_t and FILE declared first (<cstddef>, <cstdio> above).
#include <jpeglib.h>
#include <libyuv.h>
#include <turbojpeg.h>

#include "../tests/png_reference.h"
#include "../tests/png_writer.h"
#include "../tests/webp_reference.h"
#include "codec/jpeg_segments.h"
#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "jpeg_markers.h"

namespace conveyor::check {
namespace {

namespace fs = std::filesystem;

struct Config {
  std::string data;
  uint64_t pairs = 20000;
  size_t threads = std::max(1u, std::thread::hardware_concurrency());
  uint64_t seed = 1;
  std::string write_corpus;
  size_t max_report = 20;
  // DecodeOptions::own_entropy_decoder in every decoder and writer (--stock-entropy: off)
  bool own_entropy = DecodeOptions{}.own_entropy_decoder;
  // --entropy-index: DecodeOptions::entropy_index, shared by every decoder and writer
  std::shared_ptr<JpegEntropyIndex> entropy_index;
};

[[noreturn]] void usage(const std::string& error) {
  if (!error.empty()) std::cerr << "conveyor-decode-check: " << error << "\n\n";
  std::cerr << R"(usage: conveyor-decode-check [options]
  --data DIR          check the .jpg/.jpeg files under DIR (default: a generated corpus)
  --pairs N           (file, box, output size) pairs to check (default 20000)
  --threads T         checking threads, each reusing its decoders (default: all cores)
  --seed S            seed of the pairs (default 1)
  --write-corpus DIR  write the generated corpus into DIR as .jpg files and exit
  --max-report K      mismatches reported in full (default 20)
  --stock-entropy     decode with libjpeg-turbo's entropy decoder, not the own one (the default,
                      DecodeOptions::own_entropy_decoder)
  --entropy-index     one JpegEntropyIndex shared by every decoder (not with --stock-entropy)
  --entropy-index-file PATH
                      --entropy-index, loaded from PATH when it exists and saved there at the end
)";
  std::exit(error.empty() ? 0 : 2);
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    auto number = [&]() -> uint64_t {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') usage(a + ": '" + v + "' is not a number");
      return n;
    };
    if (a == "--data") {
      c.data = value();
    } else if (a == "--pairs") {
      c.pairs = number();
    } else if (a == "--threads") {
      c.threads = std::max<uint64_t>(1, number());
    } else if (a == "--seed") {
      c.seed = number();
    } else if (a == "--write-corpus") {
      c.write_corpus = value();
    } else if (a == "--max-report") {
      c.max_report = number();
    } else if (a == "--stock-entropy") {
      c.own_entropy = false;
    } else if (a == "--entropy-index") {
      if (!c.entropy_index) c.entropy_index = std::make_shared<JpegEntropyIndex>();
    } else if (a == "--entropy-index-file") {
      c.entropy_index = std::make_shared<JpegEntropyIndex>(JpegEntropyIndex::kDefaultBudgetBytes,
                                                           std::filesystem::path(value()));
    } else if (a == "--help" || a == "-h") {
      usage("");
    } else {
      usage("unknown option " + a);
    }
  }
  if (c.entropy_index && !c.own_entropy) usage("--entropy-index needs the own entropy decoder");
  return c;
}

// ---------------------------------------------------------------------------------------------
// The generated corpus

struct CorpusFile {
  std::string name;
  std::vector<uint8_t> bytes;
};

// Photo-like pixels: gradients, hard edges and noise, so that every DCT coefficient is used and
// chroma errors show.
std::vector<uint8_t> texture(int w, int h, uint64_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  SampleRng rng(seed, 0, 0);
  const int cx = rng.randint(0, w), cy = rng.randint(0, h);
  const double fx = rng.uniform(0.01, 0.3), fy = rng.uniform(0.01, 0.3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * static_cast<size_t>(w) + x) * 3];
      const bool inside = (x - cx) * (x - cx) + (y - cy) * (y - cy) < (w * w + h * h) / 16;
      for (int c = 0; c < 3; ++c) {
        double v = 128 + 90 * std::sin(fx * x * (c + 1) + fy * y) + (inside ? 40 * (c - 1) : 0);
        v += static_cast<double>(rng.next() % 41) - 20.0;
        p[c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return rgb;
}

std::vector<CorpusFile> generate_corpus() {
  using C = EncodeOptions::Color;
  struct Shape {
    const char* name;
    C color;
    int h, v;
    bool adobe;
  };
  const Shape shapes[] = {{"420", C::kYCbCr, 2, 2, true},        {"422", C::kYCbCr, 2, 1, true},
                          {"444", C::kYCbCr, 1, 1, true},        {"440", C::kYCbCr, 1, 2, true},
                          {"411", C::kYCbCr, 4, 1, true},        {"gray", C::kGray, 1, 1, true},
                          {"rgb", C::kRgb, 1, 1, true},          {"cmyk", C::kCmyk, 1, 1, true},
                          {"cmyk-plain", C::kCmyk, 1, 1, false}, {"ycck", C::kYcck, 2, 2, true}};
  struct Coding {
    const char* name;
    bool progressive, arithmetic;
    int restart;
  };
  const Coding codings[] = {{"baseline", false, false, 0},
                            {"progressive", true, false, 0},
                            {"arith", false, true, 0},
                            {"arith-progressive", true, true, 0},
                            {"restart1", false, false, 1},
                            {"restart7", false, false, 7},
                            {"progressive-restart3", true, false, 3}};
  const std::pair<int, int> sizes[] = {{1, 1},     {2, 3},     {7, 5},     {8, 8},
                                       {15, 17},   {16, 16},   {33, 9},    {64, 48},
                                       {127, 95},  {250, 251}, {500, 375}, {375, 500},
                                       {333, 333}, {1000, 13}, {13, 1000}, {1201, 799}};
  std::vector<CorpusFile> files;
  uint64_t n = 0;
  // Every shape in every coding, at a size that moves through the list.
  for (const Shape& s : shapes) {
    for (const Coding& c : codings) {
      const auto [w, h] = sizes[n % std::size(sizes)];
      EncodeOptions o;
      o.color = s.color;
      o.h_samp = s.h;
      o.v_samp = s.v;
      o.adobe_marker = s.adobe;
      o.progressive = c.progressive;
      o.arithmetic = c.arithmetic;
      o.restart_interval = c.restart;
      o.quality = 70 + static_cast<int>(n * 7 % 30);
      const auto rgb = texture(w, h, n);
      files.push_back(
          {std::string(s.name) + "-" + c.name + "-" + std::to_string(w) + "x" + std::to_string(h),
           encode_jpeg(rgb.data(), w, h, o)});
      ++n;
    }
  }
  // Restart intervals that tile the MCU rows, so that regions decode from the segments that
  // cover them (crop-proportional decoding, issue 12): every shape, at widths whose MCUs per row
  // the intervals divide (512 and 480 px hold 16-64 and 15-60 MCUs), odd heights.
  for (const Shape& s : shapes) {
    for (const auto& [w, h, interval] :
         {std::tuple{512, 383, 2}, std::tuple{480, 271, 4}, std::tuple{96, 1001, 3}}) {
      EncodeOptions o;
      o.color = s.color;
      o.h_samp = s.h;
      o.v_samp = s.v;
      o.adobe_marker = s.adobe;
      o.restart_interval = interval;
      o.quality = 70 + static_cast<int>(n * 7 % 30);
      const auto rgb = texture(w, h, n++);
      files.push_back({std::string(s.name) + "-segments" + std::to_string(interval) + "-" +
                           std::to_string(w) + "x" + std::to_string(h),
                       encode_jpeg(rgb.data(), w, h, o)});
      // The same with conveyor-prepare's segment index: the intervals come from the index.
      std::vector<uint8_t> indexed;
      if (detail::add_segment_index(files.back().bytes.data(), files.back().bytes.size(),
                                    indexed)) {
        files.push_back({files.back().name + "-indexed", std::move(indexed)});
      }
    }
  }
  // All 8 EXIF orientations, on 4:2:0 and 4:2:2 files of odd sizes, in both byte orders.
  for (int orientation = 1; orientation <= 8; ++orientation) {
    for (const auto& [w, h, hs, vs] :
         {std::tuple{123, 77, 2, 2}, std::tuple{64, 200, 2, 1}, std::tuple{500, 333, 2, 2}}) {
      EncodeOptions o;
      o.h_samp = hs;
      o.v_samp = vs;
      o.orientation = orientation;
      o.exif_big_endian = orientation % 2 == 0;
      const auto rgb = texture(w, h, n++);
      files.push_back(
          {"exif" + std::to_string(orientation) + "-" + std::to_string(w) + "x" + std::to_string(h),
           encode_jpeg(rgb.data(), w, h, o)});
    }
  }
  // Large and extreme: about 6000 px on the long side.
  for (const auto& [w, h, progressive] :
       {std::tuple{6000, 4000, false}, std::tuple{6000, 24, false}, std::tuple{17, 6000, true},
        std::tuple{3001, 2001, false}}) {
    EncodeOptions o;
    o.progressive = progressive;
    const auto rgb = texture(w, h, n++);
    files.push_back({std::string("large-") + (progressive ? "progressive-" : "") +
                         std::to_string(w) + "x" + std::to_string(h),
                     encode_jpeg(rgb.data(), w, h, o)});
  }
  return files;
}

std::vector<CorpusFile> read_corpus(const std::string& dir) {
  std::vector<CorpusFile> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::string ext = entry.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (ext != ".jpg" && ext != ".jpeg") continue;
    CorpusFile f;
    f.name = entry.path().string();
    read_file(f.name, f.bytes);
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(),
            [](const CorpusFile& a, const CorpusFile& b) { return a.name < b.name; });
  if (files.empty()) throw std::runtime_error("no .jpg/.jpeg files under " + dir);
  return files;
}

// ---------------------------------------------------------------------------------------------
// The reference: TurboJPEG's full decode, cached

struct Reference {
  int width = 0, height = 0;  // at the scale decoded
  std::vector<uint8_t> rgbx;  // width x height RGBX (X unspecified)
};

class ReferenceCache {
 public:
  explicit ReferenceCache(const std::vector<CorpusFile>& files) : files_(files) {}

  // The full decode of file `f` at `scale`/8, fancy or fast upsampling; nullptr when TurboJPEG
  // cannot decode the file (then `error` says why).
  std::shared_ptr<const Reference> get(size_t f, int scale, bool fast, std::string& error) {
    const auto key = std::make_tuple(f, scale, fast);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return it->second;
    }
    auto ref = decode(files_[f].bytes, scale, fast, error);
    if (!ref) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes_ + ref->rgbx.size() <= kBudget) {
      bytes_ += ref->rgbx.size();
      cache_.emplace(key, ref);
    }
    return ref;
  }

 private:
  static constexpr size_t kBudget = size_t{3} << 30;

  // TurboJPEG picks the largest scaling factor whose size fits the one asked for, so for tiny
  // images it cannot be asked for every scale (a 2x3 image is 1x1 at 1/8 and at 2/8; it decodes
  // 2/8). Such decodes go through libjpeg's own API: a fresh decompressor, every row, no skip and
  // no crop, which is what TurboJPEG does inside.
  static bool turbojpeg_can_decode_at(int w, int h, int scale) {
    int count = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&count);
    for (int i = 0; i < count; ++i) {
      const tjscalingfactor f = factors[i];
      if (f.num * 8 <= scale * f.denom) continue;  // not larger than scale/8
      if (TJSCALED(w, f) == (w * scale + 7) / 8 && TJSCALED(h, f) == (h * scale + 7) / 8) {
        return false;
      }
    }
    return true;
  }

  static bool libjpeg_decode(const std::vector<uint8_t>& bytes, int scale, bool fast, bool cmyk,
                             Reference& ref, std::string& error);

  static std::shared_ptr<Reference> decode(const std::vector<uint8_t>& bytes, int scale, bool fast,
                                           std::string& error) {
    tjhandle handle = tjInitDecompress();
    int w = 0, h = 0, sub = 0, cs = 0;
    auto ref = std::make_shared<Reference>();
    bool ok = tjDecompressHeader3(handle, bytes.data(), bytes.size(), &w, &h, &sub, &cs) == 0;
    const bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    if (ok) {
      ref->width = (w * scale + 7) / 8;
      ref->height = (h * scale + 7) / 8;
      ref->rgbx.resize(static_cast<size_t>(ref->width) * static_cast<size_t>(ref->height) * 4);
      if (turbojpeg_can_decode_at(w, h, scale)) {
        ok = tjDecompress2(handle, bytes.data(), bytes.size(), ref->rgbx.data(), ref->width, 0,
                           ref->height, cmyk ? TJPF_CMYK : TJPF_RGBX,
                           fast ? TJFLAG_FASTUPSAMPLE : 0) == 0 ||
             tjGetErrorCode(handle) == TJERR_WARNING;
        if (!ok) error = tjGetErrorStr2(handle);
      } else {
        ok = libjpeg_decode(bytes, scale, fast, cmyk, *ref, error);
      }
    } else {
      error = tjGetErrorStr2(handle);
    }
    tjDestroy(handle);
    if (ok && cmyk) {  // to RGB as a user would: inverted (Adobe) values, R = C * K / 255
      const bool inverted = bench::has_adobe_marker(bytes);
      for (size_t i = 0; i < ref->rgbx.size(); i += 4) {
        uint8_t* p = &ref->rgbx[i];
        unsigned c = p[0], m = p[1], y = p[2], k = p[3];
        if (!inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        p[0] = static_cast<uint8_t>(c * k / 255);
        p[1] = static_cast<uint8_t>(m * k / 255);
        p[2] = static_cast<uint8_t>(y * k / 255);
      }
    }
    return ok ? ref : nullptr;
  }

  const std::vector<CorpusFile>& files_;
  std::mutex mutex_;
  std::map<std::tuple<size_t, int, bool>, std::shared_ptr<const Reference>> cache_;
  size_t bytes_ = 0;
};

struct PlainError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
};

[[noreturn]] void plain_error_exit(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<PlainError*>(cinfo->err)->jump, 1);
}

bool ReferenceCache::libjpeg_decode(const std::vector<uint8_t>& bytes, int scale, bool fast,
                                    bool cmyk, Reference& ref, std::string& error) {
  jpeg_decompress_struct cinfo{};
  PlainError err{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = plain_error_exit;
  char message[JMSG_LENGTH_MAX] = {};
  if (setjmp(err.jump)) {
    (*cinfo.err->format_message)(reinterpret_cast<j_common_ptr>(&cinfo), message);
    jpeg_destroy_decompress(&cinfo);
    error = message;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.scale_num = static_cast<unsigned>(scale);
  cinfo.scale_denom = 8;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGBX;
  cinfo.do_fancy_upsampling = fast ? FALSE : TRUE;
  jpeg_start_decompress(&cinfo);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = ref.rgbx.data() +
                   static_cast<size_t>(cinfo.output_scanline) * static_cast<size_t>(ref.width) * 4;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Comparisons

struct Stats {
  uint64_t pairs = 0, mismatches = 0, region_checks = 0, sample_checks = 0;
  uint64_t skipped = 0;  // files the reference cannot decode (with --data)
  int max_abs_diff = 0;
  double min_psnr = INFINITY;           // over sample checks
  double min_scaled_psnr = INFINITY;    // scaled decodes against the 8/8 reference
  uint64_t scale_count[9] = {};         // sample checks by DCT scale
  uint64_t region_scale_count[9] = {};  // region checks by DCT scale
  uint64_t region_discard_hooked = 0;   // region checks decoded through the discard hook
  uint64_t region_own_entropy = 0;      // region checks decoded by the own entropy decoder
  uint64_t region_own_retried = 0;      // ... that it refused midway (decoded again by libjpeg)
  uint64_t region_index_found = 0;      // ... that started from the file's entropy index entry
  uint64_t oriented = 0;
  uint64_t scaled_samples = 0;
  double scaled_psnr_sum = 0;
  void merge(const Stats& o) {
    pairs += o.pairs;
    mismatches += o.mismatches;
    region_checks += o.region_checks;
    region_discard_hooked += o.region_discard_hooked;
    region_own_entropy += o.region_own_entropy;
    region_own_retried += o.region_own_retried;
    region_index_found += o.region_index_found;
    sample_checks += o.sample_checks;
    skipped += o.skipped;
    max_abs_diff = std::max(max_abs_diff, o.max_abs_diff);
    min_psnr = std::min(min_psnr, o.min_psnr);
    min_scaled_psnr = std::min(min_scaled_psnr, o.min_scaled_psnr);
    for (int i = 0; i < 9; ++i) {
      scale_count[i] += o.scale_count[i];
      region_scale_count[i] += o.region_scale_count[i];
    }
    oriented += o.oriented;
    scaled_samples += o.scaled_samples;
    scaled_psnr_sum += o.scaled_psnr_sum;
  }
};

struct Diff {
  int max_abs = 0;
  double psnr = INFINITY;
  size_t first = SIZE_MAX;  // index of the first differing byte
};

Diff compare(const uint8_t* a, const uint8_t* b, size_t n) {
  Diff d;
  double sse = 0;
  for (size_t i = 0; i < n; ++i) {
    const int e = std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
    if (e != 0 && d.first == SIZE_MAX) d.first = i;
    d.max_abs = std::max(d.max_abs, e);
    sse += static_cast<double>(e) * e;
  }
  if (sse > 0) d.psnr = 10 * std::log10(255.0 * 255.0 * static_cast<double>(n) / sse);
  return d;
}

// ---------------------------------------------------------------------------------------------
// One checking thread

struct DecoderSet {
  const char* name;
  DecodeOptions options;
};

std::vector<DecoderSet> decoder_sets(const Config& config) {
  std::vector<DecoderSet> sets;
  for (const bool fast : {true, false}) {
    for (const bool any : {false, true}) {
      DecodeOptions o;
      o.channels = fast ? 4 : 3;
      o.fast_upsampling = fast;
      o.any_scale = any;
      sets.push_back({fast ? (any ? "RGBX fast any_scale" : "RGBX fast (the loader's)")
                           : (any ? "RGB fancy any_scale" : "RGB fancy (the default)"),
                      o});
    }
  }
  // The same without the JPEG discard hook (DecodeOptions::discard_outside_crop), which every set
  // above and the ImageWriters use: both paths against the same references.
  for (const bool fast : {true, false}) {
    DecodeOptions o;
    o.channels = fast ? 4 : 3;
    o.fast_upsampling = fast;
    o.discard_outside_crop = false;
    sets.push_back({fast ? "RGBX fast, no discard hook" : "RGB fancy, no discard hook", o});
  }
  for (auto& set : sets) {
    set.options.own_entropy_decoder = config.own_entropy;
    set.options.entropy_index = config.entropy_index;
  }
  return sets;
}

// The transforms each thread's ImageWriters apply; a writer, like a loader worker, keeps its
// decoder across files.
std::vector<ImageTransform> transforms(const Config& config) {
  std::vector<ImageTransform> t;
  for (const int size : {1, 7, 32, 64, 112, 224, 333}) {
    for (const auto layout : {ImageLayout::kCHW, ImageLayout::kHWC}) {
      ImageTransform rrc = ImageTransform::train(size);
      rrc.layout = layout;
      rrc.exif_orientation = size % 2 == 0;
      t.push_back(rrc);
    }
    ImageTransform eval = ImageTransform::eval(size, size + size / 7);
    eval.exif_orientation = true;
    t.push_back(eval);
    ImageTransform whole;
    whole.mode = ImageTransform::Mode::kResize;
    whole.size = size;
    whole.exif_orientation = size % 3 == 0;
    t.push_back(whole);
  }
  for (auto& transform : t) {
    transform.own_entropy_decoder = config.own_entropy;
    transform.entropy_index = config.entropy_index;
  }
  return t;
}

class Checker {
 public:
  Checker(const std::vector<CorpusFile>& files, ReferenceCache& cache, const Config& config,
          size_t thread, std::mutex& report_mutex, std::atomic<uint64_t>& reported)
      : files_(files),
        cache_(cache),
        config_(config),
        rng_(config.seed, 0xC0FFEE, thread),
        report_mutex_(report_mutex),
        reported_(reported) {
    for (const auto& s : decoder_sets(config)) {
      sets_.push_back(s);
      decoders_.emplace_back(DecodeLimits{}, s.options);
    }
    for (const auto& t : transforms(config)) writers_.emplace_back(t);
  }

  void run(uint64_t pairs) {
    for (uint64_t i = 0; i < pairs; ++i) {
      const size_t f = static_cast<size_t>(rng_.next() % files_.size());
      check_region(f);
      check_sample(f);
      ++stats.pairs;
    }
  }

  Stats stats;

 private:
  void mismatch(const std::string& what) {
    ++stats.mismatches;
    if (reported_.fetch_add(1) < config_.max_report) {
      std::lock_guard<std::mutex> lock(report_mutex_);
      std::cout << "MISMATCH " << what << "\n";
    }
  }

  std::string describe_box(size_t f, int x, int y, int w, int h) const {
    std::ostringstream s;
    s << files_[f].name << " box (" << x << ", " << y << ") " << w << "x" << h;
    return s.str();
  }

  // A random box in a w x h image: any box, a tiny one, the whole image, or an RRC-like one.
  void random_box(int w, int h, int& x, int& y, int& bw, int& bh) {
    switch (rng_.next() % 4) {
      case 0: {  // any
        const int x0 = rng_.randint(0, w), x1 = rng_.randint(0, w);
        const int y0 = rng_.randint(0, h), y1 = rng_.randint(0, h);
        x = std::min(x0, x1), y = std::min(y0, y1);
        bw = std::abs(x1 - x0) + 1, bh = std::abs(y1 - y0) + 1;
        return;
      }
      case 1:  // tiny, often at an edge
        bw = std::min(w, rng_.randint(1, 4)), bh = std::min(h, rng_.randint(1, 4));
        x = rng_.next() % 3 == 0 ? w - bw : rng_.randint(0, w - bw + 1);
        y = rng_.next() % 3 == 0 ? h - bh : rng_.randint(0, h - bh + 1);
        return;
      case 2:  // whole
        x = y = 0, bw = w, bh = h;
        return;
      default: {  // area 8%..100%, aspect 3/4..4/3
        const CropBox b = choose_crop(ImageTransform::train(), w, h, rng_.next(), 0, 0);
        x = b.x, y = b.y, bw = b.width, bh = b.height;
        return;
      }
    }
  }

  void check_region(size_t f) {
    const size_t s = static_cast<size_t>(rng_.next() % sets_.size());
    JpegDecoder& decoder = decoders_[s];
    const auto& bytes = files_[f].bytes;
    JpegHeader header;
    try {
      header = decoder.read_header(bytes.data(), bytes.size());
    } catch (const std::exception& e) {
      return reference_only_failure(f, e.what());
    }
    int x, y, w, h;
    random_box(header.width, header.height, x, y, w, h);
    // Output sizes that make the chooser pick every scale: from an eighth of the box to more
    // than the box (full scale), or a fixed 224.
    int min_w = 224, min_h = 224;
    switch (rng_.next() % 4) {
      case 0:
        min_w = std::max(1, w / rng_.randint(1, 9)), min_h = std::max(1, h / rng_.randint(1, 9));
        break;
      case 1:
        min_w = rng_.randint(1, w + 2), min_h = rng_.randint(1, h + 2);
        break;
      case 2:
        min_w = w + 1, min_h = h + 1;
        break;
      default:
        break;
    }
    DecodedImage image;
    const std::string what = describe_box(f, x, y, w, h) + " min " + std::to_string(min_w) + "x" +
                             std::to_string(min_h) + " options " + sets_[s].name;
    try {
      image = decoder.decode_region(bytes.data(), bytes.size(), x, y, w, h, min_w, min_h);
    } catch (const std::exception& e) {
      std::string ref_error;
      if (cache_.get(f, 8, true, ref_error)) {
        mismatch("region " + what + ": the fused path failed where TurboJPEG decodes: " + e.what());
      } else {
        ++stats.skipped;
      }
      return;
    }
    ++stats.region_checks;
    ++stats.region_scale_count[image.scale];
    const JpegEntropyStats entropy = decoder.last_entropy_stats();
    if (entropy.path == JpegEntropyPath::kDiscardOutsideCrop) ++stats.region_discard_hooked;
    if (entropy.path == JpegEntropyPath::kOwnDecoder) ++stats.region_own_entropy;
    if (entropy.own_decoder_retried) ++stats.region_own_retried;
    if (entropy.index_found) ++stats.region_index_found;
    std::string ref_error;
    auto ref = cache_.get(f, image.scale, sets_[s].options.fast_upsampling, ref_error);
    if (!ref) {
      mismatch("region " + what + ": TurboJPEG fails where the fused path decodes: " + ref_error);
      return;
    }
    const int sx0 = static_cast<int>(static_cast<long long>(x) * image.scale / 8);
    const int sy0 = static_cast<int>(static_cast<long long>(y) * image.scale / 8);
    const int sx1 = std::min(
        ref->width, static_cast<int>((static_cast<long long>(x + w) * image.scale + 7) / 8));
    const int sy1 = std::min(
        ref->height, static_cast<int>((static_cast<long long>(y + h) * image.scale + 7) / 8));
    const std::string at = what + " scale " + std::to_string(image.scale) + "/8";
    if (image.width != sx1 - sx0 || image.height != sy1 - sy0) {
      mismatch("region " + at + ": size " + std::to_string(image.width) + "x" +
               std::to_string(image.height) + ", want " + std::to_string(sx1 - sx0) + "x" +
               std::to_string(sy1 - sy0));
      return;
    }
    const size_t channels = static_cast<size_t>(image.channels);
    for (int r = 0; r < image.height; ++r) {
      const uint8_t* got = image.pixels + static_cast<size_t>(r) * image.stride;
      const uint8_t* want =
          &ref->rgbx[(static_cast<size_t>(sy0 + r) * static_cast<size_t>(ref->width) +
                      static_cast<size_t>(sx0)) *
                     4];
      for (int c = 0; c < image.width; ++c) {
        for (size_t k = 0; k < 3; ++k) {
          const int e =
              std::abs(static_cast<int>(got[c * channels + k]) - static_cast<int>(want[c * 4 + k]));
          if (e != 0) {
            stats.max_abs_diff = std::max(stats.max_abs_diff, e);
            mismatch("region " + at + ": pixel (" + std::to_string(c) + ", " + std::to_string(r) +
                     ") channel " + std::to_string(k) + " is " +
                     std::to_string(got[c * channels + k]) + ", TurboJPEG's " +
                     std::to_string(want[c * 4 + k]));
            return;
          }
        }
      }
    }
  }

  void reference_only_failure(size_t f, const std::string& message) {
    std::string ref_error;
    if (cache_.get(f, 8, true, ref_error)) {
      mismatch(files_[f].name +
               ": the fused path cannot read the header TurboJPEG reads: " + message);
    } else {
      ++stats.skipped;
    }
  }

  void check_sample(size_t f) {
    const size_t t = static_cast<size_t>(rng_.next() % writers_.size());
    ImageWriter& writer = writers_[t];
    const ImageTransform& transform = writer.transform();
    const int side = transform.size;
    const size_t plane = static_cast<size_t>(side) * static_cast<size_t>(side);
    out_.resize(plane * 3);
    SampleContext ctx;
    ctx.seed = rng_.next();
    ctx.epoch = rng_.next() % 100;
    ctx.index = static_cast<size_t>(rng_.next() % 1000000);
    const auto& bytes = files_[f].bytes;
    try {
      writer.write(bytes.data(), bytes.size(), ctx, reinterpret_cast<std::byte*>(out_.data()));
    } catch (const std::exception& e) {
      std::string ref_error;
      if (cache_.get(f, 8, true, ref_error)) {
        mismatch("sample " + files_[f].name +
                 ": the fused path failed where TurboJPEG decodes: " + e.what());
      } else {
        ++stats.skipped;
      }
      return;
    }
    ++stats.sample_checks;
    const int scale = writer.last_scale();
    ++stats.scale_count[scale];
    // The display orientation the writer honoured.
    int orientation = 1;
    if (transform.exif_orientation) orientation = header_orientation(bytes);
    if (orientation != 1) ++stats.oriented;

    std::string ref_error;
    auto ref = cache_.get(f, scale, true, ref_error);
    if (!ref) {
      mismatch("sample " + files_[f].name +
               ": TurboJPEG fails where the fused path decodes: " + ref_error);
      return;
    }
    const auto head = decoders_[0].read_header(bytes.data(), bytes.size());
    const bool swapped = orientation >= 5;
    const int disp_w = swapped ? head.height : head.width;
    const int disp_h = swapped ? head.width : head.height;
    const CropBox box = choose_crop(transform, disp_w, disp_h, ctx.seed, ctx.epoch, ctx.index);
    reference_sample(*ref, head.width, head.height, orientation, box, scale, transform, want_);
    const Diff d = compare(out_.data(), want_.data(), plane * 3);
    std::ostringstream what;
    what << "sample " << files_[f].name << " box (" << box.x << ", " << box.y << ") " << box.width
         << "x" << box.height << (box.flip ? " flipped" : "") << " to " << side << "x" << side
         << (transform.layout == ImageLayout::kCHW ? " CHW" : " HWC") << " scale " << scale
         << "/8 orientation " << orientation;
    constexpr int tolerance = 0;
    stats.max_abs_diff = std::max(stats.max_abs_diff, d.max_abs);
    stats.min_psnr = std::min(stats.min_psnr, d.psnr);
    if (d.max_abs > tolerance) {
      what << ": max abs diff " << d.max_abs << " (tolerance " << tolerance << "), PSNR " << d.psnr
           << " dB, first at byte " << d.first;
      mismatch(what.str());
      return;
    }
    if (scale != 8) {
      // What DCT scaling changes: the output against the 8/8 reference.
      auto full = cache_.get(f, 8, true, ref_error);
      if (!full) return;
      reference_sample(*full, head.width, head.height, orientation, box, 8, transform, want_);
      const Diff q = compare(out_.data(), want_.data(), plane * 3);
      stats.min_scaled_psnr = std::min(stats.min_scaled_psnr, q.psnr);
      stats.scaled_psnr_sum += std::min(q.psnr, 99.0);
      ++stats.scaled_samples;
    }
  }

  int header_orientation(const std::vector<uint8_t>& bytes) {
    DecodeOptions o;
    o.read_orientation = true;
    if (!orientation_reader_)
      orientation_reader_ = std::make_unique<JpegDecoder>(DecodeLimits{}, o);
    return orientation_reader_->read_header(bytes.data(), bytes.size()).orientation;
  }

  // The stored pixel of a W x H image that shows at (u, v) when EXIF orientation `o` is
  // honoured (the TIFF/EXIF definitions, written out independently of the loader's).
  static std::pair<int, int> to_stored(int u, int v, int o, int w, int h) {
    switch (o) {
      case 2:
        return {w - 1 - u, v};
      case 3:
        return {w - 1 - u, h - 1 - v};
      case 4:
        return {u, h - 1 - v};
      case 5:
        return {v, u};
      case 6:
        return {v, h - 1 - u};
      case 7:
        return {w - 1 - v, h - 1 - u};
      case 8:
        return {w - 1 - v, u};
      default:
        return {u, v};
    }
  }

  // The reference of one sample: the display box (of a stored full_w x full_h image) mapped to
  // stored pixels, rounded outwards at `scale` (as any decode at that scale must), cut from the
  // full decode at `scale`, resized with libyuv's bilinear filter, turned upright,
  // flipped, and laid out as the transform asks.
  static void reference_sample(const Reference& ref, int full_w, int full_h, int orientation,
                               const CropBox& box, int scale, const ImageTransform& t,
                               std::vector<uint8_t>& out) {
    const auto [ax, ay] = to_stored(box.x, box.y, orientation, full_w, full_h);
    const auto [bx, by] =
        to_stored(box.x + box.width - 1, box.y + box.height - 1, orientation, full_w, full_h);
    const long long x0 = std::min(ax, bx), x1 = std::max(ax, bx) + 1;
    const long long y0 = std::min(ay, by), y1 = std::max(ay, by) + 1;
    const int sx1 = std::min(ref.width, static_cast<int>((x1 * scale + 7) / 8));
    const int sy1 = std::min(ref.height, static_cast<int>((y1 * scale + 7) / 8));
    const int sx0 = std::min(static_cast<int>(x0 * scale / 8), sx1 - 1);
    const int sy0 = std::min(static_cast<int>(y0 * scale / 8), sy1 - 1);
    const int side = t.size;
    const int row = side * 4;
    Reference square;
    square.width = square.height = side;
    square.rgbx.resize(static_cast<size_t>(row) * static_cast<size_t>(side));
    const size_t ref_row = static_cast<size_t>(ref.width) * 4;
    libyuv::ARGBScale(
        ref.rgbx.data() + static_cast<size_t>(sy0) * ref_row + static_cast<size_t>(sx0) * 4,
        static_cast<int>(ref_row), sx1 - sx0, sy1 - sy0, square.rgbx.data(), row, side, side,
        libyuv::kFilterBilinear);
    // Upright: display pixel (u, v) is the stored pixel to_stored(u, v) of the square.
    std::vector<uint8_t> scaled(square.rgbx.size());
    for (int v = 0; v < side; ++v) {
      for (int u = 0; u < side; ++u) {
        const auto [x, y] = to_stored(u, v, orientation, side, side);
        std::memcpy(&scaled[(static_cast<size_t>(v) * side + u) * 4],
                    &square.rgbx[(static_cast<size_t>(y) * side + x) * 4], 4);
      }
    }
    if (box.flip) {
      std::vector<uint8_t> mirrored(scaled.size());
      libyuv::ARGBMirror(scaled.data(), row, mirrored.data(), row, side, side);
      scaled.swap(mirrored);
    }
    const size_t plane = static_cast<size_t>(side) * static_cast<size_t>(side);
    out.resize(plane * 3);
    for (size_t i = 0; i < plane; ++i) {
      for (size_t c = 0; c < 3; ++c) {
        const uint8_t v = scaled[i * 4 + c];
        if (t.layout == ImageLayout::kCHW) {
          out[c * plane + i] = v;
        } else {
          out[i * 3 + c] = v;
        }
      }
    }
  }

  const std::vector<CorpusFile>& files_;
  ReferenceCache& cache_;
  const Config& config_;
  SampleRng rng_;
  std::mutex& report_mutex_;
  std::atomic<uint64_t>& reported_;
  std::vector<DecoderSet> sets_;
  std::vector<JpegDecoder> decoders_;
  std::vector<ImageWriter> writers_;
  std::unique_ptr<JpegDecoder> orientation_reader_;
  std::vector<uint8_t> out_, want_;
};

// A lossless codec's files (issue 32) through ImageWriter against their references' full decode
// then the same crop, resize, flip and layout (tests/png_reference.h's expected_row). Tolerance
// none: PNG (every colour type, bit depth and interlacing, tests/png_writer.h, against libpng)
// and WebP (lossy and lossless, RGB and RGBA, tests/webp_reference.h, against libwebp's full
// decode: the decoder's cropping gives the full decode's pixels, lossy included).
struct CodecStats {
  uint64_t files = 0, samples = 0, mismatches = 0;
  int max_abs_diff = 0;
};

CodecStats check_codec(const char* codec, const Config& config, uint64_t samples,
                       const std::vector<testing::WebpFile>& files,
                       const std::vector<testing::Reference>& references, std::mutex& report_mutex,
                       std::atomic<uint64_t>& reported) {
  CodecStats stats;
  stats.files = files.size();
  std::vector<ImageWriter> writers;
  for (const ImageTransform& t : transforms(config)) writers.emplace_back(t);
  SampleRng rng(config.seed, 0x9E6, 0);
  for (uint64_t i = 0; i < samples; ++i) {
    const size_t f = static_cast<size_t>(rng.randint(0, static_cast<int>(files.size())));
    ImageWriter& writer =
        writers[static_cast<size_t>(rng.randint(0, static_cast<int>(writers.size())))];
    const SampleContext ctx{0, i, config.seed + i % 7, i % 3};
    const int side = writer.transform().size;
    std::vector<uint8_t> row(static_cast<size_t>(side) * side * 3);
    writer.write(files[f].bytes.data(), files[f].bytes.size(), ctx,
                 reinterpret_cast<std::byte*>(row.data()));
    const std::vector<uint8_t> expected =
        testing::expected_row(references[f], writer.transform(), ctx);
    const Diff d = compare(row.data(), expected.data(), row.size());
    ++stats.samples;
    stats.max_abs_diff = std::max(stats.max_abs_diff, d.max_abs);
    if (d.max_abs == 0) continue;
    ++stats.mismatches;
    if (reported.fetch_add(1) < config.max_report) {
      std::lock_guard<std::mutex> lock(report_mutex);
      std::cout << "MISMATCH " << codec << " " << files[f].name << " output " << side << " index "
                << i << ": max abs diff " << d.max_abs << " at byte " << d.first << "\n";
    }
  }
  return stats;
}

CodecStats check_png(const Config& config, uint64_t samples, std::mutex& report_mutex,
                     std::atomic<uint64_t>& reported) {
  std::vector<testing::WebpFile> files;  // a name and bytes, whatever the format
  std::vector<testing::Reference> references;
  uint64_t seed = config.seed;
  const int sizes[][2] = {{1, 1}, {3, 1}, {1, 5}, {17, 13}, {64, 47}, {201, 150}, {500, 375}};
  for (testing::PngSpec kind : testing::every_png_kind()) {
    for (const auto& wh : sizes) {
      for (const bool interlaced : {false, true}) {
        kind.width = wh[0];
        kind.height = wh[1];
        kind.interlaced = interlaced;
        kind.transparency = seed % 3 == 0 && kind.color_type != 4 && kind.color_type != 6;
        const testing::PngFile png = testing::make_png(kind, seed++);
        references.push_back(testing::reference_of(png));
        files.push_back({testing::describe(png.spec), png.bytes});
      }
    }
  }
  return check_codec("png", config, samples, files, references, report_mutex, reported);
}

CodecStats check_webp(const Config& config, uint64_t samples, std::mutex& report_mutex,
                      std::atomic<uint64_t>& reported) {
  const int sizes[][2] = {{1, 1}, {3, 1}, {1, 5}, {17, 13}, {64, 47}, {201, 150}, {500, 375}};
  const std::vector<testing::WebpFile> files = testing::encoded_webps(sizes, config.seed);
  std::vector<testing::Reference> references;
  for (const testing::WebpFile& f : files) references.push_back(testing::webp_reference(f));
  return check_codec("webp", config, samples, files, references, report_mutex, reported);
}

int run(const Config& config) {
  if (!config.write_corpus.empty()) {
    fs::create_directories(config.write_corpus);
    const auto files = generate_corpus();
    for (const auto& f : files) {
      const fs::path path = fs::path(config.write_corpus) / (f.name + ".jpg");
      std::FILE* out = std::fopen(path.c_str(), "wb");
      if (out == nullptr || std::fwrite(f.bytes.data(), 1, f.bytes.size(), out) != f.bytes.size()) {
        throw std::runtime_error("cannot write " + path.string());
      }
      std::fclose(out);
    }
    std::cout << "wrote " << files.size() << " files to " << config.write_corpus << "\n";
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<CorpusFile> files =
      config.data.empty() ? generate_corpus() : read_corpus(config.data);
  std::cout << "corpus: " << files.size() << " files"
            << (config.data.empty() ? " (generated)" : " from " + config.data) << "; "
            << config.pairs << " pairs on " << config.threads << " threads, seed " << config.seed
            << "\n";
  ReferenceCache cache(files);
  std::mutex report_mutex;
  std::atomic<uint64_t> reported{0};
  std::vector<std::unique_ptr<Checker>> checkers;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(config.threads);
  for (size_t i = 0; i < config.threads; ++i) {
    checkers.push_back(std::make_unique<Checker>(files, cache, config, i, report_mutex, reported));
  }
  for (size_t i = 0; i < config.threads; ++i) {
    const uint64_t share = config.pairs / config.threads + (i < config.pairs % config.threads);
    threads.emplace_back([&, i, share] {
      try {
        checkers[i]->run(share);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  Stats total;
  for (const auto& c : checkers) total.merge(c->stats);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "region checks " << total.region_checks << " (tolerance 0), sample checks "
            << total.sample_checks << " (tolerance 0; EXIF orientations 2-8: " << total.oriented
            << " samples)\n";
  std::cout << "regions through the discard hook (columns outside the crop parsed, not stored): "
            << total.region_discard_hooked << "\n";
  if (config.own_entropy) {
    std::cout << "regions through the own entropy decoder: " << total.region_own_entropy
              << " (refused midway and decoded by libjpeg: " << total.region_own_retried << ")\n";
  }
  if (config.entropy_index) {
    std::cout << "regions started from the file's entropy index entry: " << total.region_index_found
              << "; the index holds " << config.entropy_index->files() << " files in "
              << config.entropy_index->bytes() << " bytes\n";
  }
  if (config.entropy_index && !config.entropy_index->file().empty()) {
    const JpegEntropyIndexLoad& loaded = config.entropy_index->loaded();
    std::cout << "entropy index file " << config.entropy_index->file().string() << ": "
              << (loaded.file_found ? "" : "not found, ")
              << (loaded.file_refused ? "refused whole (" + loaded.refusal + "), " : "")
              << loaded.entries_loaded << " entries loaded, " << loaded.entries_refused
              << " refused" << (loaded.rest_dropped ? " (the rest dropped)" : "") << ", "
              << loaded.entries_over_budget << " over the budget\n";
    config.entropy_index->save();
  }
  std::cout << "regions by DCT scale:";
  for (int s = 1; s <= 8; ++s) std::cout << " " << s << "/8: " << total.region_scale_count[s];
  std::cout << "\n";
  std::cout << "samples by DCT scale:";
  for (int s = 1; s <= 8; ++s) {
    if (total.scale_count[s] != 0) std::cout << " " << s << "/8: " << total.scale_count[s];
  }
  std::cout << "\n";
  if (std::isfinite(total.min_scaled_psnr)) {
    std::cout << "samples decoded below 8/8, against the 8/8 decode (what DCT scaling changes; "
                 "not checked): min PSNR "
              << total.min_scaled_psnr << " dB, mean "
              << total.scaled_psnr_sum / static_cast<double>(total.scaled_samples) << " dB\n";
  }
  if (total.skipped != 0) {
    std::cout << "skipped " << total.skipped << " checks of files TurboJPEG cannot decode either\n";
  }
  const auto png_started = std::chrono::steady_clock::now();
  const CodecStats png =
      check_png(config, std::max<uint64_t>(200, config.pairs / 10), report_mutex, reported);
  const double png_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - png_started).count();
  const auto webp_started = std::chrono::steady_clock::now();
  const CodecStats webp =
      check_webp(config, std::max<uint64_t>(200, config.pairs / 10), report_mutex, reported);
  const double webp_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - webp_started).count();
  std::cout << "time " << seconds << " s\n";
  std::cout << "JPEG: " << total.pairs << " pairs, " << total.mismatches << " mismatches\n";
  std::cout << "PNG: " << png.samples << " samples of " << png.files
            << " files (every colour type, bit depth, interlacing; against libpng), "
            << png.mismatches << " mismatches, max abs diff " << png.max_abs_diff << " ("
            << png_seconds << " s)\n";
  std::cout << "WebP: " << webp.samples << " samples of " << webp.files
            << " files (lossy and lossless, RGB and RGBA; against libwebp's full decode), "
            << webp.mismatches << " mismatches, max abs diff " << webp.max_abs_diff << " ("
            << webp_seconds << " s)\n";
  for (const CodecStats* codec : {&png, &webp}) {
    total.pairs += codec->samples;
    total.mismatches += codec->mismatches;
    total.max_abs_diff = std::max(total.max_abs_diff, codec->max_abs_diff);
  }
  std::cout << total.pairs << " pairs, " << total.mismatches << " mismatches, max abs diff "
            << total.max_abs_diff << ", min PSNR ";
  if (std::isfinite(total.min_psnr)) {
    std::cout << total.min_psnr;
  } else {
    std::cout << "inf";
  }
  std::cout << " dB\n";
  if (config.data.empty() && total.skipped != 0) {
    std::cout << "the generated corpus holds only valid files: every skip is a failure\n";
    return 1;
  }
  return total.mismatches == 0 ? 0 : 1;
}

}  // namespace
}  // namespace conveyor::check

int main(int argc, char** argv) {
  try {
    return conveyor::check::run(conveyor::check::parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "conveyor-decode-check: " << e.what() << "\n";
    return 2;
  }
}
