// Compiled only where CMake found nvjpeg.h (the nvidia-nvjpeg wheel): every entry point that
// nvjpeg_api.h declares has the header's type, and every constant the header's value, so the
// declarations the build uses elsewhere cannot drift from the library's ABI unnoticed.
#define CONVEYOR_NVJPEG_REAL_HEADER 1
#include <cstddef>
#include <type_traits>

#include "nvjpeg_api.h"

namespace conveyor::gpudecode::nv {

static_assert(std::is_same_v<CreateExFn, decltype(&::nvjpegCreateEx)>);
static_assert(std::is_same_v<DestroyFn, decltype(&::nvjpegDestroy)>);
static_assert(std::is_same_v<StateCreateFn, decltype(&::nvjpegJpegStateCreate)>);
static_assert(std::is_same_v<StateDestroyFn, decltype(&::nvjpegJpegStateDestroy)>);
static_assert(std::is_same_v<BatchedInitializeFn, decltype(&::nvjpegDecodeBatchedInitialize)>);
static_assert(std::is_same_v<BatchedPreAllocateFn, decltype(&::nvjpegDecodeBatchedPreAllocate)>);
static_assert(std::is_same_v<BatchedDecodeExFn, decltype(&::nvjpegDecodeBatchedEx)>);
static_assert(std::is_same_v<BatchedSupportedExFn, decltype(&::nvjpegDecodeBatchedSupportedEx)>);
static_assert(std::is_same_v<StreamCreateFn, decltype(&::nvjpegJpegStreamCreate)>);
static_assert(std::is_same_v<StreamDestroyFn, decltype(&::nvjpegJpegStreamDestroy)>);
static_assert(std::is_same_v<StreamParseHeaderFn, decltype(&::nvjpegJpegStreamParseHeader)>);
static_assert(std::is_same_v<ParamsCreateFn, decltype(&::nvjpegDecodeParamsCreate)>);
static_assert(std::is_same_v<ParamsDestroyFn, decltype(&::nvjpegDecodeParamsDestroy)>);
static_assert(
    std::is_same_v<ParamsSetOutputFormatFn, decltype(&::nvjpegDecodeParamsSetOutputFormat)>);
static_assert(std::is_same_v<ParamsSetRoiFn, decltype(&::nvjpegDecodeParamsSetROI)>);
static_assert(
    std::is_same_v<StreamGetFrameDimensionsFn, decltype(&::nvjpegJpegStreamGetFrameDimensions)>);
static_assert(std::is_same_v<GetHardwareDecoderInfoFn, decltype(&::nvjpegGetHardwareDecoderInfo)>);

static_assert(kStatusSuccess == NVJPEG_STATUS_SUCCESS);
static_assert(kStatusBadJpeg == NVJPEG_STATUS_BAD_JPEG);
static_assert(kStatusJpegNotSupported == NVJPEG_STATUS_JPEG_NOT_SUPPORTED);
static_assert(kStatusExecutionFailed == NVJPEG_STATUS_EXECUTION_FAILED);
static_assert(kStatusArchMismatch == NVJPEG_STATUS_ARCH_MISMATCH);
static_assert(kStatusIncompleteBitstream == NVJPEG_STATUS_INCOMPLETE_BITSTREAM);
static_assert(kBackendHardware == NVJPEG_BACKEND_HARDWARE);
static_assert(kOutputRgbi == NVJPEG_OUTPUT_RGBI);
static_assert(kCss444 == NVJPEG_CSS_444);
static_assert(kFlagsBitstreamStrict == NVJPEG_FLAGS_BITSTREAM_STRICT);
static_assert(sizeof(nvjpegChromaSubsampling_t) == sizeof(int));
// The fallback declarations' layouts: int-sized enums, and nvjpegImage_t as four channel
// pointers followed by four pitches.
static_assert(sizeof(nvjpegStatus_t) == sizeof(int) && sizeof(nvjpegBackend_t) == sizeof(int));
static_assert(sizeof(nvjpegOutputFormat_t) == sizeof(int));
static_assert(NVJPEG_MAX_COMPONENT == 4);
static_assert(offsetof(nvjpegImage_t, pitch) == 4 * sizeof(unsigned char*));
static_assert(sizeof(nvjpegImage_t) == 4 * sizeof(unsigned char*) + 4 * sizeof(size_t));

}  // namespace conveyor::gpudecode::nv
