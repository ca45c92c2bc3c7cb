// gpudecode/src/nvjpeg_api.h (build-only): the part of nvJPEG's C API that conveyor_gpudecode
// calls, and the library that provides it, loaded at run time.
//
// Why dlopen and not a link: nvJPEG comes from PyPI's nvidia-nvjpeg wheel as libnvjpeg.so.13
// only (no unversioned .so, no CMake package), and a machine without the wheel must build and run
// exactly as it does without GPU decode. Declaring the dozen entry points used here means the
// build never needs the wheel; where CMake finds the wheel's nvjpeg.h, nvjpeg_api_check.cpp
// compiles this file against it (CONVEYOR_NVJPEG_REAL_HEADER) and static_asserts that every
// declaration below has the header's type and every constant its value.
//
// NvjpegLibrary: one dlopen'ed libnvjpeg.so.13 and its entry points, owned (dlclose in the
// destructor). Requires: nothing. Guarantees: load() either returns a library whose every entry
// point is resolved or an empty optional with the reason (each path tried and dlerror's text).
// process_library() is the process's one load of the default library: GPU decode's probes and
// decoders share it instead of loading and unloading libnvjpeg each time.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#if defined(CONVEYOR_NVJPEG_REAL_HEADER)
#include <nvjpeg.h>
#endif

struct CUstream_st;  // cudaStream_t, without a CUDA header

namespace conveyor::gpudecode::nv {

#if defined(CONVEYOR_NVJPEG_REAL_HEADER)
using Status = nvjpegStatus_t;
using Backend = nvjpegBackend_t;
using OutputFormat = nvjpegOutputFormat_t;
using ChromaSubsampling = nvjpegChromaSubsampling_t;
using Image = nvjpegImage_t;
using DevAllocator = nvjpegDevAllocator_t;
using PinnedAllocator = nvjpegPinnedAllocator_t;
using Handle = nvjpegHandle_t;
using State = nvjpegJpegState_t;
using Stream = nvjpegJpegStream_t;
using Params = nvjpegDecodeParams_t;
#else
// The header's C enums (int-sized); the values are those of nvjpeg.h 13.x.
enum Status : int {};
enum Backend : int {};
enum OutputFormat : int {};
enum ChromaSubsampling : int {};
struct Image {
  unsigned char* channel[4];
  size_t pitch[4];
};
struct DevAllocator;
struct PinnedAllocator;
using Handle = struct nvjpegHandle*;
using State = struct nvjpegJpegState*;
using Stream = struct nvjpegJpegStream*;
using Params = struct nvjpegDecodeParams*;
#endif

constexpr int kStatusSuccess = 0;
constexpr int kStatusBadJpeg = 3;
constexpr int kStatusJpegNotSupported = 4;
constexpr int kStatusExecutionFailed = 6;
constexpr int kStatusArchMismatch = 7;
constexpr int kStatusIncompleteBitstream = 10;
constexpr int kBackendHardware = 3;
constexpr int kOutputRgbi = 5;  // interleaved RGB, one plane
constexpr int kCss444 = 0;      // NVJPEG_CSS_444: the largest buffers per pixel
// NVJPEG_FLAGS_BITSTREAM_STRICT: a bitstream that does not follow the JPEG standard (corrupt
// entropy-coded data, say) is an error, never decoded as well as can be.
constexpr unsigned kFlagsBitstreamStrict = 1u << 2;

// The name of an nvjpegStatus_t, e.g. "NVJPEG_STATUS_BAD_JPEG".
const char* status_name(int status);

using CreateExFn = Status (*)(Backend, DevAllocator*, PinnedAllocator*, unsigned int, Handle*);
using DestroyFn = Status (*)(Handle);
using StateCreateFn = Status (*)(Handle, State*);
using StateDestroyFn = Status (*)(State);
using BatchedInitializeFn = Status (*)(Handle, State, int, int, OutputFormat);
using BatchedPreAllocateFn = Status (*)(Handle, State, int, int, int, ChromaSubsampling,
                                        OutputFormat);
using BatchedDecodeExFn = Status (*)(Handle, State, const unsigned char* const*, const size_t*,
                                     Image*, Params*, CUstream_st*);
using BatchedSupportedExFn = Status (*)(Handle, Stream, Params, int*);
using StreamCreateFn = Status (*)(Handle, Stream*);
using StreamDestroyFn = Status (*)(Stream);
using StreamParseHeaderFn = Status (*)(Handle, const unsigned char*, size_t, Stream);
using ParamsCreateFn = Status (*)(Handle, Params*);
using ParamsDestroyFn = Status (*)(Params);
using ParamsSetOutputFormatFn = Status (*)(Params, OutputFormat);
using ParamsSetRoiFn = Status (*)(Params, int, int, int, int);
using StreamGetFrameDimensionsFn = Status (*)(Stream, unsigned int*, unsigned int*);
using GetHardwareDecoderInfoFn = Status (*)(Handle, unsigned int*, unsigned int*);

class NvjpegLibrary {
 public:
  // The soname the wheel ships; load() tries it through the loader's own search (LD_LIBRARY_PATH,
  // rpaths, a copy already loaded, e.g. by torchvision) and then in the folders of
  // default_library_dirs().
  static constexpr const char* kSoname = "libnvjpeg.so.13";
  // The folders the wheel puts it in, relative to the CUDA runtime this process loaded (the
  // venv's nvidia/cu13/lib holds libcudart.so.13 and libnvjpeg.so.13; older wheels used
  // nvidia/nvjpeg/lib), and the wheel's folder found at configure time.
  static std::vector<std::string> default_library_dirs();

  // `paths` empty: the soname, then kSoname in each default folder. Otherwise exactly these
  // files, in order. On failure, `reason` (if given) says what was tried and why each failed.
  static std::optional<NvjpegLibrary> load(const std::vector<std::string>& paths = {},
                                           std::string* reason = nullptr);
  // load() with no paths, done once per process (the first call; thread-safe) and kept until the
  // process exits, or for as long as a holder of the pointer lives. nullptr when it failed, with
  // the first attempt's reason in `reason` (not retried).
  static std::shared_ptr<const NvjpegLibrary> process_library(std::string* reason = nullptr);

  NvjpegLibrary(NvjpegLibrary&& other) noexcept;
  NvjpegLibrary& operator=(NvjpegLibrary&& other) noexcept;
  NvjpegLibrary(const NvjpegLibrary&) = delete;
  NvjpegLibrary& operator=(const NvjpegLibrary&) = delete;
  ~NvjpegLibrary();

  const std::string& path() const { return path_; }  // the file dlopen loaded

  CreateExFn create_ex = nullptr;
  DestroyFn destroy = nullptr;
  StateCreateFn state_create = nullptr;
  StateDestroyFn state_destroy = nullptr;
  BatchedInitializeFn batched_initialize = nullptr;
  BatchedPreAllocateFn batched_pre_allocate = nullptr;
  BatchedDecodeExFn batched_decode_ex = nullptr;
  BatchedSupportedExFn batched_supported_ex = nullptr;
  StreamCreateFn stream_create = nullptr;
  StreamDestroyFn stream_destroy = nullptr;
  StreamParseHeaderFn stream_parse_header = nullptr;
  ParamsCreateFn params_create = nullptr;
  ParamsDestroyFn params_destroy = nullptr;
  ParamsSetOutputFormatFn params_set_output_format = nullptr;
  ParamsSetRoiFn params_set_roi = nullptr;
  StreamGetFrameDimensionsFn stream_get_frame_dimensions = nullptr;
  GetHardwareDecoderInfoFn get_hardware_decoder_info = nullptr;

 private:
  NvjpegLibrary() = default;
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace conveyor::gpudecode::nv
