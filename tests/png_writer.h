// tests/png_writer.h: PNG files of every kind, written from their samples with zlib alone, for the
// tests' corpus, the fuzz seeds and conveyor-decode-check. Independent of both PNG libraries the
// project uses (libspng decodes, libpng is the tests' reference), so that neither judges files
// the other wrote.
//
// Every colour type and the bit depths PNG allows for it (gray 1, 2, 4, 8, 16; palette 1, 2, 4, 8;
// gray + alpha, RGB and RGBA 8 and 16), interlaced (Adam7) or not, with a tRNS chunk where the
// colour type takes one. Rows cycle through the five filters (None, Sub, Up, Average, Paeth).
// png_with_layout cuts a file's zlib stream into other IDAT chunks (one, many of a few bytes,
// empty ones among them) with tEXt chunks before and after them: the same pixels, other framing.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor::testing {

struct PngSpec {
  int width = 1;
  int height = 1;
  int color_type = 2;  // 0 gray, 2 RGB, 3 palette, 4 gray + alpha, 6 RGBA
  int bit_depth = 8;
  bool interlaced = false;
  bool transparency = false;  // a tRNS chunk (gray, RGB, palette)
};

inline int png_channels(int color_type) {
  switch (color_type) {
    case 0:
    case 3:
      return 1;
    case 4:
      return 2;
    case 2:
      return 3;
    default:
      return 4;
  }
}

inline std::string describe(const PngSpec& s) {
  static const char* kNames[] = {"gray", "?", "rgb", "palette", "gray+alpha", "?", "rgba"};
  return std::to_string(s.width) + "x" + std::to_string(s.height) + " " + kNames[s.color_type] +
         " " + std::to_string(s.bit_depth) + "-bit" + (s.interlaced ? " interlaced" : "") +
         (s.transparency ? " tRNS" : "");
}

// Every (colour type, bit depth) PNG allows.
inline std::vector<PngSpec> every_png_kind() {
  std::vector<PngSpec> kinds;
  auto add = [&](int type, std::initializer_list<int> depths) {
    for (int d : depths) {
      PngSpec s;
      s.color_type = type;
      s.bit_depth = d;
      kinds.push_back(s);
    }
  };
  add(0, {1, 2, 4, 8, 16});
  add(3, {1, 2, 4, 8});
  add(4, {8, 16});
  add(2, {8, 16});
  add(6, {8, 16});
  return kinds;
}

struct PngFile {
  PngSpec spec;
  std::vector<uint16_t> samples;  // height x width x channels, each below 2^bit_depth
  std::vector<uint8_t> palette;   // RGB triples (palette images)
  std::vector<uint8_t> bytes;     // the file
};

namespace png_detail {

inline void put32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

inline void chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  put32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(0L, out.data() + start, static_cast<uInt>(out.size() - start));
  put32(out, static_cast<uint32_t>(crc));
}

inline int paeth(int a, int b, int c) {
  const int p = a + b - c;
  const int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return a;
  return pb <= pc ? b : c;
}

// Appends the filtered rows of the sub-image of pixels (x0 + i * dx, y0 + j * dy).
inline void filtered_rows(const PngFile& f, int x0, int y0, int dx, int dy,
                          std::vector<uint8_t>& out) {
  const PngSpec& s = f.spec;
  const int channels = png_channels(s.color_type);
  const int w = (s.width - x0 + dx - 1) / dx;
  const int h = (s.height - y0 + dy - 1) / dy;
  if (w <= 0 || h <= 0) return;
  const int bits = channels * s.bit_depth;
  const size_t row_bytes = (static_cast<size_t>(w) * bits + 7) / 8;
  const size_t bpp = static_cast<size_t>(bits < 8 ? 1 : bits / 8);
  std::vector<uint8_t> prior(row_bytes, 0), raw(row_bytes);
  for (int j = 0; j < h; ++j) {
    std::fill(raw.begin(), raw.end(), 0);
    size_t bit = 0;
    for (int i = 0; i < w; ++i) {
      const size_t pixel = static_cast<size_t>(y0 + j * dy) * s.width + (x0 + i * dx);
      for (int c = 0; c < channels; ++c) {
        const unsigned v = f.samples[pixel * channels + c];
        if (s.bit_depth == 16) {
          raw[bit / 8] = static_cast<uint8_t>(v >> 8);
          raw[bit / 8 + 1] = static_cast<uint8_t>(v);
        } else if (s.bit_depth == 8) {
          raw[bit / 8] = static_cast<uint8_t>(v);
        } else {
          raw[bit / 8] |= static_cast<uint8_t>(v << (8 - s.bit_depth - bit % 8));
        }
        bit += static_cast<size_t>(s.bit_depth);
      }
    }
    const int filter = j % 5;
    out.push_back(static_cast<uint8_t>(filter));
    for (size_t k = 0; k < row_bytes; ++k) {
      const int a = k >= bpp ? raw[k - bpp] : 0, b = prior[k], c = k >= bpp ? prior[k - bpp] : 0;
      int predicted = 0;
      switch (filter) {
        case 1:
          predicted = a;
          break;
        case 2:
          predicted = b;
          break;
        case 3:
          predicted = (a + b) / 2;
          break;
        case 4:
          predicted = paeth(a, b, c);
          break;
      }
      out.push_back(static_cast<uint8_t>(raw[k] - predicted));
    }
    prior = raw;
  }
}

}  // namespace png_detail

namespace png_detail {
inline void encode(PngFile& f, std::mt19937_64& rng);
}  // namespace png_detail

// A PNG of `spec` with random samples drawn from `seed` (smooth gradients plus noise, so that
// crops and resizes see structure; the full range of values at every depth).
inline PngFile make_png(const PngSpec& spec, uint64_t seed) {
  using namespace png_detail;
  PngFile f;
  f.spec = spec;
  std::mt19937_64 rng(seed);
  const int channels = png_channels(spec.color_type);
  const uint32_t top = (1u << spec.bit_depth) - 1;
  f.samples.resize(static_cast<size_t>(spec.width) * spec.height * channels);
  for (int y = 0; y < spec.height; ++y) {
    for (int x = 0; x < spec.width; ++x) {
      for (int c = 0; c < channels; ++c) {
        const double ramp = (x + 2.0 * y + 37.0 * c) / (spec.width + 2.0 * spec.height + 1.0);
        const uint64_t noise = rng() % (top / 4 + 1);
        f.samples[(static_cast<size_t>(y) * spec.width + x) * channels + c] =
            static_cast<uint16_t>((static_cast<uint64_t>(ramp * top) + noise) % (top + 1ull));
      }
    }
  }
  png_detail::encode(f, rng);
  return f;
}

// A corpus: every kind (every_png_kind) at each (width, height) of `sizes`, plain then
// interlaced, made with seeds 1, 2, ... in that order; of the kinds that take a tRNS chunk (gray,
// RGB, palette), the files whose seed is a multiple of `trns_every` have one.
template <size_t N>
std::vector<PngFile> png_corpus(const int (&sizes)[N][2], uint64_t trns_every) {
  std::vector<PngFile> files;
  uint64_t seed = 1;
  for (PngSpec kind : every_png_kind()) {
    for (const auto& wh : sizes) {
      for (int interlaced = 0; interlaced < 2; ++interlaced) {
        PngSpec s = kind;
        s.width = wh[0];
        s.height = wh[1];
        s.interlaced = interlaced != 0;
        s.transparency = (seed % trns_every == 0) && s.color_type != 4 && s.color_type != 6;
        files.push_back(make_png(s, seed++));
      }
    }
  }
  return files;
}

// The file of `spec` holding `samples` (height x width x channels, each below 2^bit_depth); a
// palette's colours and a tRNS chunk, where asked, drawn from a fixed seed.
inline std::vector<uint8_t> png_of_samples(const PngSpec& spec,
                                           const std::vector<uint16_t>& samples) {
  PngFile f;
  f.spec = spec;
  f.samples = samples;
  std::mt19937_64 rng(0);
  png_detail::encode(f, rng);
  return f.bytes;
}

namespace png_detail {

// f.samples -> f.bytes (and f.palette), drawing the palette and tRNS from `rng`.
inline void encode(PngFile& f, std::mt19937_64& rng) {
  const PngSpec& spec = f.spec;
  const int channels = png_channels(spec.color_type);
  const uint32_t top = (1u << spec.bit_depth) - 1;
  std::vector<uint8_t> ihdr;
  put32(ihdr, static_cast<uint32_t>(spec.width));
  put32(ihdr, static_cast<uint32_t>(spec.height));
  ihdr.push_back(static_cast<uint8_t>(spec.bit_depth));
  ihdr.push_back(static_cast<uint8_t>(spec.color_type));
  ihdr.push_back(0);  // deflate
  ihdr.push_back(0);  // adaptive filtering
  ihdr.push_back(spec.interlaced ? 1 : 0);
  const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  f.bytes.assign(signature, signature + 8);
  chunk(f.bytes, "IHDR", ihdr);
  if (spec.color_type == 3) {
    for (uint32_t i = 0; i <= top; ++i) {
      for (int c = 0; c < 3; ++c) f.palette.push_back(static_cast<uint8_t>(rng()));
    }
    chunk(f.bytes, "PLTE", f.palette);
  }
  if (spec.transparency) {
    std::vector<uint8_t> trns;
    if (spec.color_type == 3) {
      for (uint32_t i = 0; i <= top; ++i) trns.push_back(static_cast<uint8_t>(rng()));
    } else if (spec.color_type == 0 || spec.color_type == 2) {
      for (int c = 0; c < channels; ++c) {
        trns.push_back(static_cast<uint8_t>(f.samples[static_cast<size_t>(c)] >> 8));
        trns.push_back(static_cast<uint8_t>(f.samples[static_cast<size_t>(c)]));
      }
    }
    if (!trns.empty()) chunk(f.bytes, "tRNS", trns);
  }
  std::vector<uint8_t> filtered;
  if (spec.interlaced) {
    static const int kPasses[7][4] = {{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4},
                                      {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};
    for (const auto& p : kPasses) filtered_rows(f, p[0], p[1], p[2], p[3], filtered);
  } else {
    filtered_rows(f, 0, 0, 1, 1, filtered);
  }
  uLongf size = compressBound(static_cast<uLong>(filtered.size()));
  std::vector<uint8_t> idat(size);
  if (compress2(idat.data(), &size, filtered.data(), static_cast<uLong>(filtered.size()), 6) !=
      Z_OK) {
    throw std::runtime_error("png_writer: zlib compress2 failed");
  }
  idat.resize(size);
  // Two IDAT chunks where there is room: decoders must join them.
  const size_t half = idat.size() > 16 ? idat.size() / 2 : idat.size();
  chunk(f.bytes, "IDAT", std::vector<uint8_t>(idat.begin(), idat.begin() + half));
  if (half < idat.size())
    chunk(f.bytes, "IDAT", std::vector<uint8_t>(idat.begin() + half, idat.end()));
  chunk(f.bytes, "IEND", {});
}

}  // namespace png_detail

// A PNG's chunks, in order: the type and the data (lengths and CRCs are the file's framing).
struct PngChunk {
  std::string type;
  std::vector<uint8_t> data;
};

// The chunks of `file` after its signature; throws when a chunk runs past the end (the files
// read here are png_writer.h's own).
inline std::vector<PngChunk> png_chunks(const std::vector<uint8_t>& file) {
  std::vector<PngChunk> chunks;
  for (size_t at = 8; at + 12 <= file.size();) {
    const size_t length = size_t{file[at]} << 24 | size_t{file[at + 1]} << 16 |
                          size_t{file[at + 2]} << 8 | size_t{file[at + 3]};
    if (length > file.size() - at - 12)
      throw std::runtime_error("png_chunks: a chunk past the end");
    PngChunk c;
    c.type.assign(reinterpret_cast<const char*>(file.data() + at + 4), 4);
    c.data.assign(file.begin() + static_cast<long>(at + 8),
                  file.begin() + static_cast<long>(at + 8 + length));
    chunks.push_back(std::move(c));
    at += 12 + length;
  }
  return chunks;
}

// The file of `chunks`: the signature, then each chunk with its length and CRC.
inline std::vector<uint8_t> png_of_chunks(const std::vector<PngChunk>& chunks) {
  const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> out(signature, signature + 8);
  for (const PngChunk& c : chunks) png_detail::chunk(out, c.type.c_str(), c.data);
  return out;
}

// How a file's image data is cut into IDAT chunks, and which other chunks stand around them.
struct PngLayout {
  size_t idat_max = 0;       // 0: one IDAT holds the whole stream; else IDATs of 1..idat_max
                             // bytes each, their sizes drawn at random
  int empty_idats = 0;       // zero-length IDATs put among the others (before, between, last)
  bool text_before = false;  // a tEXt chunk just before the first IDAT
  bool text_after = false;   // a tEXt chunk between the last IDAT and IEND
};

// `file` (png_writer.h's) with its image data re-cut as `layout` says, the cuts drawn from
// `seed`: the same zlib stream, so the same pixels, in other chunks.
inline std::vector<uint8_t> png_with_layout(const std::vector<uint8_t>& file,
                                            const PngLayout& layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<PngChunk> chunks = png_chunks(file);
  std::vector<PngChunk> before, idats;
  std::vector<uint8_t> stream;
  for (const PngChunk& c : chunks) {
    if (c.type == "IDAT") {
      stream.insert(stream.end(), c.data.begin(), c.data.end());
    } else if (c.type != "IEND") {
      before.push_back(c);
    }
  }
  for (size_t at = 0; at < stream.size();) {
    const size_t n =
        layout.idat_max == 0
            ? stream.size()
            : std::min(stream.size() - at, 1 + static_cast<size_t>(rng() % layout.idat_max));
    idats.push_back({"IDAT", std::vector<uint8_t>(stream.begin() + static_cast<long>(at),
                                                  stream.begin() + static_cast<long>(at + n))});
    at += n;
  }
  for (int i = 0; i < layout.empty_idats; ++i) {
    const size_t where = i == 0 ? 0 : i == 1 ? idats.size() : rng() % (idats.size() + 1);
    idats.insert(idats.begin() + static_cast<long>(where), PngChunk{"IDAT", {}});
  }
  auto text = [](const std::string& words) {
    const std::string s = std::string("Comment") + '\0' + words;
    return PngChunk{"tEXt", std::vector<uint8_t>(s.begin(), s.end())};
  };
  std::vector<PngChunk> out = before;
  if (layout.text_before) out.push_back(text("before the image data"));
  out.insert(out.end(), idats.begin(), idats.end());
  if (layout.text_after) out.push_back(text("after the image data"));
  out.push_back({"IEND", {}});
  return png_of_chunks(out);
}

// A PNG whose IHDR declares width x height with almost no data behind it (a decompression bomb's
// header): a 1x1 gray image's file with its IHDR rewritten (CRC included).
inline std::vector<uint8_t> png_declaring(uint32_t width, uint32_t height) {
  PngSpec s;
  s.color_type = 0;
  std::vector<uint8_t> bytes = make_png(s, 1).bytes;
  // IHDR's data begins at 16: width, height; its CRC covers bytes 12 .. 29.
  for (int i = 0; i < 4; ++i) {
    bytes[16 + i] = static_cast<uint8_t>(width >> (24 - 8 * i));
    bytes[20 + i] = static_cast<uint8_t>(height >> (24 - 8 * i));
  }
  const uLong crc = crc32(0L, bytes.data() + 12, 17);
  for (int i = 0; i < 4; ++i) bytes[29 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
  return bytes;
}

}  // namespace conveyor::testing
