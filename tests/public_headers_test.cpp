// public_headers_cxx17: the public headers compile as C++17 (built with CXX_STANDARD 17 and -Wall
// -Wextra -Wpedantic -Werror): LibTorch asks for C++17, so a drop-in for torch::data must compile
// wherever it does. This file names each public header on its own (not only through conveyor.h),
// so that a header reached only through the umbrella would still be checked if the umbrella
// stopped including it. The same target compiles tests/consumer/main.cpp, the installed package's
// consumer, whose main() runs conveyor::DataLoader and the drop-in (its templates instantiated
// here, as C++17) and fails if a sample is missing or delivered twice.
#include "conveyor/augment.h"
#include "conveyor/conveyor.h"
#include "conveyor/datasets.h"
#include "conveyor/jpeg.h"
#include "conveyor/loader.h"
#include "conveyor/pinned.h"
#include "conveyor/prefetch.h"
#include "conveyor/random.h"
#include "conveyor/torch_data.h"

#if __cplusplus != 201703L
#error "public_headers_test.cpp must be compiled as C++17 (CXX_STANDARD 17)"
#endif
