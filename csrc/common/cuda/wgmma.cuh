// The shared CUDA layer: Hopper's warpgroup MMA (sm_90a). The wgmma.mma_async wrappers
// (generated: wgmma_ops.cuh), their fence, commit and wait, the shared-memory matrix descriptors
// for tiles in TMA's 128-byte swizzle, and the register fence that keeps the compiler from moving
// accumulators an asynchronous wgmma still owns.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/ptx.cuh"
#include "common/cuda/wgmma_ops.cuh"

namespace opforge {
namespace cuda {

// Orders the warpgroup's register and shared-memory accesses before the wgmmas that follow.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Closes the warpgroup's group of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Shared-memory matrix descriptor of a K-major tile in TMA's 128-byte swizzle: rows of 128 bytes
// (64 16-bit values of k), groups of 8 rows 1024 bytes apart.
__device__ __forceinline__ uint64_t smem_desc_k_major(const void* p) {
  const uint64_t addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
// MN-major, 128-byte swizzle: rows of 64 n-values (128 bytes); groups of 8 k-rows 1024 bytes apart
// (stride offset), 64-column boxes 8 KB apart (leading offset).
__device__ __forceinline__ uint64_t smem_desc_mn_major(const void* p) {
  const uint64_t addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{8192 >> 4} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// MN-major, 128-byte swizzle, with 64-column boxes `box_bytes` apart (a box of rows x 128 bytes).
__device__ __forceinline__ uint64_t smem_desc_mn_major(const void* p, uint32_t box_bytes) {
  const uint64_t addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{box_bytes >> 4} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// A descriptor moved `bytes` (a multiple of 16) further into shared memory: its start-address field
// is the low 14 bits, address / 16, and shared addresses stay below 2^18, so the sum never carries
// out of the field. (A loop's descriptors from one base: one add each, not the encoding again.)
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// Keeps the compiler from moving an accumulator across this point (wgmma reads and writes the
// registers asynchronously, between its issue and the wait).
__device__ __forceinline__ void fence_operand(float& x) {
  asm volatile("" : "+f"(x)::"memory");
}
// The same for a block of accumulator fragments (4 floats each).
template <int kN>
__device__ __forceinline__ void fence_operands(float (&x)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) fence_operand(x[n][e]);
}

}  // namespace cuda
}  // namespace opforge
