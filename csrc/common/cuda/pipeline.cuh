// The shared CUDA layer: a ring of kStages shared-memory stages that producers fill and consumers
// drain, over mbarriers (sm_90: the producer's arrival carries the byte count of the bulk copies
// that fill the stage). Every stage has a "full" barrier (one producer arrival plus the bytes a
// phase) and an "empty" barrier (`consumer_arrivals` arrivals a phase). Which stage and which
// phase a role is at lives in one place, PipelineState; each role keeps its own and advances it
// once per stage it handles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/mbarrier.cuh"
#include "common/cuda/ptx.cuh"

namespace opforge {
namespace cuda {

template <int kStages>
struct PipelineState {
  int index = 0;       // the stage
  uint32_t phase = 0;  // the parity of the pass over the ring
  int count = 0;       // stages handled so far

  __device__ __forceinline__ void advance() {
    ++count;
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

template <int kStages>
struct Pipeline {
  uint64_t* full;   // kStages barriers in shared memory
  uint64_t* empty;  // kStages barriers in shared memory

  // Sets up the barriers (one thread; fence_mbarrier_init and a block barrier must follow before
  // any other thread or the TMA unit uses them). producer_arrivals: the full barrier's arrivals a
  // phase (1: one producer thread, its bulk copies' bytes; more where several warps fill a stage
  // with ordinary stores and each arrives: producer_arrive).
  __device__ __forceinline__ void init(int consumer_arrivals, int producer_arrivals = 1) const {
#pragma unroll 1
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_addr(&full[s]), producer_arrivals);
      mbar_init(smem_addr(&empty[s]), consumer_arrivals);
    }
  }
  // Producer: waits until the stage is free (the first pass over the ring finds every stage free).
  __device__ __forceinline__ void producer_acquire(const PipelineState<kStages>& s) const {
    mbar_wait(smem_addr(&empty[s.index]), s.phase ^ 1u);
  }
  // Producer: its arrival on the stage's full barrier, which then also waits for `bytes` of bulk
  // copies; returns the barrier's shared address, for those copies to complete on.
  __device__ __forceinline__ uint32_t producer_commit(const PipelineState<kStages>& s, uint32_t bytes) const {
    const uint32_t bar = smem_addr(&full[s.index]);
    mbar_arrive_expect_tx(bar, bytes);
    return bar;
  }
  // Producer, the same in two steps, where other arrivals on the stage (a cp.async's, which counts
  // itself in) must be registered after the bulk copies are issued but before the stage can fill:
  // producer_expect (the copies' bytes; returns the barrier's address for them), then
  // producer_arrive.
  __device__ __forceinline__ uint32_t producer_expect(const PipelineState<kStages>& s, uint32_t bytes) const {
    const uint32_t bar = smem_addr(&full[s.index]);
    mbar_expect_tx(bar, bytes);
    return bar;
  }
  __device__ __forceinline__ void producer_arrive(const PipelineState<kStages>& s) const {
    mbar_arrive(smem_addr(&full[s.index]));
  }
  // Consumer: waits until the stage is filled.
  __device__ __forceinline__ void consumer_wait(const PipelineState<kStages>& s) const {
    mbar_wait(smem_addr(&full[s.index]), s.phase);
  }
  // Consumer: one arrival on the stage's empty barrier (the stage is free when all have come).
  __device__ __forceinline__ void consumer_release(const PipelineState<kStages>& s) const {
    mbar_arrive(smem_addr(&empty[s.index]));
  }
  // Consumer of a ring that the blocks of a cluster fill together (multicast): one arrival on the
  // stage's empty barrier in each of the cluster's kCluster blocks.
  template <int kCluster>
  __device__ __forceinline__ void consumer_release_cluster(const PipelineState<kStages>& s) const {
#pragma unroll
    for (int q = 0; q < kCluster; ++q) mbar_arrive_cluster(smem_addr(&empty[s.index]), q);
  }
};

}  // namespace cuda
}  // namespace opforge
