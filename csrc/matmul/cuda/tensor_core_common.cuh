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
