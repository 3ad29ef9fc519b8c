// Torch-free CUDA helpers shared by device code: aligned vector packs and grid sizing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace opforge {
namespace cuda {

// N elements of T moved as one aligned access (16 bytes for N * sizeof(T) == 16: LDG.128).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

inline bool is_aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Blocks for `tiles` units of work: one block per tile, but at most `waves` full waves of
// resident blocks (2048 resident threads per SM, Hopper's and A100's limit): the grid is sized
// to the GPU and kernels stride over any remaining tiles.
inline unsigned int grid_for_tiles(int64_t tiles, int threads, int num_sms, int waves = 32) {
  const int64_t cap = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * (2048 / threads) * waves;
  const int64_t blocks = tiles < cap ? tiles : cap;
  return static_cast<unsigned int>(blocks > 0 ? blocks : 1);
}

}  // namespace cuda
}  // namespace opforge
