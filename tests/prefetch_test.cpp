// The copy stage's contract (conveyor/prefetch.h), driven without a loader: which devices
// resolve_device() accepts, and how it refuses the others.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

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

TEST(ResolveDevice, CudaMeansCudaZeroAndAnIndexPastTheLastGpuIsRefused) {
  if (!cuda_available()) GTEST_SKIP() << "no usable CUDA device";
  EXPECT_EQ(resolve_device(c10::Device("cuda")), c10::Device("cuda:0"));
  const std::string message =
      invalid_argument_message([] { resolve_device(c10::Device("cuda:99")); });
  EXPECT_NE(message.find("cuda:99"), std::string::npos) << message;
}

}  // namespace
}  // namespace conveyor
