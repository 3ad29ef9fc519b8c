// matmul, mma rung: the TMA kernel (float16/bfloat16, sm_90: H100/H200; variant "mma_tma"). The
// cp.async kernel's tiles, warps and ldmatrix/mma loop, but the stages are filled by the tensor
// memory accelerator. One thread issues a stage's copies (a's boxes and four 64-column boxes of b,
// TMA's swizzles, zeros outside the matrices), which complete on the stage's "full" mbarrier.
// Each warp counts itself out of a stage (an atomic in shared memory) once it has read its last
// fragments there, and the last one refills it at once (kStages k tiles ahead). The warps carry no
// copy addresses or bounds, wait on no cp.async group, meet at no block-wide barrier and never
// wait to refill: a warp waits only for data that has not landed.
// The default takes 96-deep k tiles (a in three 32-wide boxes with TMA's 64-byte swizzle, 216 KB
// for the 3 stages), so the per-tile hand-over comes every 6 steps instead of 4; the last k tile's
// mma stop where its data does; blocks walk the output tiles in groups of 16 tile rows
// (common/cuda/tile_order.cuh); the finished tile is rounded into the (then idle) ring in the
// layout TMA reads and one thread stores it with bulk tensor copies, which clip at c's edges
// (kTmaStore; where c's layout does not allow it, each thread stores its pairs).
// Requirements: those of the cp.async kernel, nonzero batch strides (TMA cannot address a
// broadcast operand) and dimensions below 2^31 - 512 (mma_tma_loadable in matmul_params.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/launch.cuh"
#include "common/cuda/tile_order.cuh"
#include "matmul/cuda/mma_kernel_common.cuh"

namespace opforge {
namespace mma {

// Called by the kernel at its ring's hand-over points (a fill issued by thread 0 or the refilling
// lane; a warp's release of a stage and the landing of its next k tile, by lane 0). Empty in the
// product: benchmarks/tuning/matmul/ instruments them.
struct NoHooks {
  static __device__ __forceinline__ void issued(int /*k_tile*/) {}
  static __device__ __forceinline__ void released(int /*warp*/, int /*k_tile*/) {}
  static __device__ __forceinline__ void landed(int /*warp*/, int /*k_tile*/) {}
};

// The shipped configuration; benchmarks/tuning/matmul/ derives candidates from it by name.
struct TmaTraits {
  static constexpr int kStages = 3;            // depth of the ring
  static constexpr int kBlockK = 96;           // k tile depth: 64, or 96 (a in three 32-wide boxes)
  static constexpr int kGroupRows = 16;        // tile order: groups of 16 tile rows (0: launch order)
  static constexpr bool kTrimLastTile = true;  // the last k tile's mma stop after the steps holding data
  using Hooks = NoHooks;
};

template <typename Traits, typename T, bool kTmaStore>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_mma_tma_kernel(const __grid_constant__ CUtensorMap map_a,
                          const __grid_constant__ CUtensorMap map_b,
                          const __grid_constant__ CUtensorMap map_c, T* __restrict__ c, int m, int n, int k,
                          int64_t ldc, int64_t c_bs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kStages = Traits::kStages, kBK = Traits::kBlockK, kGroupRows = Traits::kGroupRows;
  constexpr bool kTrim = Traits::kTrimLastTile;
  using Hooks = typename Traits::Hooks;
  constexpr int kBN = 256, kWarps = kThreads / 32;
  using R = Ring<kBN, kStages, kBK>;
  constexpr int kWN = R::kWN, kNT = kWN / 8;
  constexpr uint32_t kAStage = R::kATile * 2, kBStage = R::kBTile * 2;  // bytes
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_bar[kStages];
  __shared__ uint32_t readers_done[kStages];                          // warps done with the stage, ever
  const uint32_t a_sm = (cuda::smem_addr(smem_raw) + 1023) & ~1023u;  // the swizzle's 1024-byte atoms
  const uint32_t b_sm = a_sm + kStages * kAStage;
  const uint32_t full0 = cuda::smem_addr(full_bar), done0 = cuda::smem_addr(readers_done);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;
  int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const int bz = blockIdx.z;
  if constexpr (kGroupRows > 0) {
    int tm, tn;
    cuda::grouped_tile<kGroupRows>(blockIdx.x + gridDim.x * blockIdx.y, gridDim.y, gridDim.x, tm, tn);
    m0 = tm * kBM;
    n0 = tn * kBN;
  }
  const int tiles = (k + kBK - 1) / kBK;
  auto issue = [&](int s, int j) {  // k tile j into stage s (one thread)
    Hooks::issued(j);
    tma_fill_stage<kAStage, kBStage, kBK>(&map_a, &map_b, a_sm, b_sm, full0, s, j, m0, n0, bz);
  };
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(full0 + 8 * s, 1);  // the issuing thread's arrival (plus the bytes)
      readers_done[s] = 0;
    }
    cuda::fence_mbarrier_init();  // visible to the TMA unit
  }
  __syncthreads();
  if (tid == 0)
    for (int s = 0; s < kStages && s < tiles; ++s) issue(s, s);

  const FragAddrs<kBK, kBN, kNT, true> fr(a_sm, b_sm, wm * kWM, wn * kWN, lane);
  float acc[4][kNT][4] = {};
  const int rem = k - (tiles - 1) * kBK;  // the last tile's depth holding data
  consume_ring<T, kStages, kAStage, kBStage, kBK, kTrim>(
      fr, [&](int rs, uint32_t parity) { cuda::mbar_wait(full0 + 8 * rs, parity); }, tiles, acc,
      [&](int rs, int t) {  // the warp counts itself out of stage rs; the count before
        uint32_t before = 0;
        if (lane == 0) {
          Hooks::released(warp, t);
          before = cuda::atomic_inc_acq_rel_cta(done0 + 4 * rs);
        }
        return before;
      },
      [&](uint32_t before, int rs, int t) {
        if (lane == 0 && before % kWarps == kWarps - 1 && t + kStages < tiles) {  // the last reader refills
          cuda::fence_proxy_async_shared();  // the warps' reads before TMA's writes
          issue(rs, t + kStages);
        }
      },
      [&](int t) {
        if (lane == 0) Hooks::landed(warp, t);
      },
      2 * ((rem + 31) / 32));
  if constexpr (kTmaStore) {
    static_assert(128 * kBN * 2 <= kStages * (kAStage + kBStage), "the tile fits in the ring");
    __syncthreads();  // every warp is done with the ring (and every copy into it has landed)
    acc_to_smem<T>(acc, a_sm, wn, wm * kWM, lane);
    cuda::fence_proxy_async_shared();  // the writes, to the bulk copies
    __syncthreads();
    if (tid == 0) {
#pragma unroll
      for (int i = 0; i < kBN / 64; ++i) cuda::tma_store_3d(&map_c, a_sm + i * 16384, n0 + 64 * i, m0, bz);
      cuda::bulk_commit_group();
      cuda::bulk_wait_group_read();  // before the block's memory goes
    }
  } else {
    store_acc<T, kNT>(acc, c + bz * c_bs, m0 + wm * kWM, n0 + wn * kWN, m, n, ldc, c_bs, lane);
  }
#else
  __trap();  // no sm_90 code for this GPU (the launcher refuses it)
#endif  // sm_90+
}

// Sets the kernel up for the current device: cudaSuccess, or cudaErrorNoKernelImageForDevice
// when the binary has no sm_90 code for this GPU.
template <typename Traits, typename T, bool kTmaStore>
cudaError_t prepare_tma() {
  constexpr int kSmem =
      Ring<256, Traits::kStages, Traits::kBlockK>::kSmemBytes + 1024;  // + alignment to 1024 bytes
  static signed char configured[64] = {};
  const cudaError_t err =
      cuda::configure_once(matmul_mma_tma_kernel<Traits, T, kTmaStore>, kSmem, configured,
                           [](const cudaFuncAttributes& f) { return f.ptxVersion >= 90; });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

// The TMA-store epilogue where c's base and strides are multiples of 16 bytes, else per-thread
// stores.
template <typename Traits, typename T>
cudaError_t launch_tma(const GemmParams& p, cudaStream_t stream) {
  if (!mma_tma_loadable(p)) return cudaErrorInvalidValue;
  const bool store_c = mma_tma_storable(p);
  const cudaError_t err = store_c ? prepare_tma<Traits, T, true>() : prepare_tma<Traits, T, false>();
  if (err != cudaSuccess) return err;
  constexpr int kBK = Traits::kBlockK;
  constexpr int kSmem = Ring<256, Traits::kStages, kBK>::kSmemBytes + 1024;
  CUtensorMap map_a{}, map_b{}, map_c{};
  constexpr uint32_t kABox = kBK == 96 ? 32 : 64;  // a's box width: 96 deep takes three of 32
  constexpr CUtensorMapSwizzle kASwizzle = kBK == 96 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  if (!mma_tma_maps(p, kBK, kABox, kASwizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, store_c, &map_a, &map_b,
                    &map_c))
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((p.n + 255) / 256), static_cast<unsigned>((p.m + kBM - 1) / kBM),
                  static_cast<unsigned>(p.batch));
  const auto kernel =
      store_c ? matmul_mma_tma_kernel<Traits, T, true> : matmul_mma_tma_kernel<Traits, T, false>;
  kernel<<<grid, kThreads, kSmem, stream>>>(map_a, map_b, map_c, static_cast<T*>(p.c), static_cast<int>(p.m),
                                            static_cast<int>(p.n), static_cast<int>(p.k), p.c_rs, p.c_bs);
  return cudaGetLastError();
}

}  // namespace mma
}  // namespace opforge
