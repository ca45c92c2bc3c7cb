#include "nvjpeg_api.h"

#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include <filesystem>
#include <utility>

namespace conveyor::gpudecode::nv {

const char* status_name(int status) {
  switch (status) {
    case 0:
      return "NVJPEG_STATUS_SUCCESS";
    case 1:
      return "NVJPEG_STATUS_NOT_INITIALIZED";
    case 2:
      return "NVJPEG_STATUS_INVALID_PARAMETER";
    case 3:
      return "NVJPEG_STATUS_BAD_JPEG";
    case 4:
      return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case 5:
      return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case 6:
      return "NVJPEG_STATUS_EXECUTION_FAILED";
    case 7:
      return "NVJPEG_STATUS_ARCH_MISMATCH";
    case 8:
      return "NVJPEG_STATUS_INTERNAL_ERROR";
    case 9:
      return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case 10:
      return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
    default:
      return "NVJPEG_STATUS_UNKNOWN";
  }
}

std::vector<std::string> NvjpegLibrary::default_library_dirs() {
  std::vector<std::string> dirs;
  Dl_info info{};
  // The CUDA runtime this process uses: in a venv, the wheel's nvidia/cu13/lib.
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) != 0 && info.dli_fname) {
    const std::filesystem::path dir = std::filesystem::path(info.dli_fname).parent_path();
    if (!dir.empty()) {
      dirs.push_back(dir.string());
      dirs.push_back((dir.parent_path().parent_path() / "nvjpeg" / "lib").string());
    }
  }
#if defined(CONVEYOR_NVJPEG_WHEEL_DIR)
  dirs.emplace_back(CONVEYOR_NVJPEG_WHEEL_DIR);
#endif
  return dirs;
}

namespace {
template <typename Fn>
bool resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    missing += missing.empty() ? name : std::string(", ") + name;
    return false;
  }
  fn = reinterpret_cast<Fn>(symbol);
  return true;
}
}  // namespace

std::optional<NvjpegLibrary> NvjpegLibrary::load(const std::vector<std::string>& paths,
                                                 std::string* reason) {
  std::vector<std::string> candidates = paths;
  if (candidates.empty()) {
    candidates.emplace_back(kSoname);
    for (const std::string& dir : default_library_dirs()) {
      candidates.push_back((std::filesystem::path(dir) / kSoname).string());
    }
  }
  std::string tried;
  for (const std::string& candidate : candidates) {
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      tried += (tried.empty() ? "" : "; ") + std::string(error ? error : candidate.c_str());
      continue;
    }
    NvjpegLibrary library;
    library.handle_ = handle;
    char origin[4096] = {};
    library.path_ = dlinfo(handle, RTLD_DI_ORIGIN, origin) == 0
                        ? (std::filesystem::path(origin) / kSoname).string()
                        : candidate;
    std::string missing;
    resolve(handle, "nvjpegCreateEx", library.create_ex, missing);
    resolve(handle, "nvjpegDestroy", library.destroy, missing);
    resolve(handle, "nvjpegJpegStateCreate", library.state_create, missing);
    resolve(handle, "nvjpegJpegStateDestroy", library.state_destroy, missing);
    resolve(handle, "nvjpegDecodeBatchedInitialize", library.batched_initialize, missing);
    resolve(handle, "nvjpegDecodeBatchedPreAllocate", library.batched_pre_allocate, missing);
    resolve(handle, "nvjpegDecodeBatchedEx", library.batched_decode_ex, missing);
    resolve(handle, "nvjpegDecodeBatchedSupportedEx", library.batched_supported_ex, missing);
    resolve(handle, "nvjpegJpegStreamCreate", library.stream_create, missing);
    resolve(handle, "nvjpegJpegStreamDestroy", library.stream_destroy, missing);
    resolve(handle, "nvjpegJpegStreamParseHeader", library.stream_parse_header, missing);
    resolve(handle, "nvjpegDecodeParamsCreate", library.params_create, missing);
    resolve(handle, "nvjpegDecodeParamsDestroy", library.params_destroy, missing);
    resolve(handle, "nvjpegDecodeParamsSetOutputFormat", library.params_set_output_format, missing);
    resolve(handle, "nvjpegDecodeParamsSetROI", library.params_set_roi, missing);
    resolve(handle, "nvjpegJpegStreamGetFrameDimensions", library.stream_get_frame_dimensions,
            missing);
    resolve(handle, "nvjpegGetHardwareDecoderInfo", library.get_hardware_decoder_info, missing);
    if (missing.empty()) return library;
    tried += (tried.empty() ? "" : "; ") + library.path_ + " lacks " + missing;
  }
  if (reason) *reason = std::string(kSoname) + " not loaded (" + tried + ")";
  return std::nullopt;
}

std::shared_ptr<const NvjpegLibrary> NvjpegLibrary::process_library(std::string* reason) {
  struct Loaded {
    std::shared_ptr<const NvjpegLibrary> library;
    std::string reason;
  };
  // The one load (a function-local static: C++ makes its initialization thread-safe). Nothing
  // else of GPU decode is process-wide.
  static const Loaded loaded = [] {
    Loaded result;
    std::optional<NvjpegLibrary> library = load({}, &result.reason);
    if (library) result.library = std::make_shared<const NvjpegLibrary>(std::move(*library));
    return result;
  }();
  if (!loaded.library && reason != nullptr) *reason = loaded.reason;
  return loaded.library;
}

NvjpegLibrary::NvjpegLibrary(NvjpegLibrary&& other) noexcept { *this = std::move(other); }

NvjpegLibrary& NvjpegLibrary::operator=(NvjpegLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
    create_ex = other.create_ex;
    destroy = other.destroy;
    state_create = other.state_create;
    state_destroy = other.state_destroy;
    batched_initialize = other.batched_initialize;
    batched_pre_allocate = other.batched_pre_allocate;
    batched_decode_ex = other.batched_decode_ex;
    batched_supported_ex = other.batched_supported_ex;
    stream_create = other.stream_create;
    stream_destroy = other.stream_destroy;
    stream_parse_header = other.stream_parse_header;
    params_create = other.params_create;
    params_destroy = other.params_destroy;
    params_set_output_format = other.params_set_output_format;
    params_set_roi = other.params_set_roi;
    stream_get_frame_dimensions = other.stream_get_frame_dimensions;
    get_hardware_decoder_info = other.get_hardware_decoder_info;
  }
  return *this;
}

NvjpegLibrary::~NvjpegLibrary() {
  if (handle_) dlclose(handle_);
}

}  // namespace conveyor::gpudecode::nv
