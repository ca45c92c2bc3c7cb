// The CUDA unit and the GPU-side ops, driven without a loader: which devices resolve_device()
// accepts and how it refuses the others (with CUDA's own reason), and normalize_images() on the
// CPU against a plain loop for every output dtype and layout.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>

#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"

namespace conveyor {
namespace {

// Runs `f`, expecting std::invalid_argument, and returns its message.
template <typename F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument was thrown";
  return "";
}

TEST(ResolveDevice, TheCpuPassesThroughUnchanged) {
  const c10::Device cpu(c10::DeviceType::CPU);
  EXPECT_EQ(resolve_device(cpu), cpu);
}

TEST(ResolveDevice, ACudaDeviceWithoutAUsableGpuIsRefusedNamingTheDevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is usable here";
  for (const char* name : {"cuda", "cuda:0", "cuda:1"}) {
    const std::string message =
        invalid_argument_message([&] { resolve_device(c10::Device(name)); });
    EXPECT_NE(message.find(std::string("device ") + name + " "), std::string::npos) << message;
    EXPECT_NE(message.find("no CUDA device is usable"), std::string::npos) << message;
  }
}

TEST(ResolveDevice, WithoutAGpuTheRefusalGivesCudasOwnReason) {
  const CudaStatus status = cuda_status();
  if (status.usable()) GTEST_SKIP() << "a CUDA device is usable here";
  EXPECT_EQ(status.devices, 0);
  // The runtime's error name, e.g. cudaErrorNoDevice or cudaErrorInsufficientDriver.
  EXPECT_EQ(status.reason.rfind("cudaError", 0), 0u) << status.reason;
  const std::string message =
      invalid_argument_message([] { resolve_device(c10::Device("cuda:0")); });
  EXPECT_NE(message.find(status.reason), std::string::npos) << message;
  EXPECT_FALSE(cuda_available());
}

TEST(ResolveDevice, TheCopyEngineRefusesACudaDeviceWithoutAUsableGpu) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is usable here";
  const std::string message =
      invalid_argument_message([] { make_cuda_copy_engine(c10::Device("cuda:0")); });
  EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
}

TEST(ResolveDevice, ADeviceThatIsNeitherCpuNorCudaIsRefusedNamingIt) {
  const std::string message =
      invalid_argument_message([] { resolve_device(c10::Device(c10::DeviceType::Meta)); });
  EXPECT_NE(message.find("meta"), std::string::npos) << message;
}

TEST(ResolveDevice, CudaMeansTorchsCurrentDeviceAndAnIndexPastTheLastGpuIsRefused) {
  if (!cuda_available()) GTEST_SKIP() << "no usable CUDA device";
  const int count = cuda_status().devices;
  const c10::DeviceIndex before = c10::cuda::current_device();
  for (int d = count - 1; d >= 0; --d) {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(d));
    EXPECT_EQ(resolve_device(c10::Device("cuda")),
              c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(d)));
  }
  c10::cuda::set_device(before);
  const std::string message =
      invalid_argument_message([] { resolve_device(c10::Device("cuda:99")); });
  EXPECT_NE(message.find("cuda:99"), std::string::npos) << message;
  EXPECT_NE(message.find("that GPU is cuda:0"), std::string::npos) << message;
}

TEST(DeviceForLocalRank, WithoutAGpuEveryRankTrainsOnTheCpu) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is usable here";
  for (int64_t rank : {0, 1, 7}) EXPECT_EQ(device_for_local_rank(rank), c10::Device("cpu"));
  EXPECT_THROW(device_for_local_rank(-1), std::invalid_argument);
}

// Ranks that each see one GPU (SLURM, CUDA_VISIBLE_DEVICES per rank) all use cuda:0; ranks that
// see every GPU of the node use cuda:LOCAL_RANK.
TEST(DeviceForLocalRank, EachRankGetsItsOwnGpuWhateverItSees) {
  const int gpus = cuda_status().devices;
  if (gpus == 0) GTEST_SKIP() << "no usable CUDA device";
  for (int64_t rank = 0; rank < gpus; ++rank) {
    EXPECT_EQ(device_for_local_rank(rank),
              c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(rank)));
  }
  if (gpus == 1) {
    EXPECT_EQ(device_for_local_rank(3), c10::Device("cuda:0"));
  } else {
    EXPECT_THROW(device_for_local_rank(gpus), std::invalid_argument);
  }
}

// --- normalize_images on the CPU, against a plain loop.

// out[b][c][y][x] = (in / 255 - mean[c]) / std[c], computed in double.
at::Tensor plain_normalize(const at::Tensor& images_chw, const NormalizeOptions& o) {
  const at::Tensor in = images_chw.contiguous();
  const int64_t b = in.size(0), h = in.size(2), w = in.size(3);
  at::Tensor out = at::empty({b, 3, h, w}, at::kDouble);
  const uint8_t* src = in.data_ptr<uint8_t>();
  double* dst = out.data_ptr<double>();
  for (int64_t i = 0; i < b * 3 * h * w; ++i) {
    const int64_t c = (i / (h * w)) % 3;
    dst[i] = (src[i] / 255.0 - o.mean[static_cast<size_t>(c)]) / o.std[static_cast<size_t>(c)];
  }
  return out;
}

TEST(NormalizeImages, TheCpuPathMatchesAPlainLoopForEveryDtypeAndLayout) {
  at::manual_seed(7);
  const at::Tensor chw = at::randint(0, 256, {3, 3, 5, 7}, at::kByte);
  NormalizeOptions o;
  o.mean = {0.5f, 0.25f, 0.125f};
  o.std = {0.2f, 0.3f, 0.4f};
  const at::Tensor expected = plain_normalize(chw, o);
  for (c10::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    // The tolerance is one rounding to the output type (relative), plus float32's own.
    const double rel = dtype == at::kFloat ? 1e-6 : dtype == at::kHalf ? 1e-3 : 8e-3;
    for (bool hwc : {false, true}) {
      for (bool channels_last : {false, true}) {
        o.dtype = dtype;
        o.hwc = hwc;
        o.channels_last = channels_last;
        const at::Tensor input = hwc ? chw.permute({0, 2, 3, 1}).contiguous() : chw;
        const at::Tensor out = normalize_images(input, o);
        SCOPED_TRACE(std::string(c10::toString(dtype)) + (hwc ? " hwc" : " chw") +
                     (channels_last ? " channels_last" : ""));
        EXPECT_EQ(out.scalar_type(), dtype);
        EXPECT_EQ(out.sizes(), expected.sizes());
        EXPECT_EQ(out.is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast
                                                  : at::MemoryFormat::Contiguous),
                  true);
        const at::Tensor diff = (out.to(at::kDouble) - expected).abs();
        const at::Tensor bound = expected.abs() * rel + 1e-6;
        EXPECT_TRUE((diff <= bound).all().item<bool>())
            << "max abs diff " << diff.max().item<double>();
      }
    }
  }
}

TEST(NormalizeImages, RefusesWhatItCannotNormalizeNamingIt) {
  EXPECT_THROW(normalize_images(at::zeros({2, 4, 3, 3}, at::kByte)), std::invalid_argument);
  EXPECT_THROW(normalize_images(at::zeros({2, 3, 3, 3}, at::kFloat)), std::invalid_argument);
  NormalizeOptions o;
  o.dtype = at::kDouble;
  EXPECT_THROW(normalize_images(at::zeros({2, 3, 3, 3}, at::kByte), o), std::invalid_argument);
}

}  // namespace
}  // namespace conveyor
