// conveyor/internal/kernel_launch.h (build-only, never installed): the one rule for launching a
// CUDA kernel in Conveyor (normalize_images' kernel, GPU decode's crop kernel).
//
// launch_kernel(kernel, grid, block, stream, args...): launches `kernel` through cudaLaunchKernel
// and returns that launch's own error. Never `kernel<<<...>>>` followed by cudaGetLastError() or
// cudaPeekAtLastError(): those report any error left pending on the thread by earlier, unrelated
// work (and the former clears it), so a healthy launch would fail for someone else's error, or a
// real one be reported to the wrong caller. Each argument is converted to the kernel's own
// parameter type before its address is taken, so an `int` passed for an `int64_t` parameter is
// widened, never read as eight bytes of which four are garbage.
//
// Requires: a .cu file (or any file where `kernel` is a __global__ function's host stub); grid
// and block as the kernel expects. Guarantees: no error is read or cleared but the launch's own;
// callers check the result (detail::check_cuda), naming the kernel and the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <tuple>
#include <utility>

namespace conveyor::detail {

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                          Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
  std::tuple<Params...> values(std::forward<Args>(args)...);
  return std::apply(
      [&](auto&... value) {
        void* pointers[sizeof...(Params) + 1] = {static_cast<void*>(&value)..., nullptr};
        return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, pointers,
                                size_t{0}, stream);
      },
      values);
}

}  // namespace conveyor::detail
