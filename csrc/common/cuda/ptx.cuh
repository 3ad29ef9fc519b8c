// The shared CUDA layer, part 1: shared-memory addresses and stores, named barriers, register
// reallocation between warpgroups, cluster rank and barrier, and the shared-memory atomic the
// kernels count with. Each PTX instruction the kernels use is written once in csrc/common/cuda/
// (this file, cp_async.cuh, mbarrier.cuh, tma.cuh, mma_sync.cuh, wgmma.cuh); no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace opforge {
namespace cuda {

// The shared-memory address (a 32-bit offset in the shared window) of a generic pointer into it.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first kAlign-byte boundary at or after `base` (a pointer into shared memory), computed as an
// offset from base so that the compiler still knows it points into shared memory: loads and stores
// through it are LDS / STS, not generic accesses (which wait on the long scoreboard).
template <int kAlign>
__device__ __forceinline__ unsigned char* align_shared(unsigned char* base) {
  return base + ((kAlign - (smem_addr(base) & (kAlign - 1))) & (kAlign - 1));
}

// One 32-bit store to shared memory at a shared-memory address.
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// A 32-bit load from shared memory at address addr (volatile: ordered with the barrier waits and
// fences around it, as st_shared_u32's stores are).
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Named barrier `id` (1..15; 0 is __syncthreads's) over kThreads threads (whole warps).
template <int kThreads>
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
// Arrives at named barrier `id` without waiting: the barrier completes when kThreads threads in
// all have arrived or synced on it (a producer signalling consumers that sync).
template <int kThreads>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// Warp specialisation (sm_90a): a warpgroup gives back registers down to kRegs a thread, or takes
// up to kRegs. Every warp of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// This block's rank in its cluster, and a barrier over every thread of every block of the
// cluster (whole warps; release/acquire: shared-memory writes before it are visible after it).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

// A global counter read with acquire, and added to with release, at GPU scope (semaphores between
// blocks: what a block wrote before its release is visible to the block whose acquire sees it).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Adds four floats to 16 bytes of global memory (one vector reduction, done at L2; sm_90).
__device__ __forceinline__ void red_add_f32x4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(p, a), atomicAdd(p + 1, b), atomicAdd(p + 2, c), atomicAdd(p + 3, d);
#endif
}

// atomicAdd(+1) on a shared-memory counter with acquire-release ordering at block scope: what
// this thread did before is visible to the thread that sees the count after. Returns the count
// before.
__device__ __forceinline__ uint32_t atomic_inc_acq_rel_cta(uint32_t addr) {
  uint32_t before;
  asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], 1;\n" : "=r"(before) : "r"(addr) : "memory");
  return before;
}

}  // namespace cuda
}  // namespace opforge
