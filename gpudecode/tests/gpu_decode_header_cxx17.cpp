// conveyor/gpu_decode.h and conveyor/decode_balance.h compile as C++17 on its own, as every public
// header must (LibTorch asks for C++17). Compiled only.
#include "conveyor/decode_balance.h"
#include "conveyor/gpu_decode.h"

#if __cplusplus != 201703L
#error "gpu_decode_header_cxx17.cpp must be compiled as C++17"
#endif
