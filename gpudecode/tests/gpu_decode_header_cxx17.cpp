// conveyor/gpu_decode.h compiles as C++17 on its own, as every public header must (LibTorch asks
// for C++17). Compiled only.
#include "conveyor/gpu_decode.h"

#if __cplusplus != 201703L
#error "gpu_decode_header_cxx17.cpp must be compiled as C++17"
#endif
