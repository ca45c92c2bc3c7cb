// gpudecode-bench (issue 24): what the hybrid decoder can gain on this machine, before it is wired
// into the loader. On N photo-like JPEGs (500x375 and 375x500, quality 90, in memory), with
// RandomResizedCrop 224 into CHW rows:
//   cpu     W threads of ImageWriter (the CPU path), each on its share of the images;
//   gpu     one GpuCropDecoder (nvJPEG's hardware backend) in batches of B, rows in device memory;
//   hybrid  both at once, the GPU given the share gpu / (cpu + gpu) of the images measured above
//           (the fixed split the automatic mode would converge to), files it refuses decoded by
//           the CPU threads afterwards.
// Each figure is the best of --rounds rounds; the hybrid's ratio is against cpu from the same run.
// Without GPU decode it prints why and the cpu figure only.
//
// Usage: gpudecode-bench [--images N] [--workers W] [--batch B] [--rounds R]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/gpu_decode.h"
#include "synthetic.h"

namespace {

using Clock = std::chrono::steady_clock;
using conveyor::GpuJpeg;

struct Args {
  size_t images = 2048;
  size_t workers = std::max(1u, std::thread::hardware_concurrency());
  size_t batch = 128;
  int rounds = 3;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gpudecode-bench: %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    const unsigned long value = std::strtoul(argv[++i], nullptr, 10);
    if (value == 0) {
      std::fprintf(stderr, "gpudecode-bench: %s must be a positive number\n", flag.c_str());
      std::exit(2);
    }
    if (flag == "--images") {
      a.images = value;
    } else if (flag == "--workers") {
      a.workers = value;
    } else if (flag == "--batch") {
      a.batch = value;
    } else if (flag == "--rounds") {
      a.rounds = static_cast<int>(value);
    } else {
      std::fprintf(stderr,
                   "usage: gpudecode-bench [--images N] [--workers W] [--batch B] "
                   "[--rounds R]\n");
      std::exit(2);
    }
  }
  return a;
}

// Decodes the images `order` lists with `workers` ImageWriter threads.
void cpu_decode(const std::vector<GpuJpeg>& images, const std::vector<size_t>& order,
                size_t workers, const conveyor::ImageTransform& t) {
  std::atomic<size_t> next{0};
  std::vector<std::jthread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      conveyor::ImageWriter writer(t);
      std::vector<std::byte> row(static_cast<size_t>(t.size) * t.size * 3);
      for (size_t k = next.fetch_add(1); k < order.size(); k = next.fetch_add(1)) {
        const GpuJpeg& j = images[order[k]];
        writer.write(j.data, j.size, j.context, row.data());
      }
    });
  }
}

// Owned device memory for the GPU's rows.
struct DeviceRows {
  uint8_t* data = nullptr;
  explicit DeviceRows(size_t bytes) {
    if (cudaMalloc(reinterpret_cast<void**>(&data), bytes) != cudaSuccess) {
      std::fprintf(stderr, "gpudecode-bench: cudaMalloc of %zu bytes failed\n", bytes);
      std::exit(1);
    }
  }
  ~DeviceRows() { cudaFree(data); }
  DeviceRows(const DeviceRows&) = delete;
  DeviceRows& operator=(const DeviceRows&) = delete;
};

// Decodes `order`'s images on the GPU in batches; returns the positions it sent to the CPU.
std::vector<size_t> gpu_decode(conveyor::GpuCropDecoder& decoder,
                               const std::vector<GpuJpeg>& images, const std::vector<size_t>& order,
                               size_t batch, uint8_t* rows, cudaStream_t stream) {
  std::vector<size_t> refused;
  std::vector<GpuJpeg> chunk;
  for (size_t k = 0; k < order.size(); k += batch) {
    chunk.clear();
    for (size_t i = k; i < std::min(order.size(), k + batch); ++i)
      chunk.push_back(images[order[i]]);
    const conveyor::GpuDecodeResult r = decoder.decode(chunk.data(), chunk.size(), rows, stream);
    for (size_t p : r.to_cpu) refused.push_back(order[k + p]);
    for (const auto& f : r.failed) refused.push_back(order[k + f.position]);
  }
  return refused;
}

template <typename F>
double best_rate(int rounds, size_t images, F&& run) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    run();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, double(images) / s);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const conveyor::ImageTransform t = conveyor::ImageTransform::train(224);
  std::vector<std::vector<uint8_t>> files(a.images);
  {
    std::atomic<size_t> next{0};
    std::vector<std::jthread> threads;
    for (size_t w = 0; w < a.workers; ++w) {
      threads.emplace_back([&] {
        for (size_t i = next.fetch_add(1); i < files.size(); i = next.fetch_add(1)) {
          files[i] = i % 3 == 0 ? conveyor::make_photo_jpeg(375, 500, i, 90)
                                : conveyor::make_photo_jpeg(500, 375, i, 90);
        }
      });
    }
  }
  std::vector<GpuJpeg> images;
  size_t bytes = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    images.push_back(GpuJpeg{files[i].data(), files[i].size(), conveyor::SampleContext{0, i, 0, 0},
                             "photo" + std::to_string(i)});
    bytes += files[i].size();
  }
  std::printf(
      "gpudecode-bench: %zu photo-like JPEGs (%.1f kB mean), RandomResizedCrop %d CHW, "
      "%zu CPU threads, GPU batches of %zu, best of %d rounds\n",
      a.images, double(bytes) / 1000.0 / double(a.images), t.size, a.workers, a.batch, a.rounds);
  std::vector<size_t> all(images.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  const double cpu =
      best_rate(a.rounds, all.size(), [&] { cpu_decode(images, all, a.workers, t); });
  std::printf("cpu: %.0f images/s (%zu threads of ImageWriter)\n", cpu, a.workers);

  const conveyor::GpuDecodeStatus status = conveyor::gpu_decode_status();
  if (!status.available) {
    std::printf("gpu: skipped (%s)\n", status.reason.c_str());
    return 0;
  }
  conveyor::GpuDecodeOptions o;
  o.transform = t;
  o.max_batch = a.batch;
  conveyor::GpuCropDecoder decoder(o);
  DeviceRows rows(a.batch * static_cast<size_t>(t.size) * t.size * 3);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  size_t refused = 0;
  const double gpu = best_rate(a.rounds, all.size(), [&] {
    refused = gpu_decode(decoder, images, all, a.batch, rows.data, stream).size();
  });
  std::printf("gpu: %.0f images/s (nvJPEG hardware backend, %u engines; %zu of %zu refused)\n", gpu,
              status.engines, refused, all.size());

  // The hybrid: the GPU's share by the measured rates; the CPU threads take the rest, then
  // whatever the GPU refused.
  const double share = gpu / (cpu + gpu);
  const size_t to_gpu = static_cast<size_t>(share * double(all.size()));
  const std::vector<size_t> gpu_part(all.begin(), all.begin() + static_cast<long>(to_gpu));
  const std::vector<size_t> cpu_part(all.begin() + static_cast<long>(to_gpu), all.end());
  const double hybrid = best_rate(a.rounds, all.size(), [&] {
    std::vector<size_t> back;
    {
      std::jthread gpu_thread(
          [&] { back = gpu_decode(decoder, images, gpu_part, a.batch, rows.data, stream); });
      cpu_decode(images, cpu_part, a.workers, t);
    }
    if (!back.empty()) cpu_decode(images, back, a.workers, t);
  });
  std::printf("hybrid: %.0f images/s (%.0f%% to the GPU) = %.2fx cpu, %.2fx gpu\n", hybrid,
              100.0 * share, hybrid / cpu, hybrid / gpu);
  cudaStreamDestroy(stream);
  return 0;
}
