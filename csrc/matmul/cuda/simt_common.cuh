// matmul CUDA-core rungs: guarded 4-float loads and stores shared by the register-blocked and
// warp-tiled kernels (no torch). simt_vectorizable (matmul_params.h) says when kVec holds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "matmul/matmul_params.h"

namespace opforge {
namespace simt {

// 4 consecutive floats of row r from column c of a (rows x cols, leading dimension ld) matrix;
// zeros outside it. kVec (ld, base and c multiples of 4 floats): one 16-byte load when all four
// are inside.
template <bool kVec>
__device__ __forceinline__ float4 load4(const float* base, int64_t r, int64_t c, int64_t rows, int64_t cols,
                                        int64_t ld) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (r >= rows) return v;
  const float* p = base + r * ld + c;
  if (kVec && c + 3 < cols) return __ldg(reinterpret_cast<const float4*>(p));
  if (c < cols) v.x = __ldg(p);
  if (c + 1 < cols) v.y = __ldg(p + 1);
  if (c + 2 < cols) v.z = __ldg(p + 2);
  if (c + 3 < cols) v.w = __ldg(p + 3);
  return v;
}

template <bool kVec>
__device__ __forceinline__ void store4(float* base, int64_t r, int64_t c, int64_t rows, int64_t cols,
                                       int64_t ld, float4 v) {
  if (r >= rows) return;
  float* p = base + r * ld + c;
  if (kVec && c + 3 < cols) {
    *reinterpret_cast<float4*>(p) = v;
    return;
  }
  if (c < cols) p[0] = v.x;
  if (c + 1 < cols) p[1] = v.y;
  if (c + 2 < cols) p[2] = v.z;
  if (c + 3 < cols) p[3] = v.w;
}

__device__ __forceinline__ void unpack(float4 v, float* r) {
  r[0] = v.x;
  r[1] = v.y;
  r[2] = v.z;
  r[3] = v.w;
}

}  // namespace simt
}  // namespace opforge
