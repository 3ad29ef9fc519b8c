// The shared CUDA layer: warp-level tensor-core MMA (sm_80+). ldmatrix fragments from shared
// memory, mma.sync.m16n8k16 with float32 accumulation, and rounding of accumulator pairs to
// 16-bit types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/ptx.cuh"

namespace opforge {
namespace cuda {

// ldmatrix of four 8 x 8 b16 matrices (x4), or of their transposes (x4_trans): lane l gives the
// shared address of row l % 8 of matrix l / 8; register i gets the thread's pair of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  ldmatrix_x4(r, smem_addr(p));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  ldmatrix_x4_trans(r, smem_addr(p));
}

// mma.sync.m16n8k16 with float32 accumulation: d += a (16 x 16, row) * b (16 x 8, col), for T
// float16 or bfloat16. Not volatile: a pure function of registers, which the compiler may
// schedule among the loads. (Inline asm takes the type as a literal: one body per type.)
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b);
template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float* d, const uint32_t* a, const uint32_t* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float* d, const uint32_t* a, const uint32_t* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// (x, y) rounded to T and packed into one 32-bit word (x in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float x, float y) {
  const __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// (a, b, c, d) rounded to float8_e4m3 (saturated to +-448) and packed into one word, a in the low
// byte (the order of an 8-bit MMA fragment's k values).
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// A 16-bit value as float.
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

// Rounds (x, y) to T and stores them at p, p + 1 (one 4-byte store: p 4-byte aligned), or x
// alone at p.
template <typename T>
__device__ __forceinline__ void store_pair(T* p, float x, float y, bool both);
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* p, float x, float y, bool both) {
  if (both)
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
  else
    p[0] = __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ void store_pair<__half>(__half* p, float x, float y, bool both) {
  if (both)
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
  else
    p[0] = __float2half_rn(x);
}

}  // namespace cuda
}  // namespace opforge
