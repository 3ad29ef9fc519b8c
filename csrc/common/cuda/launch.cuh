// The shared CUDA layer, host side: grid sizing and the one-time kernel attribute setup the
// launchers share (no torch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace opforge {
namespace cuda {

// Blocks for `tiles` units of work: one block per tile, but at most `waves` full waves of
// resident blocks (2048 resident threads per SM, Hopper's and A100's limit): the grid is sized
// to the GPU and kernels stride over any remaining tiles.
inline unsigned int grid_for_tiles(int64_t tiles, int threads, int num_sms, int waves = 32) {
  const int64_t cap = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * (2048 / threads) * waves;
  const int64_t blocks = tiles < cap ? tiles : cap;
  return static_cast<unsigned int>(blocks > 0 ? blocks : 1);
}

// Raises a kernel's dynamic shared-memory limit on the current device, once per device (the
// attribute is per device). `check` runs first, on the kernel's attributes (does the binary hold
// code this kernel can run on this GPU?); a kernel it refuses stays refused on that device
// without asking again (cudaErrorInvalidConfiguration). state[dev]: 0 not yet asked, 1
// configured, -1 refused. Returns a cudaError_t.
template <typename Kernel, typename Check>
cudaError_t configure_once(Kernel kernel, int smem_bytes, signed char (&state)[64], Check check) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  // (A race only repeats the calls.)
  if (state[dev] != 0) return state[dev] > 0 ? cudaSuccess : cudaErrorInvalidConfiguration;
  cudaFuncAttributes attr{};
  err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  if (!check(attr)) {
    state[dev] = -1;
    return cudaErrorInvalidConfiguration;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess) state[dev] = 1;
  return err;
}

}  // namespace cuda
}  // namespace opforge
