// A device decoder for the loader's GPU decode (LoaderOptions::gpu_decode) whose "device" is
// host memory, for the tests that run without a GPU: it decodes with ImageWriter on the CPU, so
// the rows it writes are byte for byte the CPU path's and a loader's batches can be compared with
// a CPU-only loader's exactly. Like nvJPEG's hardware backend, it leaves to the CPU the files that
// hardware_route() refuses (progressive, CMYK, ...) and reports the files it cannot decode as
// failed; it can take a set time per image (a slow or fast "GPU"), fail chosen decode calls with a
// GpuDecodeError (a CUDA error, sticky or not: a sticky one marks the "device" lost, for a test
// copy engine that then fails as a real copy stream would), and records which samples it decoded.
// With Pixels::kGpuMath it makes each row as GpuCropDecoder does on the hardware, libjpeg-turbo
// standing in for nvJPEG: the region nvJPEG would decode around the crop (decoded_region), then
// the crop kernel's math (crop_plan.h) from the ROI's place in it (roi_offset). Where the CPU
// path decodes at 8/8 (transform.dct_scales = kFullDctScale), that is the CPU path's bytes
// exactly, so a loader test sees a region read one pixel off.
#pragma once

#include <algorithm>
#include <atomic>
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
#include "conveyor/jpeg.h"
#include "crop_plan.h"  // gpudecode/src: the kernel's math

namespace conveyor::testing {

class SimulatedDeviceDecoders : public DeviceDecoderFactory {
 public:
  enum class Pixels {
    kCpuPath,  // ImageWriter's bytes
    kGpuMath,  // GpuCropDecoder's steps on a full-scale CPU decode
  };
  // What every decoder of the factory shares with the test.
  struct Record {
    std::mutex mutex;
    std::set<std::pair<uint64_t, size_t>> decoded;  // (epoch, index) written on the "device"
    std::set<std::pair<uint64_t, size_t>> given;    // (epoch, index) of every image decode() got
    size_t calls = 0;                               // decode() calls so far
    size_t largest_call = 0;                        // the most images one call was given
    size_t decoders = 0;                            // decoders made
    std::atomic<bool> device_lost{false};           // a sticky failure was raised
  };

  // `device`: the device decoders are made for (the test copy engines' is the CPU).
  // `per_image`: the time each image takes. `fail_calls`: decode() calls (0-based, counted over
  // the factory) that throw GpuDecodeError named "cudaErrorIllegalAddress", with context_lost()
  // when `sticky`.
  explicit SimulatedDeviceDecoders(std::chrono::microseconds per_image = {},
                                   std::set<size_t> fail_calls = {}, bool sticky = false,
                                   Pixels pixels = Pixels::kCpuPath)
      : per_image_(per_image),
        fail_calls_(std::move(fail_calls)),
        sticky_(sticky),
        pixels_(pixels) {}

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
    return std::make_unique<Decoder>(transform, record_, per_image_, fail_calls_, sticky_, pixels_);
  }
  std::string name() const override { return "simulated device decoder"; }

  const std::shared_ptr<Record>& record() const { return record_; }

 private:
  class Decoder : public DeviceImageDecoder {
   public:
    Decoder(const ImageTransform& transform, std::shared_ptr<Record> record,
            std::chrono::microseconds per_image, std::set<size_t> fail_calls, bool sticky,
            Pixels pixels)
        : writer_(transform),
          full_scale_(transform.limits, full_scale_options()),
          record_(std::move(record)),
          per_image_(per_image),
          fail_calls_(std::move(fail_calls)),
          sticky_(sticky),
          pixels_(pixels) {}

    GpuDecodeResult decode(const GpuJpeg* images, size_t count, uint8_t* const* rows) override {
      size_t call = 0;
      {
        std::lock_guard<std::mutex> lock(record_->mutex);
        call = record_->calls++;
        record_->largest_call = std::max(record_->largest_call, count);
      }
      if (fail_calls_.count(call)) {
        if (sticky_) record_->device_lost.store(true);
        throw GpuDecodeError(
            "conveyor: nvjpegDecodeBatchedEx failed (cudaErrorIllegalAddress), "
            "decoding a batch of " +
                std::to_string(count) + " images from " + images[0].name,
            "cudaErrorIllegalAddress", sticky_);
      }
      GpuDecodeResult result;
      for (size_t k = 0; k < count; ++k) {
        const GpuJpeg& image = images[k];
        {
          std::lock_guard<std::mutex> lock(record_->mutex);
          record_->given.emplace(image.context.epoch, image.context.index);
        }
        if (per_image_.count() > 0) std::this_thread::sleep_for(per_image_);
        try {
          if (!hardware_route(image.data, image.size).hardware) {
            result.to_cpu.push_back(k);
            continue;
          }
          if (pixels_ == Pixels::kGpuMath) {
            gpu_math(image, rows[k]);
          } else {
            writer_.write(image.data, image.size, image.context,
                          reinterpret_cast<std::byte*>(rows[k]));
          }
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
    static DecodeOptions full_scale_options() {
      DecodeOptions o;
      o.channels = 3;
      o.fast_upsampling = true;  // as ImageWriter decodes
      o.dct_scales = kFullDctScale;
      return o;
    }
    // GpuCropDecoder's steps: the crop's plan, the region nvJPEG decodes around it (copied out of
    // a full-scale decode at the region's own pitch, as nvJPEG writes it), the kernel's math.
    void gpu_math(const GpuJpeg& image, uint8_t* row) {
      const ImageTransform& t = writer_.transform();
      const DecodedImage full = full_scale_.decode(image.data, image.size);
      const CropBox box = choose_crop(t, full.width, full.height, image.context.seed,
                                      image.context.epoch, image.context.index);
      const gpudecode::CropPlan plan =
          gpudecode::plan_crop(full.width, full.height, box.x, box.y, box.width, box.height,
                               box.flip, t.size, t.dct_scales, t.layout == ImageLayout::kHWC);
      const gpudecode::DecodedRegion region =
          gpudecode::decoded_region(plan, full.width, full.height);
      const size_t pitch = gpudecode::region_pitch(region);
      region_.resize(static_cast<size_t>(region.h) * pitch);
      for (int y = 0; y < region.h; ++y) {
        std::copy_n(full.pixels + static_cast<size_t>(region.y + y) * full.stride +
                        static_cast<size_t>(region.x) * 3,
                    pitch, region_.data() + static_cast<size_t>(y) * pitch);
      }
      const uint8_t* roi = region_.data() + gpudecode::roi_offset(plan, region);
      for (int oy = 0; oy < plan.side; ++oy) {
        for (int ox = 0; ox < plan.side; ++ox) {
          uint8_t rgb[3];
          gpudecode::crop_pixel(roi, pitch, plan, ox, oy, rgb);
          for (int c = 0; c < 3; ++c) row[gpudecode::output_offset(plan, ox, oy, c)] = rgb[c];
        }
      }
    }

    ImageWriter writer_;
    JpegDecoder full_scale_;
    std::vector<uint8_t> region_;
    std::shared_ptr<Record> record_;
    std::chrono::microseconds per_image_;
    std::set<size_t> fail_calls_;
    bool sticky_;
    Pixels pixels_;
  };

  std::chrono::microseconds per_image_;
  std::set<size_t> fail_calls_;
  bool sticky_;
  Pixels pixels_;
  std::shared_ptr<Record> record_ = std::make_shared<Record>();
};

}  // namespace conveyor::testing
