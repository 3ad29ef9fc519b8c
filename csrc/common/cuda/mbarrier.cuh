// The shared CUDA layer: mbarriers in shared memory (sm_80+; transaction counts and cluster-wide
// arrivals sm_90). A barrier completes a phase when its expected arrivals (and, with expect_tx,
// bytes of bulk copies) have come; waiters wait on the parity of the phase they need.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/ptx.cuh"

namespace opforge {
namespace cuda {

// Sets up the barrier at shared address `bar` for `count` arrivals a phase (one thread).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes initialised barriers visible to the other threads' and the TMA unit's operations (after
// the inits, before the block's first barrier).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival, and `bytes` more of bulk copies to land before the phase completes (the copies'
// complete_tx count them down).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// `bytes` more of bulk copies to land before the phase completes, without an arrival (the phase
// still waits for the arrivals it expects, so copies issued now cannot complete it early).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// One arrival on the barrier at the same shared address in block `cta` of the cluster (release
// at cluster scope).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
// Waits until the phase of parity `parity` has completed. On sm_90 try_wait suspends the thread
// until then or until a time limit: without a hint that limit is short, and a waiting warp (a
// producer a ring ahead) spins, taking issue slots from the math warps on its scheduler; with a
// 10 ms hint it sleeps until the phase completes (CUTLASS's ClusterBarrier does the same).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity), "n"(10000000)
        : "memory");
#else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#endif
  }
}

}  // namespace cuda
}  // namespace opforge
