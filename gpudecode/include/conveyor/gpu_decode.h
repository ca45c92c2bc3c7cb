// conveyor/gpu_decode.h: JPEG decoding on the GPU's hardware JPEG engines (nvJPEG's hardware
// backend), into the same rows as the CPU path, and whether it can run here.
//
// What it is for: on an A100, H100 or H200 the NVJPG engines decode JPEGs while the CPU workers
// decode others. GpuCropDecoder decodes a batch of JPEG files there, each only in the region its
// crop needs (nvjpegDecodeParamsSetROI), then resizes, flips and lays out each crop on the GPU as
// ImageWriter does on the CPU, with the same crop boxes (choose_crop for the sample's seed, epoch
// and index). So which decoder a sample goes to never changes the part of the image it shows;
// pixels differ only by the decoders' IDCT and chroma upsampling (see GpuCropDecoder).
//
// gpu_decode_status(): whether GPU decode is available, and why not: libnvjpeg.so.13 not found
// (PyPI's nvidia-nvjpeg; scripts/setup installs it into the project's venv), no CUDA device, or
// no hardware JPEG engine on the device. nvJPEG is loaded at run time (dlopen), so a build or a
// machine without it builds and runs exactly as without this library.
//
// hardware_route(): whether nvJPEG's hardware backend takes a file, from its header alone (read
// by libjpeg-turbo): baseline or extended Huffman-coded, 8-bit, one component or three with
// 4:4:4, 4:2:2, 4:2:0 or 4:4:0 sampling. Progressive, arithmetic-coded, 12-bit, lossless, CMYK,
// YCCK, 4:1:1 and 4:1:0 files go to the CPU. GpuCropDecoder also asks nvJPEG itself
// (nvjpegDecodeBatchedSupportedEx, 0 = supported) and sends whatever it refuses to the CPU.
//
// Requires: GpuCropDecoder needs gpu_decode_status().available; one decoder per thread.
// Guarantees: every nvJPEG and CUDA handle is owned (released by the destructors). A corrupt file
// fails only its own sample, with a message naming the file; a CUDA or nvJPEG failure of the
// batched decode throws GpuDecodeError (the error's name, the device, the batch's first file,
// and whether the error is sticky), and leaves the decoder usable for the next batch unless
// CUDA's error is sticky (GpuDecodeError::context_lost). The loader decodes the images of such a
// call on the CPU. This header compiles as C++17 and includes no CUDA or nvJPEG header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "conveyor/datasets.h"

struct CUstream_st;  // cudaStream_t

namespace conveyor {

// Where to look for nvJPEG, and on which device.
struct GpuDecodeSetup {
  // Files to dlopen, in order. Empty (the default): "libnvjpeg.so.13" through the loader's search
  // path, then the folder of the CUDA runtime this process loaded (a venv's nvidia/cu13/lib) and
  // the wheel's folder found when Conveyor was configured.
  std::vector<std::string> library_paths;
  // The CUDA device; -1 (the default): the current device.
  int device = -1;
};

// Whether GPU decode can run, and if not, why.
struct GpuDecodeStatus {
  bool available = false;
  std::string reason;    // why not, naming what is missing; empty when available
  std::string library;   // the libnvjpeg.so.13 that was loaded; empty if none
  int device = -1;       // the device asked about (-1: none usable)
  unsigned engines = 0;  // hardware JPEG engines (nvjpegGetHardwareDecoderInfo)
  unsigned cores_per_engine = 0;
  // Whether the handle refuses bitstreams that break the JPEG standard
  // (NVJPEG_FLAGS_BITSTREAM_STRICT), so that a file with corrupt entropy-coded data goes to the
  // CPU path and its on_error policy instead of becoming a garbage row. Always asked for; false
  // only where this nvJPEG refuses the flag with the hardware backend (then files are decoded
  // as leniently as nvJPEG does).
  bool strict = false;
};
GpuDecodeStatus gpu_decode_status(const GpuDecodeSetup& setup = {});

// Whether nvJPEG's hardware backend takes the JPEG `data`, from its header.
struct HardwareRoute {
  bool hardware = false;
  std::string reason;  // e.g. "progressive", "CMYK", "4:1:1 sampling"; empty when hardware
};
// Throws JpegError when `data` is not a JPEG whose header libjpeg-turbo reads.
HardwareRoute hardware_route(const uint8_t* data, size_t size);

// The batched decode failed on the GPU (a CUDA or nvJPEG error), failing the whole call.
class GpuDecodeError : public std::runtime_error {
 public:
  // `context_lost`: the error is sticky (an illegal address, a device-side assert, ...): the
  // device's CUDA context can no longer be used, so every later CUDA call on it fails too.
  GpuDecodeError(const std::string& what, std::string error_name, bool context_lost = false);
  // The CUDA error's or nvJPEG status's name, e.g. "cudaErrorIllegalAddress".
  const std::string& error_name() const { return error_name_; }
  bool context_lost() const { return context_lost_; }

 private:
  std::string error_name_;
  bool context_lost_ = false;
};

// One JPEG file of a batch: its bytes (host memory, valid during decode()), the sample it is
// (for choose_crop) and its name (for errors).
struct GpuJpeg {
  const uint8_t* data = nullptr;
  size_t size = 0;
  SampleContext context;
  std::string name;
};

// What decode() did with each image of the batch. Rows of images in neither list were written.
struct GpuDecodeResult {
  std::vector<size_t> to_cpu;  // positions the hardware refused; decode them with ImageWriter
  struct Failure {
    size_t position = 0;
    std::string message;  // names the file and nvJPEG's status
  };
  std::vector<Failure> failed;  // corrupt or truncated files
};

// Options of a GpuCropDecoder; fixed for its lifetime.
struct GpuDecodeOptions {
  ImageTransform transform;  // as the CPU path's; exif_orientation sends every file to the CPU
  GpuDecodeSetup setup;
  size_t max_batch = 256;  // images per decode() call
  // The largest region (width x height pixels) expected to be decoded for one image. nvJPEG's
  // buffers (nvjpegDecodeBatchedPreAllocate) and the decoder's own region buffer are allocated
  // for max_batch images of this size when the decoder is made, so that decoding does not
  // cudaFree and cudaMalloc (each a wait for the whole device) in the middle of training. A
  // larger region grows the buffers then (the region buffer at least doubles: see
  // GpuCropDecoder::buffer_growths()). 0 x 0: no pre-allocation. The default, 512 x 512 (most
  // ImageNet photos, 500 x 375), costs about 200 MB of device memory for each 256 images of
  // max_batch in the region buffer, and as much again in nvJPEG's.
  int expected_width = 512;
  int expected_height = 512;
};

// Decodes batches of JPEG files on the hardware engines into size x size x 3 uint8 rows (CHW or
// HWC, as transform.layout says) in device memory. The crop box is choose_crop's; the region the
// CPU path would decode at DCT scale M/8 is decoded at full scale and each M/8 pixel is the mean
// of the 8/M x 8/M pixels it stands for, then resized with libyuv's bilinear arithmetic
// (gpudecode/src/crop_plan.h). Tolerance against the CPU path: the decoders' rounding only, a
// maximum absolute difference per channel of at most kMaxAbsDiff on baseline photos at quality
// 90, and a PSNR of at least kMinPsnr dB (gpudecode_gpu_test measures both).
class GpuCropDecoder {
 public:
  static constexpr int kMaxAbsDiff = 48;
  static constexpr double kMinPsnr = 30.0;

  // Throws GpuDecodeError with gpu_decode_status()'s reason when GPU decode is unavailable.
  explicit GpuCropDecoder(GpuDecodeOptions options);
  ~GpuCropDecoder();
  GpuCropDecoder(GpuCropDecoder&&) noexcept;
  GpuCropDecoder& operator=(GpuCropDecoder&&) noexcept;

  // Decodes images[0 .. count) (count <= max_batch) into rows of `device_rows` (count rows of
  // size*size*3 bytes, on the decoder's device), ordered on `stream`; returns once the rows are
  // written. Throws GpuDecodeError when the batch fails on the GPU.
  GpuDecodeResult decode(const GpuJpeg* images, size_t count, uint8_t* device_rows,
                         CUstream_st* stream);
  // The same, image k's row at rows[k] (count pointers into device memory of the decoder's
  // device, each to size*size*3 bytes): the loader's batches of several chunks, each image
  // written into its own slot's rows.
  GpuDecodeResult decode(const GpuJpeg* images, size_t count, uint8_t* const* rows,
                         CUstream_st* stream);

  const GpuDecodeStatus& status() const;
  // How many times the region buffer had to grow past what was allocated when the decoder was
  // made (each growth a cudaFree and a cudaMalloc, which wait for the whole device).
  size_t buffer_growths() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// What the loader's GPU decode (LoaderOptions::gpu_decode, conveyor/loader.h) drives: a decoder
// of batches of JPEG files into rows of a device's memory, used by one thread at a time.
// decode() writes images[k] into rows[k] (transform.size^2 x 3 bytes of the device's memory, laid
// out as transform.layout says) and returns once those rows are written, so that any stream may
// read them afterwards; it reports the images it left to the CPU and the files it could not read
// (their rows unwritten) as GpuCropDecoder::decode does, and throws GpuDecodeError when the batch
// fails on the device (with context_lost() when the device can no longer be used: the loader then
// raises that error instead of going on). count is at most the max_batch the decoder was made
// for.
class DeviceImageDecoder {
 public:
  virtual ~DeviceImageDecoder() = default;
  virtual GpuDecodeResult decode(const GpuJpeg* images, size_t count, uint8_t* const* rows) = 0;
};

// Makes the loader's device decoders. nvjpeg_hardware_decoders() is the real one; another factory
// (a test's decoder whose "device" is host memory, another hardware decoder) plugs in through
// GpuDecode::decoder.
class DeviceDecoderFactory {
 public:
  virtual ~DeviceDecoderFactory() = default;
  // Whether decoders for `device` (the loader's copy stage's device) can be made, and if not, why.
  virtual GpuDecodeStatus status(const c10::Device& device) const = 0;
  // A decoder for `device` that decodes up to `max_batch` images a call with `transform`. Throws
  // (GpuDecodeError, CudaError, ...) when it cannot be made.
  virtual std::unique_ptr<DeviceImageDecoder> make(const ImageTransform& transform,
                                                   const c10::Device& device,
                                                   size_t max_batch) const = 0;
  // What the loader's mode() calls it, e.g. "nvJPEG hardware backend".
  virtual std::string name() const = 0;
};

// GpuCropDecoder on a CUDA stream of its own (created non-blocking on the device, destroyed with
// the decoder). status() is gpu_decode_status() for the device (a CPU device: unavailable).
// `setup.device` is ignored: the loader's device rules.
std::shared_ptr<const DeviceDecoderFactory> nvjpeg_hardware_decoders(GpuDecodeSetup setup = {});

}  // namespace conveyor
