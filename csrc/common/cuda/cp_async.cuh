// The shared CUDA layer: asynchronous global -> shared copies (cp.async, sm_80+) and their
// completion (commit/wait groups, or an mbarrier arrival when this thread's copies land).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/ptx.cuh"

namespace opforge {
namespace cuda {

// 16 bytes global -> shared (cached in L2 only); the first src_bytes (0 to 16; the 4-byte form
// takes 0 to 4) are read and the rest zero-filled: a short count fills the edge of a matrix, 0
// writes zeros for a chunk outside it (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  cp_async16(smem_addr(dst), src, src_bytes);
}
// The same with the L2::128B prefetch hint: L2 fetches the whole 128-byte line the copy falls in
// (for streams read once, such as a decode step's keys and values).
__device__ __forceinline__ void cp_async16_l2_128(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
// 4 bytes global -> shared (cached in L1 too: cp.async.cg takes 16-byte copies only).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}

// 8 bytes global -> shared (cached in L1 too).
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// kBytes (4, 8 or 16) global -> shared, all of them read.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (kBytes == 16) {
    cp_async16(dst, src, 16);
  } else if constexpr (kBytes == 8) {
    cp_async8(dst, src);
  } else {
    cp_async4(dst, src, 4);
  }
}
// The mbarrier at shared address `bar` tracks this thread's copies issued so far: its pending
// count goes up by one now and down by one when they have landed (so that a phase a producer then
// completes also waits for them; sm_80+).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Closes this thread's group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace cuda
}  // namespace opforge
