// Google Benchmark of entropy decoding alone (issue 35, step 2): the own baseline decoder
// (datasets/codec/jpeg_entropy.h) against libjpeg-turbo's jpeg_read_coefficients, on the same
// files, one thread:
//   BM_LibjpegCoefficients  jpeg_read_header + jpeg_read_coefficients + jpeg_finish_decompress;
//   BM_OwnCoefficients      jpeg_read_header (libjpeg) + HuffmanScanDecoder::start (tables, the
//                           de-stuffed copy) + every MCU decoded into zeroed coefficient planes
//                           laid out as libjpeg's;
//   BM_OwnSkip              the same with skip_mcu (the discard variant: nothing stored);
//   BM_HeaderAndPlanes      only the header parse and the zeroed planes, which both sides pay.
// The ratio BM_LibjpegCoefficients time / BM_OwnCoefficients time is the own decoder's speed-up.
// /0: the files as written; /1: the same coefficients with a restart marker after every MCU (a
// prepared file), which sends libjpeg-turbo to its slow path (decode_mcu_slow) for every MCU.
// Files: 64 held-out-like photo-like 500x375 4:2:0 JPEGs (make_photo_jpeg, quality 90, seeds no
// dataset uses), about ImageNet's bit rate; every one is checked block for block against libjpeg
// before timing (the timing is meaningless for a decoder that is wrong).
// Run: build/bench/jpeg-entropy-bench [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "codec/jpeg_entropy.h"
#include "synthetic.h"

namespace conveyor {
namespace {

constexpr size_t kFiles = 64;

// The same coefficients with a restart marker after every MCU (a prepared file, conveyor-prepare
// --restart 1), written by libjpeg's lossless transcoding.
std::vector<uint8_t> with_restart_every_mcu(const std::vector<uint8_t>& file) {
  jpeg_decompress_struct in{};
  jpeg_compress_struct out{};
  jpeg_error_mgr in_err{}, out_err{};
  in.err = jpeg_std_error(&in_err);
  out.err = jpeg_std_error(&out_err);
  jpeg_create_decompress(&in);
  jpeg_create_compress(&out);
  jpeg_mem_src(&in, file.data(), static_cast<unsigned long>(file.size()));
  jpeg_read_header(&in, TRUE);
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&in);
  unsigned char* bytes = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&out, &bytes, &size);
  jpeg_copy_critical_parameters(&in, &out);
  out.restart_interval = 1;
  jpeg_write_coefficients(&out, coefficients);
  jpeg_finish_compress(&out);
  jpeg_finish_decompress(&in);
  std::vector<uint8_t> result(bytes, bytes + size);
  std::free(bytes);
  jpeg_destroy_compress(&out);
  jpeg_destroy_decompress(&in);
  return result;
}

// files(0): the photo-like files as written; files(1): the same with restart markers.
const std::vector<std::vector<uint8_t>>& files(int restarts) {
  static const std::vector<std::vector<uint8_t>> plain = [] {
    std::vector<std::vector<uint8_t>> v;
    for (size_t i = 0; i < kFiles; ++i) v.push_back(make_photo_jpeg(500, 375, 900000 + i, 90));
    return v;
  }();
  static const std::vector<std::vector<uint8_t>> prepared = [] {
    std::vector<std::vector<uint8_t>> v;
    for (const auto& f : plain) v.push_back(with_restart_every_mcu(f));
    return v;
  }();
  return restarts != 0 ? prepared : plain;
}

// One decompress object reused across files, as a decoder would (errors: the files are valid; a
// libjpeg error ends the benchmark process).
struct Libjpeg {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  Libjpeg() {
    cinfo.err = jpeg_std_error(&err);
    jpeg_create_decompress(&cinfo);
  }
  ~Libjpeg() { jpeg_destroy_decompress(&cinfo); }
  Libjpeg(const Libjpeg&) = delete;
  Libjpeg& operator=(const Libjpeg&) = delete;
  void read_header(const std::vector<uint8_t>& file) {
    jpeg_mem_src(&cinfo, file.data(), static_cast<unsigned long>(file.size()));
    jpeg_read_header(&cinfo, TRUE);
  }
};

// Coefficient planes laid out as jpeg_read_coefficients lays them out, reused across files.
struct Planes {
  std::vector<std::vector<JCOEF>> coefficients;
  std::vector<JDIMENSION> width;  // in blocks
  void size_for(const jpeg_decompress_struct& cinfo) {
    coefficients.resize(static_cast<size_t>(cinfo.num_components));
    width.resize(coefficients.size());
    for (int c = 0; c < cinfo.num_components; ++c) {
      const jpeg_component_info& info = cinfo.comp_info[c];
      const auto round_up = [](JDIMENSION v, int m) { return (v + m - 1) / m * m; };
      const JDIMENSION w = round_up(info.width_in_blocks, info.h_samp_factor);
      const JDIMENSION h = round_up(info.height_in_blocks, info.v_samp_factor);
      auto& p = coefficients[static_cast<size_t>(c)];
      p.resize(static_cast<size_t>(w) * h * DCTSIZE2);
      std::memset(p.data(), 0, p.size() * sizeof(JCOEF));  // libjpeg pre-zeroes its arrays too
      width[static_cast<size_t>(c)] = w;
    }
  }
};

// Decodes (kStore) or skips every MCU of the scan; false when the decoder refused.
template <bool kStore>
bool decode_scan(detail::HuffmanScanDecoder& decoder, Planes& planes) {
  const auto& l = decoder.layout();
  JBLOCKROW blocks[detail::ScanLayout::kMaxBlocksInMcu];
  for (uint32_t my = 0; my < l.mcu_rows; ++my) {
    for (uint32_t mx = 0; mx < l.mcus_per_row; ++mx) {
      if constexpr (kStore) {
        int b = 0;
        for (int c = 0; c < l.components; ++c) {
          const auto w = static_cast<uint32_t>(l.mcu_width[static_cast<size_t>(c)]);
          const auto h = static_cast<uint32_t>(l.mcu_height[static_cast<size_t>(c)]);
          JCOEF* plane = planes.coefficients[static_cast<size_t>(c)].data();
          const size_t stride = planes.width[static_cast<size_t>(c)];
          for (uint32_t y = 0; y < h; ++y) {
            for (uint32_t x = 0; x < w; ++x) {
              const size_t block = (my * h + y) * stride + mx * w + x;
              blocks[b++] = reinterpret_cast<JBLOCKROW>(plane + block * DCTSIZE2);
            }
          }
        }
        if (!decoder.decode_mcu(blocks)) return false;
      } else {
        if (!decoder.skip_mcu()) return false;
      }
    }
  }
  return true;
}

// Every file decoded both ways, block for block, once.
void check_files() {
  static const bool checked = [] {
    Libjpeg reference, own;
    detail::HuffmanScanDecoder decoder;
    Planes planes;
    for (int restarts = 0; restarts < 2; ++restarts) {
      for (const auto& f : files(restarts)) {
        reference.read_header(f);
        jvirt_barray_ptr* arrays = jpeg_read_coefficients(&reference.cinfo);
        own.read_header(f);
        if (!decoder.start(&own.cinfo)) throw std::runtime_error("the own decoder refused a file");
        planes.size_for(own.cinfo);
        if (!decode_scan<true>(decoder, planes)) throw std::runtime_error("refused an MCU");
        for (int c = 0; c < reference.cinfo.num_components; ++c) {
          const jpeg_component_info& info = reference.cinfo.comp_info[c];
          const JDIMENSION rows = (info.height_in_blocks + info.v_samp_factor - 1) /
                                  info.v_samp_factor * info.v_samp_factor;
          const JDIMENSION w = planes.width[static_cast<size_t>(c)];
          for (JDIMENSION r = 0; r < rows; ++r) {
            JBLOCKARRAY row = (*reference.cinfo.mem->access_virt_barray)(
                reinterpret_cast<j_common_ptr>(&reference.cinfo), arrays[c], r, 1, FALSE);
            if (std::memcmp(row[0], &planes.coefficients[static_cast<size_t>(c)][r * w * DCTSIZE2],
                            sizeof(JBLOCK) * w) != 0) {
              throw std::runtime_error("the own decoder differs from libjpeg");
            }
          }
        }
        jpeg_finish_decompress(&reference.cinfo);
        jpeg_abort_decompress(&own.cinfo);
      }
    }
    return true;
  }();
  (void)checked;
}

void BM_LibjpegCoefficients(benchmark::State& state) {
  check_files();
  Libjpeg lib;
  size_t i = 0, bytes = 0;
  for (auto _ : state) {
    const auto& f = files(static_cast<int>(state.range(0)))[i++ % kFiles];
    lib.read_header(f);
    jvirt_barray_ptr* arrays = jpeg_read_coefficients(&lib.cinfo);
    benchmark::DoNotOptimize(arrays);
    jpeg_finish_decompress(&lib.cinfo);
    bytes += f.size();
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_LibjpegCoefficients)->Arg(0)->Arg(1);

template <bool kStore>
void own_benchmark(benchmark::State& state) {
  check_files();
  Libjpeg lib;
  detail::HuffmanScanDecoder decoder;
  Planes planes;
  size_t i = 0, bytes = 0;
  for (auto _ : state) {
    const auto& f = files(static_cast<int>(state.range(0)))[i++ % kFiles];
    lib.read_header(f);
    if (!decoder.start(&lib.cinfo)) {
      state.SkipWithError("refused");
      break;
    }
    if constexpr (kStore) planes.size_for(lib.cinfo);
    if (!decode_scan<kStore>(decoder, planes)) {
      state.SkipWithError("refused an MCU");
      break;
    }
    benchmark::DoNotOptimize(planes.coefficients.data());
    jpeg_abort_decompress(&lib.cinfo);
    bytes += f.size();
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
// What both sides pay besides entropy decoding: libjpeg's header parse and zeroed coefficient
// planes (libjpeg's are pre-zeroed too), for an entropy-only ratio by subtraction.
void BM_HeaderAndPlanes(benchmark::State& state) {
  Libjpeg lib;
  Planes planes;
  size_t i = 0;
  for (auto _ : state) {
    lib.read_header(files(static_cast<int>(state.range(0)))[i++ % kFiles]);
    planes.size_for(lib.cinfo);
    benchmark::DoNotOptimize(planes.coefficients.data());
    jpeg_abort_decompress(&lib.cinfo);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HeaderAndPlanes)->Arg(0)->Arg(1);

void BM_OwnCoefficients(benchmark::State& state) { own_benchmark<true>(state); }
void BM_OwnSkip(benchmark::State& state) { own_benchmark<false>(state); }
BENCHMARK(BM_OwnCoefficients)->Arg(0)->Arg(1);
BENCHMARK(BM_OwnSkip)->Arg(0)->Arg(1);

}  // namespace

// Every file decoded both ways, block for block (check_files above).
void check_all_files() { check_files(); }

}  // namespace conveyor

// The check runs before the benchmarks so that instruction counts of one benchmark
// (valgrind --tool=callgrind --toggle-collect=...) hold only its own work.
int main(int argc, char** argv) {
  conveyor::check_all_files();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
