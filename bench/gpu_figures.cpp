// GPU figures for conveyor-bench, each against a reference measured in the same process:
//   h2d_gb_per_s / h2d_peak_gb_per_s: the copy stage (batches whose bytes the workers leave as
//     they are, so only the copy is timed) against a plain loop of pinned cudaMemcpyAsync of the
//     same batch size on one stream; h2d_event_thread_gb_per_s the same with
//     CopyCompletion::kEventThread; h2d_plain_with_{label_copy,host_callback}_ratio the plain
//     loop with one thing the copy stage adds per batch (a second small copy, a host function
//     on the stream), against the plain loop: where the gap is;
//   overlap_step_ratio: a fixed GPU workload per batch, timed with Conveyor feeding it real
//     decoded batches versus with one batch already resident on the GPU (1.0 is perfect overlap).
//     The workload is calibrated to take about 1.5x the time Conveyor needs per batch, so that
//     decode keeps up and any excess is the pipeline disturbing the GPU.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

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

void CUDART_CB nothing(void*) {}

// What a plain loop of pinned copies adds per batch, to find where the copy stage's gap is.
struct PlainLoopExtras {
  bool label_copy = false;     // a second, small copy per batch (the labels: 8 bytes a row)
  bool host_callback = false;  // a cudaLaunchHostFunc per batch, doing nothing
};

// A loop of pinned cudaMemcpyAsync of `bytes` on one stream, plus `extras`, in GB/s of image
// bytes.
double plain_pinned_copy_gbps(size_t bytes, size_t rows, int reps, c10::Device device,
                              PlainLoopExtras extras = {}) {
  HostBuffer host(bytes);
  HostBuffer labels(rows * sizeof(int64_t));
  at::Tensor dst =
      at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
  at::Tensor label_dst =
      at::empty({static_cast<int64_t>(rows)}, at::TensorOptions().dtype(at::kLong).device(device));
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
  auto one = [&] {
    check(cudaMemcpyAsync(dst.data_ptr(), host.data(), bytes, cudaMemcpyHostToDevice,
                          stream.stream()));
    if (extras.label_copy) {
      check(cudaMemcpyAsync(label_dst.data_ptr(), labels.data(), rows * sizeof(int64_t),
                            cudaMemcpyHostToDevice, stream.stream()));
    }
    if (extras.host_callback) check(cudaLaunchHostFunc(stream.stream(), nothing, nullptr));
  };
  for (int i = 0; i < 2; ++i) one();
  check(cudaStreamSynchronize(stream.stream()));
  double t0 = now_seconds();
  for (int i = 0; i < reps; ++i) one();
  check(cudaStreamSynchronize(stream.stream()));
  return static_cast<double>(bytes) * reps / (now_seconds() - t0) / 1e9;
}

// The copy stage through the loader, in GB/s of batch bytes: a warm-up epoch, then 2 epochs of
// 40 batches each.
double copy_stage_gbps(const BenchConfig& config, c10::Device device, CopyCompletion completion) {
  LoaderOptions o;
  o.batch_size = config.batch_size;
  o.workers = config.workers;
  o.device = device;
  o.prefetch_factor = 4;
  DataLoader loader(std::make_shared<UntouchedImages>(config.batch_size * 40, config.crop), o,
                    nullptr, make_cuda_copy_engine(device, completion));
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
  // Each copy figure is the median of 3 measurements, the variants interleaved, so that a slow
  // spell hits them alike. The copy stage's figure includes the label bytes and the start of each
  // of its 2 timed epochs (the ring empty), both small biases against it.
  const size_t rows = config.batch_size;
  std::map<std::string, std::vector<double>> gbps;
  for (int rep = 0; rep < 3; ++rep) {
    gbps["peak"].push_back(plain_pinned_copy_gbps(batch_bytes, rows, 40, device));
    gbps["label"].push_back(plain_pinned_copy_gbps(batch_bytes, rows, 40, device, {true, false}));
    gbps["callback"].push_back(
        plain_pinned_copy_gbps(batch_bytes, rows, 40, device, {false, true}));
    gbps["stage"].push_back(copy_stage_gbps(config, device, CopyCompletion::kHostCallback));
    gbps["event_thread"].push_back(copy_stage_gbps(config, device, CopyCompletion::kEventThread));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto& x = result.extra;
  const double peak = median(gbps["peak"]);
  x["h2d_peak_gb_per_s"] = peak;
  x["h2d_gb_per_s"] = median(gbps["stage"]);
  x["h2d_ratio"] = x["h2d_gb_per_s"] / peak;
  x["h2d_event_thread_gb_per_s"] = median(gbps["event_thread"]);
  x["h2d_event_thread_ratio"] = x["h2d_event_thread_gb_per_s"] / peak;
  // Where the gap is: the plain loop with what the copy stage adds per batch, one at a time.
  x["h2d_plain_with_label_copy_ratio"] = median(gbps["label"]) / peak;
  x["h2d_plain_with_host_callback_ratio"] = median(gbps["callback"]) / peak;

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
