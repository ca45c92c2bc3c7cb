// conveyor-jpeg-fuzz: libFuzzer over the JPEG decode entry points (issue 10).
//
// An input is a JPEG followed by kConfigBytes bytes that choose what to do with it: which entry
// point (JpegDecoder::decode, decode_region, begin + finish_region, or ImageWriter::write, which
// reads the header, applies the limits, decodes the crop and resizes it into a slot), the
// DecodeOptions, a small DecodeLimits::max_pixels sometimes, the ImageTransform and the box.
// Decoders and writers are kept per option set across inputs, as the loader keeps one per worker,
// so that state carried from one decode to the next is exercised. JpegError and
// std::runtime_error are expected outcomes; a crash, a sanitizer report, a leak, a timeout or an
// out-of-memory is a finding. The decoder entry points run twice, without and with the own
// entropy decoder (DecodeOptions::own_entropy_decoder, issue 35): a difference in the pixels, the
// region or the error between the two is a finding too.
//
// `conveyor-jpeg-fuzz --write-seeds DIR` writes the seed corpus (every kind of file that
// encode_jpeg writes, at small sizes, and progressive files of DecodeLimits::max_scans scans and
// one more, each with a config tail) and exits. tests/fuzz/conveyor-jpeg-fuzz.dict holds JPEG's
// marker tokens, and tests/fuzz/corpus/conveyor-jpeg-fuzz/ what long runs found (fuzz_test.sh).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../many_scans_jpeg.h"
#include "codec/jpeg_segments.h"
#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "conveyor/random.h"
#include "image_fuzz.h"

namespace conveyor::fuzz {

const char* const kTarget = "conveyor-jpeg-fuzz";
const size_t kConfigBytes = 24;
const char* const kSeedSuffix = ".jpg";

namespace {

constexpr size_t kMaxCached = 32;  // writers kept alive at once (each holds scratch buffers)

// image_fuzz.h's touch, and JPEG's own promise: a SIMD scale unless any scale is allowed.
void touch(const DecodedImage& image, const DecodeOptions& options) {
  fuzz::touch(image, options.channels);
  if (!options.any_scale) check((image.scale & (image.scale - 1)) == 0, "a SIMD scale");
}

JpegDecoder& decoder_for(const DecodeOptions& o, uint64_t max_pixels) {
  static std::map<std::tuple<int, bool, bool, bool, bool, uint64_t>, std::unique_ptr<JpegDecoder>>
      cache;
  auto& slot = cache[{o.channels, o.fast_upsampling, o.any_scale, o.read_orientation,
                      o.own_entropy_decoder, max_pixels}];
  if (!slot) slot = std::make_unique<JpegDecoder>(DecodeLimits{max_pixels}, o);
  return *slot;
}

ImageWriter& writer_for(const ImageTransform& t) {
  using Key = std::tuple<int, int, int, bool, int, double, uint64_t>;
  static std::map<Key, std::unique_ptr<ImageWriter>> cache;
  static std::deque<Key> order;  // oldest first
  Key key{static_cast<int>(t.mode),
          t.size,
          t.resize,
          t.exif_orientation,
          static_cast<int>(t.layout),
          t.flip_probability,
          t.limits.max_pixels};
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  if (cache.size() >= kMaxCached) {
    cache.erase(order.front());
    order.pop_front();
  }
  order.push_back(key);
  return *(cache[key] = std::make_unique<ImageWriter>(t));
}

void run_decoder(FuzzedDataProvider& cfg, int entry, const uint8_t* jpeg, size_t size) {
  DecodeOptions o;
  o.channels = cfg.ConsumeBool() ? 4 : 3;
  o.fast_upsampling = cfg.ConsumeBool();
  o.any_scale = cfg.ConsumeBool();
  o.read_orientation = cfg.ConsumeBool();
  const uint64_t max_pixels = pick_limit(cfg);
  DecodeOptions own_options = o;
  own_options.own_entropy_decoder = true;
  JpegDecoder& stock = decoder_for(o, max_pixels);
  JpegDecoder& own = decoder_for(own_options, max_pixels);
  // The box, as fractions of the image (1/65535) or, rarely, raw and possibly outside it.
  const bool raw = cfg.ConsumeIntegral<uint8_t>() < 16;
  const uint16_t bx = cfg.ConsumeIntegral<uint16_t>(), by = cfg.ConsumeIntegral<uint16_t>();
  const uint16_t bw = cfg.ConsumeIntegral<uint16_t>(), bh = cfg.ConsumeIntegral<uint16_t>();
  const int min_w = cfg.ConsumeIntegralInRange<int>(-1, 600);
  const int min_h = cfg.ConsumeIntegralInRange<int>(-1, 600);
  auto box = [&](const JpegHeader& h, int& x, int& y, int& w, int& bh_out) {
    if (raw) {
      x = static_cast<int16_t>(bx);
      y = static_cast<int16_t>(by);
      w = static_cast<int16_t>(bw);
      bh_out = static_cast<int16_t>(bh);
      return;
    }
    x = static_cast<int>(static_cast<uint64_t>(bx) * h.width / 65536);
    y = static_cast<int>(static_cast<uint64_t>(by) * h.height / 65536);
    w = 1 + static_cast<int>(static_cast<uint64_t>(bw) * (h.width - x) / 65536);
    bh_out = 1 + static_cast<int>(static_cast<uint64_t>(bh) * (h.height - y) / 65536);
  };
  // One entry point on one decoder: the decoded region, or the error's message.
  auto run = [&](JpegDecoder& decoder, std::string& error) -> DecodedImage {
    int x = 0, y = 0, w = 0, h = 0;
    try {
      switch (entry) {
        case 1:
          return decoder.decode(jpeg, size);
        case 2: {
          // The header from one call, the region from another: read_header leaves no state
          // behind.
          const JpegHeader header = decoder.read_header(jpeg, size);
          check(header.orientation >= 1 && header.orientation <= 8, "orientation in 1..8");
          box(header, x, y, w, h);
          return decoder.decode_region(jpeg, size, x, y, w, h, min_w, min_h);
        }
        default: {
          const JpegHeader header = decoder.begin(jpeg, size);
          check(header.width >= 1 && header.height >= 1, "a non-empty header");
          check(static_cast<uint64_t>(header.width) * header.height <= max_pixels,
                "the pixel limit");
          box(header, x, y, w, h);
          return decoder.finish_region(x, y, w, h, min_w, min_h);
        }
      }
    } catch (const std::runtime_error& e) {  // JpegError: refused input
      error = e.what();
      return DecodedImage{};
    }
  };
  std::string stock_error, own_error;
  const DecodedImage a = run(stock, stock_error);
  const DecodedImage b = run(own, own_error);
  check(stock_error == own_error, "the same error with the own entropy decoder");
  if (!stock_error.empty()) throw JpegError(stock_error);
  touch(a, o);
  touch(b, own_options);
  check(a.width == b.width && a.height == b.height && a.scale == b.scale,
        "the same region with the own entropy decoder");
  const size_t row = static_cast<size_t>(a.width) * static_cast<size_t>(a.channels);
  for (int r = 0; r < a.height; ++r) {
    const uint8_t* pa = a.pixels + static_cast<size_t>(r) * a.stride;
    const uint8_t* pb = b.pixels + static_cast<size_t>(r) * b.stride;
    for (size_t i = 0; i < row; ++i) {
      // RGBX's fourth byte is unspecified.
      if (a.channels == 4 && i % 4 == 3) continue;
      check(pa[i] == pb[i], "the same pixels with the own entropy decoder");
    }
  }
}

void run_writer(FuzzedDataProvider& cfg, const uint8_t* jpeg, size_t size) {
  ImageTransform t;
  t.mode = static_cast<ImageTransform::Mode>(cfg.ConsumeIntegralInRange<int>(0, 2));
  t.size = cfg.ConsumeIntegralInRange<int>(1, 300);
  t.resize = t.size + cfg.ConsumeIntegralInRange<int>(0, 64);
  t.exif_orientation = cfg.ConsumeBool();
  t.layout = cfg.ConsumeBool() ? conveyor::ImageLayout::kHWC : conveyor::ImageLayout::kCHW;
  static constexpr double kFlip[] = {0.0, 0.5, 1.0};
  t.flip_probability = kFlip[cfg.ConsumeIntegralInRange<int>(0, 2)];
  t.limits.max_pixels = pick_limit(cfg);
  ImageWriter& writer = writer_for(t);
  // The box: choose_crop's draw for (seed, epoch, index).
  conveyor::SampleContext ctx;
  ctx.seed = cfg.ConsumeIntegral<uint32_t>();
  ctx.epoch = cfg.ConsumeIntegral<uint8_t>();
  ctx.index = cfg.ConsumeIntegral<uint16_t>();
  std::vector<std::byte> out(static_cast<size_t>(t.size) * t.size * 3);  // exact: ASan guards it
  writer.write(jpeg, size, ctx, out.data());
  const int scale = writer.last_scale();
  check(scale >= 1 && scale <= 8, "last_scale in 1..8");
}

// The seed corpus: small files of every kind encode_jpeg writes.
}  // namespace

std::vector<std::vector<uint8_t>> seed_files() {
  using Color = conveyor::EncodeOptions::Color;
  struct Seed {
    int w, h;
    conveyor::EncodeOptions o;
    bool segment_index = false;  // with conveyor-prepare's segment index (jpeg_segments.h)
  };
  std::vector<Seed> seeds;
  auto add = [&](int w, int h, auto&& set) {
    conveyor::EncodeOptions o;
    set(o);
    seeds.push_back({w, h, o});
  };
  const int samp[][2] = {{1, 1}, {2, 1}, {2, 2}, {1, 2}, {4, 1}};
  for (auto& s : samp) {
    add(37, 29, [&](auto& o) { o.h_samp = s[0], o.v_samp = s[1]; });
    add(64, 48, [&](auto& o) { o.h_samp = s[0], o.v_samp = s[1], o.progressive = true; });
    add(33, 17, [&](auto& o) { o.h_samp = s[0], o.v_samp = s[1], o.arithmetic = true; });
  }
  add(48, 40, [](auto& o) { o.color = Color::kGray; });
  add(23, 61, [](auto& o) { o.color = Color::kGray, o.progressive = true; });
  add(40, 40, [](auto& o) { o.color = Color::kRgb; });
  add(40, 24, [](auto& o) { o.color = Color::kCmyk; });
  add(24, 40, [](auto& o) { o.color = Color::kCmyk, o.adobe_marker = false; });
  add(32, 32, [](auto& o) { o.color = Color::kYcck; });
  add(31, 45, [](auto& o) { o.color = Color::kYcck, o.progressive = true; });
  add(70, 50, [](auto& o) { o.restart_interval = 1; });
  add(70, 50, [](auto& o) { o.restart_interval = 3, o.progressive = true; });
  // Intervals that tile the MCU rows: regions decode from their covering segments.
  add(96, 40, [](auto& o) { o.restart_interval = 2; });
  add(96, 40, [](auto& o) { o.restart_interval = 4, o.color = Color::kGray; });
  add(64, 33, [](auto& o) { o.restart_interval = 2, o.h_samp = 1, o.v_samp = 1; });
  // The same, with the segment index conveyor-prepare stores: mutations reach its reader.
  for (size_t i = seeds.size() - 3, end = seeds.size(); i < end; ++i) {
    seeds.push_back(seeds[i]);
    seeds.back().segment_index = true;
  }
  add(1, 1, [](auto&) {});
  add(200, 3, [](auto& o) { o.progressive = true; });
  add(3, 150, [](auto&) {});
  for (int orientation = 1; orientation <= 8; ++orientation) {
    add(30 + orientation, 20, [&](auto& o) {
      o.orientation = orientation;
      o.exif_big_endian = orientation % 2 == 0;
    });
  }
  std::vector<std::vector<uint8_t>> files;
  for (const Seed& s : seeds) {
    std::vector<uint8_t> rgb(static_cast<size_t>(s.w) * s.h * 3);
    for (size_t i = 0; i < rgb.size(); ++i) {
      rgb[i] = static_cast<uint8_t>((i * 7 + (i / 3 / s.w) * 13) ^ (conveyor::splitmix64(i) & 31));
    }
    std::vector<uint8_t> file = conveyor::encode_jpeg(rgb.data(), s.w, s.h, s.o);
    if (s.segment_index) {
      std::vector<uint8_t> indexed;
      if (!conveyor::detail::add_segment_index(file.data(), file.size(), indexed)) {
        std::fprintf(stderr, "conveyor-jpeg-fuzz: seed %zu cannot take a segment index\n",
                     files.size());
        std::abort();
      }
      file = std::move(indexed);
    }
    files.push_back(std::move(file));
  }
  // At the scan limit and over it (DecodeLimits::max_scans).
  const int max_scans = DecodeLimits{}.max_scans;
  for (int scans : {max_scans, max_scans + 1}) {
    files.push_back(conveyor::testing::progressive_jpeg_with_scans(24, 16, scans));
  }
  return files;
}

void run_one(FuzzedDataProvider& cfg, const uint8_t* jpeg, size_t size) {
  const int entry = cfg.ConsumeIntegralInRange<int>(0, 3);
  if (entry == 0) {
    run_writer(cfg, jpeg, size);
  } else {
    run_decoder(cfg, entry, jpeg, size);
  }
}

}  // namespace conveyor::fuzz
