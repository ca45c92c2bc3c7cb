// GPU figures for conveyor-bench, each against a reference measured in the same process:
//   h2d_gb_per_s / h2d_peak_gb_per_s: the copy stage (batches whose bytes the workers leave as
//     they are, so only the copy is timed) against a plain loop of pinned cudaMemcpyAsync of the
//     same batch size on one stream;
//   overlap_step_ratio: a fixed GPU workload per batch, timed with Conveyor feeding it real
//     decoded batches versus with one batch already resident on the GPU (1.0 is perfect overlap).
//     The workload is calibrated to take about 1.5x the time Conveyor needs per batch, so that
//     decode keeps up and any excess is the pipeline disturbing the GPU.
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "bench_runs.h"
#include "conveyor/conveyor.h"

namespace conveyor::bench {
namespace {

// Batches of the right shape whose image bytes are never written: the copy stage alone.
class UntouchedImages : public SampleSource {
 public:
  UntouchedImages(size_t n, int crop) : n_(n), crop_(crop) {}
  size_t size() const override { return n_; }
  std::vector<FieldSpec> fields() const override {
    return {{"image", c10::ScalarType::Byte, {3, crop_, crop_}},
            {"label", c10::ScalarType::Long, {}}};
  }
  void write_sample(const SampleContext& ctx, std::byte* const* fields) override {
    const auto label = static_cast<int64_t>(ctx.index);
    std::memcpy(fields[1], &label, sizeof label);
  }

 private:
  size_t n_;
  int crop_;
};

void check(cudaError_t err) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + cudaGetErrorString(err));
}

double plain_pinned_copy_gbps(size_t bytes, int reps, c10::Device device) {
  HostBuffer host(bytes);
  at::Tensor dst =
      at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
  for (int i = 0; i < 2; ++i) {
    check(cudaMemcpyAsync(dst.data_ptr(), host.data(), bytes, cudaMemcpyHostToDevice,
                          stream.stream()));
  }
  check(cudaStreamSynchronize(stream.stream()));
  double t0 = now_seconds();
  for (int i = 0; i < reps; ++i) {
    check(cudaMemcpyAsync(dst.data_ptr(), host.data(), bytes, cudaMemcpyHostToDevice,
                          stream.stream()));
  }
  check(cudaStreamSynchronize(stream.stream()));
  return static_cast<double>(bytes) * reps / (now_seconds() - t0) / 1e9;
}

double copy_stage_gbps(const BenchConfig& config, c10::Device device) {
  LoaderOptions o;
  o.batch_size = config.batch_size;
  o.workers = config.workers;
  o.device = device;
  o.prefetch_factor = 4;
  DataLoader loader(std::make_shared<UntouchedImages>(config.batch_size * 40, config.crop), o);
  for (Batch& b : loader) (void)b;  // warm-up epoch: allocator, streams
  c10::cuda::device_synchronize();
  uint64_t bytes = 0;
  double t0 = now_seconds();
  for (int e = 0; e < 2; ++e) {
    for (Batch& b : loader) {
      for (const auto& f : b.fields) bytes += f.nbytes();
    }
  }
  c10::cuda::device_synchronize();
  return static_cast<double>(bytes) / (now_seconds() - t0) / 1e9;
}

// The training step stand-in: normalize the batch on the GPU, then `matmuls` bf16 products.
void step(const at::Tensor& images, at::Tensor& weights, int matmuls) {
  at::Tensor x = normalize_images(images);
  at::Tensor acc = weights.mul(x.mean().to(at::kBFloat16));
  for (int i = 0; i < matmuls; ++i) acc = at::mm(acc, weights);
  weights.add_(acc, 1e-9);
}

}  // namespace

void add_gpu_figures(const BenchConfig& config, RunResult& result) {
  c10::Device device(config.device);
  if (!device.is_cuda()) return;
  const size_t batch_bytes = config.batch_size * 3 * config.crop * config.crop;
  result.extra["h2d_peak_gb_per_s"] = plain_pinned_copy_gbps(batch_bytes, 20, device);
  result.extra["h2d_gb_per_s"] = copy_stage_gbps(config, device);
  result.extra["h2d_ratio"] = result.extra["h2d_gb_per_s"] / result.extra["h2d_peak_gb_per_s"];

  // Calibrate the workload to 1.5x Conveyor's time per batch.
  at::Tensor weights =
      at::randn({4096, 4096}, at::TensorOptions().dtype(at::kBFloat16).device(device)) * 0.01;
  at::Tensor probe =
      at::zeros({static_cast<int64_t>(config.batch_size), 3, config.crop, config.crop},
                at::TensorOptions().dtype(at::kByte).device(device));
  step(probe, weights, 10);
  c10::cuda::device_synchronize();
  double t0 = now_seconds();
  step(probe, weights, 100);
  c10::cuda::device_synchronize();
  const double per_matmul = (now_seconds() - t0) / 100;
  const double per_batch = config.batch_size / std::max(1.0, result.images_per_s);
  const int matmuls = std::max(1, static_cast<int>(std::ceil(1.5 * per_batch / per_matmul)));

  ImageTransform transform = ImageTransform::train(config.crop);
  std::shared_ptr<ImageSource> source = ImageSource::image_folder(config.data, transform);
  LoaderOptions o;
  o.batch_size = config.batch_size;
  o.workers = config.workers;
  o.device = device;
  DataLoader loader(source, o, RandomSampler::make(0));
  auto it = loader.begin();
  at::Tensor resident = it->images().clone();
  const size_t steps = loader.batches_per_epoch();
  c10::cuda::device_synchronize();
  t0 = now_seconds();
  for (size_t i = 0; i < steps; ++i) step(resident, weights, matmuls);
  c10::cuda::device_synchronize();
  const double resident_s = now_seconds() - t0;

  t0 = now_seconds();  // the range-for's begin() starts a fresh epoch, fed by Conveyor
  size_t fed = 0;
  for (Batch& b : loader) {
    step(b.images(), weights, matmuls);
    ++fed;
  }
  c10::cuda::device_synchronize();
  const double fed_s = now_seconds() - t0;
  result.extra["overlap_step_ratio"] = (fed_s / std::max<size_t>(1, fed)) / (resident_s / steps);
  result.extra["overlap_matmuls_per_step"] = matmuls;
}

}  // namespace conveyor::bench
