// conveyor-npy-fuzz: libFuzzer over parse_npy (datasets/fields/npy.h, issue 31), the reader of
// .npy members that come from the data. An input is a file's bytes. std::runtime_error is an
// expected outcome (a refusal); a crash, a sanitizer report, a leak, a hang, an out-of-memory or
// a broken guarantee (abort) is a finding. The guarantees checked on success: the array's bytes
// lie inside the input and end where it ends, are the product of the shape times the dtype's
// size (checked without overflow), and the shape has at most kMaxNpyDims dimensions, none
// negative. Every byte of the array is read, so that ASan sees a view past the input.
//
// `conveyor-npy-fuzz --write-seeds DIR` writes the seed corpus and exits: numpy's headers for
// several dtypes, shapes and versions, and refused ones (dtype object, big-endian, fortran
// order, a shape that overflows). tests/fuzz_test.sh also passes conveyor-npy-fuzz.dict.
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "fields/npy.h"

namespace {

namespace fs = std::filesystem;

void check(bool ok) {
  if (!ok) std::abort();
}

std::string npy(const std::string& header, size_t data_bytes, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string text = header;
  while ((prefix + text.size() + 1) % 64 != 0) text += ' ';
  text += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  return out + text + std::string(data_bytes, '\x3f');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::detail::NpyArray array;
  try {
    array = conveyor::detail::parse_npy(data, size);
  } catch (const std::runtime_error& e) {
    check(std::strncmp(e.what(), "npy: ", 5) == 0);
    return 0;
  }
  check(array.shape.size() <= conveyor::detail::kMaxNpyDims);
  unsigned __int128 bytes = c10::elementSize(array.dtype);
  for (int64_t dim : array.shape) {
    check(dim >= 0);
    bytes *= static_cast<uint64_t>(dim);
    if (bytes > size) bytes = size + 1;  // stays above any valid size without overflowing
  }
  check(bytes == array.bytes);
  check(array.data >= data && array.data + array.bytes == data + size);
  unsigned sum = 0;
  for (size_t i = 0; i < array.bytes; ++i) sum += array.data[i];
  volatile unsigned sink = sum;
  (void)sink;
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i + 1 < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--write-seeds") != 0) continue;
    const fs::path out = (*argv)[i + 1];
    fs::create_directories(out);
    const auto write = [&](const std::string& name, const std::string& bytes) {
      std::ofstream(out / name, std::ios::binary).write(bytes.data(), bytes.size());
    };
    const auto h = [](const std::string& descr, const std::string& shape,
                      const char* order = "False") {
      return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
    };
    write("f4-2x3", npy(h("<f4", "(2, 3)"), 24));
    write("u1-0d", npy(h("|u1", "()"), 1));
    write("b1-empty", npy(h("|b1", "(0, 5)"), 0));
    write("i8-v2", npy(h("<i8", "(4,)"), 32, 2));
    write("c16-v3", npy(h("<c16", "(1, 1, 1)"), 16, 3));
    write("u2-reordered",
          npy("{\"shape\": (3,), \"descr\": \"<u2\", \"fortran_order\": False}", 6));
    write("object", npy(h("|O", "(2,)"), 16));
    write("big-endian", npy(h(">f8", "(2,)"), 16));
    write("fortran", npy(h("<f2", "(2, 2)", "True"), 8));
    write("overflow", npy(h("<f8", "(4294967296, 4294967296)"), 0));
    write("truncated", npy(h("<f4", "(3,)"), 11));
    std::exit(0);
  }
  return 0;
}
