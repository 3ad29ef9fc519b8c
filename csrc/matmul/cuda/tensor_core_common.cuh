// matmul tensor-core rungs (mma, wgmma): helpers shared by their device and launch code (no torch);
// configure_once serves warp_tiled's launcher too.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace opforge {
namespace tc {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix of four 8 x 8 b16 matrices (x4), or of their transposes (x4_trans), at a generic
// pointer into shared memory or a shared-memory address.
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
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) { ldmatrix_x4(r, smem_addr(p)); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) { ldmatrix_x4_trans(r, smem_addr(p)); }

// mma.sync.m16n8k16 with float32 accumulation: d += a (16 x 16, row) * b (16 x 8, col).
template <typename T>
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, const uint32_t* b);
// Not volatile: a pure function of registers, which the compiler may schedule among the loads.
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float* d, const uint32_t* a, const uint32_t* b) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float* d, const uint32_t* a, const uint32_t* b) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Rounds (x, y) to T and stores them at p, p + 1 (one 4-byte store), or x alone at p.
template <typename T>
__device__ __forceinline__ void store_pair(T* p, float x, float y, bool both);
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* p, float x, float y, bool both) {
  if (both) *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
  else p[0] = __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ void store_pair<__half>(__half* p, float x, float y, bool both) {
  if (both) *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
  else p[0] = __float2half_rn(x);
}

// (x, y) rounded to T and packed into one 32-bit word (x in the low half), for shared-memory staging.
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

// Bulk tensor store (sm_90) of the box at shared address src to (x, y, z) of `map`, in the
// thread's current bulk group.
__device__ __forceinline__ void tma_store3(const CUtensorMap* map, uint32_t src, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(x), "r"(y), "r"(z)
               : "memory");
}

// Raises a kernel's dynamic shared-memory limit on the current device, once per device (the
// attribute is per device). `check` runs first, on the kernel's attributes; a kernel it refuses
// (cudaErrorInvalidConfiguration, which launchers answer with a fallback) stays refused on that
// device without asking again. state[dev]: 0 not yet asked, 1 configured, -1 refused. Returns a
// cudaError_t.
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

}  // namespace tc
}  // namespace opforge
