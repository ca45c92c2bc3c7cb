// A device decoder for the loader's GPU decode (LoaderOptions::gpu_decode) whose "device" is
// host memory, for the tests that run without a GPU: it decodes with ImageWriter on the CPU, so
// the rows it writes are byte for byte the CPU path's and a loader's batches can be compared with
// a CPU-only loader's exactly. Like nvJPEG's hardware backend, it leaves to the CPU the files that
// hardware_route() refuses (progressive, CMYK, ...) and reports the files it cannot decode as
// failed; it can take a set time per image (a slow or fast "GPU"), fail chosen decode calls with a
// GpuDecodeError (a CUDA error), and records which samples it decoded.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "conveyor/datasets.h"
#include "conveyor/gpu_decode.h"

namespace conveyor::testing {

class SimulatedDeviceDecoders : public DeviceDecoderFactory {
 public:
  // What every decoder of the factory shares with the test.
  struct Record {
    std::mutex mutex;
    std::set<std::pair<uint64_t, size_t>> decoded;  // (epoch, index) written on the "device"
    size_t calls = 0;                               // decode() calls so far
    size_t largest_call = 0;                        // the most images one call was given
    size_t decoders = 0;                            // decoders made
  };

  // `device`: the device decoders are made for (the test copy engines' is the CPU).
  // `per_image`: the time each image takes. `fail_calls`: decode() calls (0-based, counted over
  // the factory) that throw GpuDecodeError named "cudaErrorIllegalAddress".
  explicit SimulatedDeviceDecoders(std::chrono::microseconds per_image = {},
                                   std::set<size_t> fail_calls = {})
      : per_image_(per_image), fail_calls_(std::move(fail_calls)) {}

  GpuDecodeStatus status(const c10::Device& device) const override {
    GpuDecodeStatus s;
    s.available = device.is_cpu();
    if (!s.available) s.reason = "the simulated decoder writes host memory only";
    return s;
  }
  std::unique_ptr<DeviceImageDecoder> make(const ImageTransform& transform, const c10::Device&,
                                           size_t) const override {
    std::lock_guard<std::mutex> lock(record_->mutex);
    ++record_->decoders;
    return std::make_unique<Decoder>(transform, record_, per_image_, fail_calls_);
  }
  std::string name() const override { return "simulated device decoder"; }

  const std::shared_ptr<Record>& record() const { return record_; }

 private:
  class Decoder : public DeviceImageDecoder {
   public:
    Decoder(const ImageTransform& transform, std::shared_ptr<Record> record,
            std::chrono::microseconds per_image, std::set<size_t> fail_calls)
        : writer_(transform),
          record_(std::move(record)),
          per_image_(per_image),
          fail_calls_(std::move(fail_calls)) {}

    GpuDecodeResult decode(const GpuJpeg* images, size_t count, uint8_t* const* rows) override {
      size_t call = 0;
      {
        std::lock_guard<std::mutex> lock(record_->mutex);
        call = record_->calls++;
        record_->largest_call = std::max(record_->largest_call, count);
      }
      if (fail_calls_.count(call)) {
        throw GpuDecodeError(
            "conveyor: nvjpegDecodeBatchedEx failed (cudaErrorIllegalAddress), "
            "decoding a batch of " +
                std::to_string(count) + " images from " + images[0].name,
            "cudaErrorIllegalAddress");
      }
      GpuDecodeResult result;
      for (size_t k = 0; k < count; ++k) {
        const GpuJpeg& image = images[k];
        if (per_image_.count() > 0) std::this_thread::sleep_for(per_image_);
        try {
          if (!hardware_route(image.data, image.size).hardware) {
            result.to_cpu.push_back(k);
            continue;
          }
          writer_.write(image.data, image.size, image.context,
                        reinterpret_cast<std::byte*>(rows[k]));
        } catch (const std::exception& e) {
          result.failed.push_back({k, e.what()});
          continue;
        }
        std::lock_guard<std::mutex> lock(record_->mutex);
        record_->decoded.emplace(image.context.epoch, image.context.index);
      }
      return result;
    }

   private:
    ImageWriter writer_;
    std::shared_ptr<Record> record_;
    std::chrono::microseconds per_image_;
    std::set<size_t> fail_calls_;
  };

  std::chrono::microseconds per_image_;
  std::set<size_t> fail_calls_;
  std::shared_ptr<Record> record_ = std::make_shared<Record>();
};

}  // namespace conveyor::testing
