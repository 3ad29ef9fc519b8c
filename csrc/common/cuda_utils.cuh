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

// A grid that fills the GPU once (num_sms * blocks_per_sm resident blocks) and no more; kernels
// using it loop over their work with a grid stride. 2048 resident threads per SM is Hopper's
// and Ampere's A100 limit; on parts with fewer, the extra blocks simply wait their turn.
inline unsigned int persistent_grid(int64_t work_items, int threads, int num_sms) {
  const int64_t wanted = (work_items + threads - 1) / threads;
  const int64_t resident = static_cast<int64_t>(num_sms > 0 ? num_sms : 1) * (2048 / threads);
  const int64_t blocks = wanted < resident ? wanted : resident;
  return static_cast<unsigned int>(blocks > 0 ? blocks : 1);
}

}  // namespace cuda
}  // namespace opforge
