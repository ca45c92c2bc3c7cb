// GpuCropDecoder and gpu_decode_status() (conveyor/gpu_decode.h): nvJPEG's batched hardware
// decode of each crop's region, then crop_kernel.cu's resize, flip and layout into the rows.
#include "conveyor/gpu_decode.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "conveyor/cuda.h"
#include "conveyor/image_plan.h"
#include "conveyor/internal/cuda_check.h"
#include "conveyor/pinned.h"
#include "crop_kernel.h"
#include "crop_plan.h"
#include "nvjpeg_api.h"

namespace conveyor {

GpuDecodeError::GpuDecodeError(const std::string& what, std::string error_name, bool context_lost)
    : std::runtime_error(what), error_name_(std::move(error_name)), context_lost_(context_lost) {}

namespace {

using gpudecode::CropJob;
using gpudecode::CropPlan;
using gpudecode::DecodedRegion;
using gpudecode::nv::NvjpegLibrary;
namespace nv = gpudecode::nv;

// Throws GpuDecodeError naming the nvJPEG call and its status unless it succeeded.
void check_nvjpeg(nv::Status status, const char* call) {
  if (static_cast<int>(status) == nv::kStatusSuccess) return;
  const std::string name = nv::status_name(static_cast<int>(status));
  throw GpuDecodeError(std::string("conveyor: ") + call + " failed (" + name + ")", name);
}

// An nvJPEG object, destroyed by its library's function.
template <typename Object, typename DestroyFn>
class NvObject {
 public:
  NvObject() = default;
  NvObject(Object object, DestroyFn destroy) : object_(object), destroy_(destroy) {}
  NvObject(NvObject&& other) noexcept
      : object_(std::exchange(other.object_, nullptr)), destroy_(other.destroy_) {}
  NvObject& operator=(NvObject&& other) noexcept {
    if (this != &other) {
      reset();
      object_ = std::exchange(other.object_, nullptr);
      destroy_ = other.destroy_;
    }
    return *this;
  }
  NvObject(const NvObject&) = delete;
  NvObject& operator=(const NvObject&) = delete;
  ~NvObject() { reset(); }
  Object get() const { return object_; }

 private:
  void reset() {
    if (object_ != nullptr) destroy_(object_);
    object_ = nullptr;
  }
  Object object_ = nullptr;
  DestroyFn destroy_ = nullptr;
};

using OwnedHandle = NvObject<nv::Handle, nv::DestroyFn>;
using OwnedState = NvObject<nv::State, nv::StateDestroyFn>;
using OwnedStream = NvObject<nv::Stream, nv::StreamDestroyFn>;
using OwnedParams = NvObject<nv::Params, nv::ParamsDestroyFn>;

// The library, the device and a hardware-backend handle, or the reason there are none. The handle
// is declared after the library, so it is destroyed first.
struct Probe {
  GpuDecodeStatus status;
  std::shared_ptr<const NvjpegLibrary> library;
  OwnedHandle handle;
};

// The process's one load of the default library; files a setup names are loaded for it alone.
std::shared_ptr<const NvjpegLibrary> library_for(const GpuDecodeSetup& setup, std::string* why) {
  if (setup.library_paths.empty()) return NvjpegLibrary::process_library(why);
  std::optional<NvjpegLibrary> library = NvjpegLibrary::load(setup.library_paths, why);
  if (!library) return nullptr;
  return std::make_shared<const NvjpegLibrary>(std::move(*library));
}

Probe probe(const GpuDecodeSetup& setup) {
  Probe p;
  std::string why;
  p.library = library_for(setup, &why);
  if (!p.library) {
    p.status.reason = "GPU decode unavailable: " + why +
                      "; pip install nvidia-nvjpeg (scripts/setup does) or add its lib folder to "
                      "LD_LIBRARY_PATH";
    return p;
  }
  p.status.library = p.library->path();
  const CudaStatus cuda = cuda_status();
  if (!cuda.usable()) {
    p.status.reason = "GPU decode unavailable: no CUDA device (" + cuda.reason + ")";
    return p;
  }
  int device = setup.device;
  if (device < 0) detail::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device >= cuda.devices) {
    p.status.reason = "GPU decode unavailable: no CUDA device " + std::to_string(device) + " (" +
                      std::to_string(cuda.devices) + " visible)";
    return p;
  }
  p.status.device = device;
  detail::DeviceGuard guard(device);
  cudaDeviceProp prop{};
  std::string name = "cuda:" + std::to_string(device);
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    name += " (" + std::string(prop.name) + ")";
  nv::Handle handle = nullptr;
  const auto hardware = static_cast<nv::Backend>(nv::kBackendHardware);
  // Strict, so that a corrupt scan is an error rather than a garbage row; where this nvJPEG
  // refuses the flag with the hardware backend, the status says the decode is not strict.
  int created = static_cast<int>(
      p.library->create_ex(hardware, nullptr, nullptr, nv::kFlagsBitstreamStrict, &handle));
  p.status.strict = created == nv::kStatusSuccess;
  if (!p.status.strict) {
    handle = nullptr;
    created = static_cast<int>(p.library->create_ex(hardware, nullptr, nullptr, 0, &handle));
  }
  if (created != nv::kStatusSuccess) {
    p.status.reason = "GPU decode unavailable: no hardware JPEG engine on " + name +
                      " (nvjpegCreateEx with NVJPEG_BACKEND_HARDWARE: " + nv::status_name(created) +
                      ")";
    return p;
  }
  p.handle = OwnedHandle(handle, p.library->destroy);
  const int info = static_cast<int>(
      p.library->get_hardware_decoder_info(handle, &p.status.engines, &p.status.cores_per_engine));
  if (info != nv::kStatusSuccess || p.status.engines == 0) {
    p.status.reason = "GPU decode unavailable: no hardware JPEG engine on " + name +
                      " (nvjpegGetHardwareDecoderInfo: " + nv::status_name(info) + ", " +
                      std::to_string(p.status.engines) + " engines)";
    p.handle = OwnedHandle();
    return p;
  }
  p.status.available = true;
  return p;
}

// After a failure on `stream`: waits for what the stream still runs (nothing of the batch may
// write into memory the next one reuses), and says whether the device's context is lost. A sticky
// error is returned again by every later call, after cudaGetLastError() too; another is not.
bool wait_and_check_context_lost(cudaStream_t stream) {
  (void)cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  const cudaError_t again = cudaStreamQuery(stream);
  (void)cudaGetLastError();
  return again != cudaSuccess && again != cudaErrorNotReady;
}

// A baseline file whose data ends without EOI (after any trailing zero padding) was cut short:
// the hardware backend would decode it silently, the CPU path raises it through on_error.
bool ends_with_eoi(const uint8_t* data, size_t size) {
  while (size > 2 && data[size - 1] == 0) --size;
  return size >= 4 && data[size - 2] == 0xFF && data[size - 1] == 0xD9;
}

}  // namespace

GpuDecodeStatus gpu_decode_status(const GpuDecodeSetup& setup) {
  try {
    return probe(setup).status;
  } catch (const std::exception& e) {  // a CUDA call of the probe itself failed
    GpuDecodeStatus status;
    status.reason = std::string("GPU decode unavailable: ") + e.what();
    return status;
  }
}

struct GpuCropDecoder::State {
  GpuDecodeOptions options;
  Probe probe;
  OwnedState state;
  OwnedStream stream;               // header parsing, reused image after image
  std::vector<OwnedParams> params;  // one per image of a batch, created once
  std::vector<nv::Params> batch_params;
  std::vector<nv::Image> batch_images;
  std::vector<const unsigned char*> batch_data;
  std::vector<size_t> batch_lengths;
  std::vector<size_t> positions;  // the batch's images sent to the hardware
  std::vector<size_t> offsets;    // their regions' offsets in `regions`
  std::vector<CropPlan> plans;
  std::vector<DecodedRegion> regions_decoded;  // what nvJPEG decodes for each plan
  DeviceBuffer regions;  // the decoded regions: grows (at least doubling) only past its size
  size_t region_growths = 0;
  DeviceBuffer device_jobs;  // max_batch CropJobs
  HostBuffer host_jobs;      // max_batch CropJobs, pinned: their copy to device_jobs is async
  explicit State(GpuDecodeOptions o, Probe p)
      : options(std::move(o)),
        probe(std::move(p)),
        device_jobs(options.max_batch * sizeof(CropJob), probe.status.device),
        host_jobs(options.max_batch * sizeof(CropJob), HostBuffer::Kind::kAuto, false,
                  probe.status.device) {}
  CropJob* jobs_on_host() const { return reinterpret_cast<CropJob*>(host_jobs.data()); }
};

namespace {

// The bytes of one decoded region in the region buffer (256-byte aligned).
size_t region_buffer_bytes(size_t width, size_t height) {
  return (width * 3 * height + 255) / 256 * 256;
}

}  // namespace

GpuCropDecoder::GpuCropDecoder(GpuDecodeOptions options) {
  if (options.transform.size <= 0) {
    throw std::invalid_argument("GpuCropDecoder: ImageTransform.size must be positive");
  }
  options.max_batch = std::clamp<size_t>(options.max_batch, 1, 65535);  // the kernel's grid.y
  Probe p = probe(options.setup);
  if (!p.status.available) throw GpuDecodeError(p.status.reason, "unavailable");
  detail::DeviceGuard guard(p.status.device);
  state_ = std::make_unique<State>(std::move(options), std::move(p));
  State& s = *state_;
  const NvjpegLibrary& lib = *s.probe.library;
  nv::Handle handle = s.probe.handle.get();
  nv::State jpeg_state = nullptr;
  check_nvjpeg(lib.state_create(handle, &jpeg_state), "nvjpegJpegStateCreate");
  s.state = OwnedState(jpeg_state, lib.state_destroy);
  nv::Stream stream = nullptr;
  check_nvjpeg(lib.stream_create(handle, &stream), "nvjpegJpegStreamCreate");
  s.stream = OwnedStream(stream, lib.stream_destroy);
  const size_t n = s.options.max_batch;
  s.params.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    nv::Params params = nullptr;
    check_nvjpeg(lib.params_create(handle, &params), "nvjpegDecodeParamsCreate");
    s.params.emplace_back(params, lib.params_destroy);
    check_nvjpeg(
        lib.params_set_output_format(params, static_cast<nv::OutputFormat>(nv::kOutputRgbi)),
        "nvjpegDecodeParamsSetOutputFormat");
  }
  s.batch_params.reserve(n);
  s.batch_images.reserve(n);
  s.batch_data.reserve(n);
  s.batch_lengths.reserve(n);
  s.positions.reserve(n);
  s.offsets.reserve(n);
  s.plans.reserve(n);
  s.regions_decoded.reserve(n);
  if (s.options.expected_width > 0 && s.options.expected_height > 0) {
    // Allocated now, not mid-training (see GpuDecodeOptions). nvJPEG's pre-allocation is a hint:
    // where it fails, nvJPEG allocates at the first decode as it would without it.
    (void)lib.batched_pre_allocate(handle, s.state.get(), static_cast<int>(n),
                                   s.options.expected_width, s.options.expected_height,
                                   static_cast<nv::ChromaSubsampling>(nv::kCss444),
                                   static_cast<nv::OutputFormat>(nv::kOutputRgbi));
    s.regions =
        DeviceBuffer(n * region_buffer_bytes(static_cast<size_t>(s.options.expected_width),
                                             static_cast<size_t>(s.options.expected_height)),
                     s.probe.status.device);
  }
}

GpuCropDecoder::~GpuCropDecoder() {
  if (!state_) return;
  // nvJPEG's objects and the buffers belong to the decoder's device.
  try {
    detail::DeviceGuard guard(state_->probe.status.device);
    state_.reset();
  } catch (...) {
    state_.reset();
  }
}
GpuCropDecoder::GpuCropDecoder(GpuCropDecoder&&) noexcept = default;
GpuCropDecoder& GpuCropDecoder::operator=(GpuCropDecoder&&) noexcept = default;

const GpuDecodeStatus& GpuCropDecoder::status() const { return state_->probe.status; }

size_t GpuCropDecoder::buffer_growths() const { return state_->region_growths; }

GpuDecodeResult GpuCropDecoder::decode(const GpuJpeg* images, size_t count, uint8_t* device_rows,
                                       CUstream_st* stream) {
  const ImageTransform& t = state_->options.transform;
  const size_t row_bytes = static_cast<size_t>(t.size) * static_cast<size_t>(t.size) * 3;
  std::vector<uint8_t*> rows(count);
  for (size_t k = 0; k < count; ++k) rows[k] = device_rows + k * row_bytes;
  return decode(images, count, rows.data(), stream);
}

GpuDecodeResult GpuCropDecoder::decode(const GpuJpeg* images, size_t count, uint8_t* const* rows,
                                       CUstream_st* stream) {
  State& s = *state_;
  if (count > s.options.max_batch) {
    throw std::invalid_argument("GpuCropDecoder::decode: " + std::to_string(count) +
                                " images, more than max_batch " +
                                std::to_string(s.options.max_batch));
  }
  GpuDecodeResult result;
  if (count == 0) return result;
  const ImageTransform& t = s.options.transform;
  const NvjpegLibrary& lib = *s.probe.library;
  nv::Handle handle = s.probe.handle.get();
  const bool hwc = t.layout == ImageLayout::kHWC;
  const std::string batch_name = "a batch of " + std::to_string(count) + " images from " +
                                 images[0].name +
                                 " on cuda:" + std::to_string(s.probe.status.device);
  try {
    detail::DeviceGuard guard(s.probe.status.device);
    s.positions.clear();
    s.offsets.clear();
    s.plans.clear();
    s.regions_decoded.clear();
    s.batch_params.clear();
    size_t region_bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      const GpuJpeg& image = images[i];
      if (t.exif_orientation || !ends_with_eoi(image.data, image.size)) {
        result.to_cpu.push_back(i);
        continue;
      }
      const int parsed =
          static_cast<int>(lib.stream_parse_header(handle, image.data, image.size, s.stream.get()));
      if (parsed != nv::kStatusSuccess) {
        result.failed.push_back({i, image.name + ": nvJPEG cannot read the JPEG header (" +
                                        nv::status_name(parsed) + ")"});
        continue;
      }
      unsigned width = 0, height = 0;
      check_nvjpeg(lib.stream_get_frame_dimensions(s.stream.get(), &width, &height),
                   "nvjpegJpegStreamGetFrameDimensions");
      if (width == 0 || height == 0 ||
          static_cast<uint64_t>(width) * height > t.limits.max_pixels) {
        result.to_cpu.push_back(i);  // the CPU path rejects (or reports) it with its own message
        continue;
      }
      // The geometry is plan_image's (conveyor/image_plan.h), as on the CPU; plan_crop executes
      // its one view.
      const ViewPlan view =
          plan_image(t, static_cast<int>(width), static_cast<int>(height),
                     image.context.draw_seed(), image.context.epoch, image.context.index)
              .views.front();
      const CropPlan plan =
          gpudecode::plan_crop(static_cast<int>(width), static_cast<int>(height), view.x, view.y,
                               view.width, view.height, view.flip, t.size, t.dct_scales, hwc);
      // nvJPEG decodes whole MCUs around the plan's region; the kernel reads the plan's in it.
      const DecodedRegion region =
          gpudecode::decoded_region(plan, static_cast<int>(width), static_cast<int>(height));
      nv::Params params = s.params[s.positions.size()].get();
      check_nvjpeg(lib.params_set_roi(params, region.x, region.y, region.w, region.h),
                   "nvjpegDecodeParamsSetROI");
      int supported = -1;
      const int asked =
          static_cast<int>(lib.batched_supported_ex(handle, s.stream.get(), params, &supported));
      if (asked != nv::kStatusSuccess || supported != 0) {
        result.to_cpu.push_back(i);
        continue;
      }
      s.positions.push_back(i);
      s.offsets.push_back(region_bytes);
      s.plans.push_back(plan);
      s.regions_decoded.push_back(region);
      s.batch_params.push_back(params);
      region_bytes +=
          region_buffer_bytes(static_cast<size_t>(region.w), static_cast<size_t>(region.h));
    }
    const size_t n = s.positions.size();
    if (n == 0) return result;
    if (region_bytes > s.regions.size()) {
      // Freed first (the previous batch has finished: decode() waits for it), then at least
      // doubled, so that growths are few.
      const size_t grown = std::max(region_bytes, 2 * s.regions.size());
      if (s.regions) ++s.region_growths;
      s.regions = DeviceBuffer();
      s.regions = DeviceBuffer(grown, s.probe.status.device);
    }
    auto* regions = static_cast<uint8_t*>(s.regions.data());
    s.batch_images.assign(n, nv::Image{});
    s.batch_data.clear();
    s.batch_lengths.clear();
    for (size_t k = 0; k < n; ++k) {
      const GpuJpeg& image = images[s.positions[k]];
      const CropPlan& plan = s.plans[k];
      const DecodedRegion& region = s.regions_decoded[k];
      const size_t pitch = gpudecode::region_pitch(region);
      s.batch_images[k].channel[0] = regions + s.offsets[k];
      s.batch_images[k].pitch[0] = pitch;
      s.batch_data.push_back(image.data);
      s.batch_lengths.push_back(image.size);
      const uint8_t* roi = regions + s.offsets[k] + gpudecode::roi_offset(plan, region);
      s.jobs_on_host()[k] = CropJob{plan, roi, pitch, rows[s.positions[k]]};
    }
    check_nvjpeg(lib.batched_initialize(handle, s.state.get(), static_cast<int>(n), 1,
                                        static_cast<nv::OutputFormat>(nv::kOutputRgbi)),
                 "nvjpegDecodeBatchedInitialize");
    const int decoded = static_cast<int>(
        lib.batched_decode_ex(handle, s.state.get(), s.batch_data.data(), s.batch_lengths.data(),
                              s.batch_images.data(), s.batch_params.data(), stream));
    if (decoded == nv::kStatusBadJpeg || decoded == nv::kStatusIncompleteBitstream ||
        decoded == nv::kStatusJpegNotSupported) {
      // One of the files is corrupt past its header, and the batched call does not say which:
      // the CPU path decodes them all, and its on_error policy names the corrupt one. Work of
      // the call may still run on the stream: wait for it, so that the next call's
      // nvjpegDecodeBatchedInitialize (forbidden while a decode runs) and a growth of the region
      // buffer (cudaFree of memory it may still write) are safe.
      (void)cudaGetLastError();
      detail::check_cuda(cudaStreamSynchronize(stream),
                         "cudaStreamSynchronize after a batch nvJPEG refused");
      result.to_cpu.insert(result.to_cpu.end(), s.positions.begin(), s.positions.end());
      std::sort(result.to_cpu.begin(), result.to_cpu.end());
      return result;
    }
    check_nvjpeg(static_cast<nv::Status>(decoded), "nvjpegDecodeBatchedEx");
    auto* jobs = static_cast<CropJob*>(s.device_jobs.data());
    detail::check_cuda(cudaMemcpyAsync(jobs, s.jobs_on_host(), n * sizeof(CropJob),
                                       cudaMemcpyHostToDevice, stream),
                       "cudaMemcpyAsync of the crop jobs");
    detail::check_cuda(static_cast<cudaError_t>(
                           gpudecode::launch_crop_rows(jobs, static_cast<int>(n), t.size, stream)),
                       "the crop kernel's launch");
    // The pinned jobs and the regions are reused by the next batch: wait for this one.
    detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the decode");
  } catch (const GpuDecodeError& e) {
    const bool lost = wait_and_check_context_lost(stream);
    throw GpuDecodeError(std::string(e.what()) + ", decoding " + batch_name, e.error_name(), lost);
  } catch (const CudaError& e) {
    const bool lost = wait_and_check_context_lost(stream);
    throw GpuDecodeError(std::string(e.what()) + ", decoding " + batch_name, e.name(), lost);
  }
  std::sort(result.to_cpu.begin(), result.to_cpu.end());
  return result;
}

namespace {

// GpuCropDecoder on a stream of its own: the loader's device decoder (DeviceImageDecoder).
class NvjpegDeviceDecoder final : public DeviceImageDecoder {
 public:
  explicit NvjpegDeviceDecoder(GpuDecodeOptions options)
      : decoder_(std::move(options)), stream_(decoder_.status().device) {}
  ~NvjpegDeviceDecoder() override {
    try {  // the decoder's memory outlives whatever is still queued on the stream
      stream_.synchronize();
    } catch (...) {  // a sticky error: nothing runs on the device any more
    }
  }
  NvjpegDeviceDecoder(const NvjpegDeviceDecoder&) = delete;
  NvjpegDeviceDecoder& operator=(const NvjpegDeviceDecoder&) = delete;

  GpuDecodeResult decode(const GpuJpeg* images, size_t count, uint8_t* const* rows) override {
    return decoder_.decode(images, count, rows, stream_.native_handle());
  }

 private:
  GpuCropDecoder decoder_;
  CudaStream stream_;  // destroyed before the decoder
};

class NvjpegHardwareDecoders final : public DeviceDecoderFactory {
 public:
  explicit NvjpegHardwareDecoders(GpuDecodeSetup setup) : setup_(std::move(setup)) {}

  GpuDecodeStatus status(const c10::Device& device) const override {
    if (!device.is_cuda()) {
      GpuDecodeStatus status;
      status.reason = "GPU decode unavailable: batches go to " + device.str() +
                      ", and GPU decode writes into the batch's memory on a CUDA device";
      return status;
    }
    return gpu_decode_status(for_device(device));
  }
  std::unique_ptr<DeviceImageDecoder> make(const ImageTransform& transform,
                                           const c10::Device& device,
                                           size_t max_batch) const override {
    GpuDecodeOptions options;
    options.transform = transform;
    options.setup = for_device(device);
    options.max_batch = max_batch;
    return std::make_unique<NvjpegDeviceDecoder>(std::move(options));
  }
  std::string name() const override { return "nvJPEG hardware backend"; }

 private:
  GpuDecodeSetup for_device(const c10::Device& device) const {
    GpuDecodeSetup setup = setup_;
    setup.device = device.has_index() ? device.index() : -1;
    return setup;
  }
  GpuDecodeSetup setup_;
};

}  // namespace

std::shared_ptr<const DeviceDecoderFactory> nvjpeg_hardware_decoders(GpuDecodeSetup setup) {
  return std::make_shared<NvjpegHardwareDecoders>(std::move(setup));
}

}  // namespace conveyor
