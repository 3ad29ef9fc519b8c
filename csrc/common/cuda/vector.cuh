// The shared CUDA layer: aligned vector packs for wide loads and stores.
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

__host__ __device__ inline bool is_aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace cuda
}  // namespace opforge
