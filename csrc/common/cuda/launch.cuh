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

// A persistent grid: as many blocks of `kernel` as are resident on the GPU at once (at most one
// per tile), for kernels that stride over their tiles and pipeline one tile's loads under the
// previous one's work. per_sm[dev] caches the occupancy per device (0: not yet asked). Returns a
// cudaError_t; `grid` is set on success.
template <typename Kernel>
cudaError_t resident_grid(Kernel kernel, int threads, int smem_bytes, int64_t tiles, int num_sms,
                          int (&per_sm)[64], unsigned int& grid) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  if (per_sm[dev] == 0) {  // (a race only repeats the query)
    int blocks = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem_bytes);
    if (err != cudaSuccess) return err;
    per_sm[dev] = blocks > 0 ? blocks : 1;
  }
  const int64_t resident = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * per_sm[dev];
  const int64_t blocks = tiles < resident ? tiles : resident;
  grid = static_cast<unsigned int>(blocks > 0 ? blocks : 1);
  return cudaSuccess;
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
