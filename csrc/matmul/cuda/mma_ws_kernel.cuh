// matmul, mma rung: the warp-specialised kernel (float16/bfloat16, sm_90a: setmaxnreg; variant
// "mma_ws", the default of "mma" on H100/H200). The TMA kernel's consumers (8 warps, the same
// tiles, ldmatrix/mma loop and TMA-store epilogue), but a producer warpgroup's thread 0 refills
// each stage as soon as every consumer warp has released it on the stage's "empty" mbarrier: a
// warp's hand-over is one mbarrier arrive (no fence, atomic or refill in its loop) and its wait
// for the next stage. 384 threads start at 168 registers; the producers give theirs back
// (setmaxnreg.dec to 40) and the consumers take 232 (each scheduler: two consumer warps and a
// sleeping producer warp).
// kPersistent (the default): one block per SM walks the output tiles (grouped order, batch
// outermost) with one k-tile sequence through the ring, so the producer fills the next tile's
// stages while the consumers store the last tile, from a staging buffer of its own after the ring
// (64 KB: 64-deep k tiles, 3 stages). No trim of the last k tile then (its stage would never be
// released). kSnakeTiles: odd groups of tile rows walk their columns right to left (the b panels
// the previous group read last are still in L2); kSnakeMma: odd m16 rows take their n8 tiles in
// reverse.
// Requirements: those of the TMA kernel, and c's base and strides in multiples of 16 bytes
// (mma_tma_storable in matmul_params.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/launch.cuh"
#include "common/cuda/tile_order.cuh"
#include "matmul/cuda/mma_kernel_common.cuh"

namespace opforge {
namespace mma {

constexpr int kWsThreads = kThreads + 128;  // a producer warpgroup and 8 consumer warps

// The shipped configuration; benchmarks/tuning/matmul/ derives candidates from it by name.
struct WsTraits {
  static constexpr int kStages = 3;          // depth of the ring
  static constexpr int kBlockK = 64;         // k tile depth (64, or 96 when not persistent)
  static constexpr bool kPersistent = true;  // one block per SM walking the tiles
  static constexpr int kGroupRows = 16;      // tile order: groups of 16 tile rows
  static constexpr bool kSnakeTiles = true;  // odd groups right to left
  static constexpr bool kSnakeMma = true;    // odd m16 rows' n8 tiles in reverse
  static constexpr bool kSplitABox = false;  // 96 deep: a as a 64- and a 32-wide box (else three of 32)
  static constexpr bool kL2Fetch256 = true;  // L2 fetches of a and b promoted to 256 bytes
};

template <typename Traits, typename T>
__global__ void __launch_bounds__(kWsThreads, 1)
    matmul_mma_ws_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                         const __grid_constant__ CUtensorMap map_c, int k,
                         const __grid_constant__ CUtensorMap map_a2, int tiles_m, int tiles_n, int batch) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = Traits::kStages, kBK = Traits::kBlockK, kGroupRows = Traits::kGroupRows;
  constexpr bool kPersistent = Traits::kPersistent, kSnake = Traits::kSnakeTiles,
                 kSnakeMma = Traits::kSnakeMma;
  constexpr bool kA64 = Traits::kSplitABox && kBK == 96;
  constexpr int kBN = 256, kWarps = kThreads / 32;
  using R = Ring<kBN, kStages, kBK>;
  constexpr int kWN = R::kWN, kNT = kWN / 8;
  constexpr uint32_t kAStage = R::kATile * 2, kBStage = R::kBTile * 2;  // bytes
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_bar[kStages], empty_bar[kStages];
  const uint32_t a_sm = (cuda::smem_addr(smem_raw) + 1023) & ~1023u;  // the swizzle's 1024-byte atoms
  const uint32_t b_sm = a_sm + kStages * kAStage;
  const uint32_t c_sm = kPersistent ? b_sm + kStages * kBStage : a_sm;  // the tile staged for its stores
  const uint32_t full0 = cuda::smem_addr(full_bar), empty0 = cuda::smem_addr(empty_bar);
  // The blocks' tiles: lin = blockIdx.x, + gridDim.x, ... (kPersistent), else the grid's one.
  // Computed on each side of setmaxnreg: values live across it get spilled.
  const auto first = [] { return kPersistent ? static_cast<int>(blockIdx.x) : 0; };
  const auto step = [] { return kPersistent ? static_cast<int>(gridDim.x) : 1; };
  const auto count = [&] { return kPersistent ? tiles_m * tiles_n * batch : 1; };
  const auto coords = [&](int lin, int& m0, int& n0, int& bz) {
    int tm, tn;
    if constexpr (kPersistent) {
      cuda::batched_grouped_tile<kGroupRows, kSnake>(lin, tiles_m, tiles_n, bz, tm, tn);
    } else {
      cuda::grouped_tile<kGroupRows>(blockIdx.x + gridDim.x * blockIdx.y, gridDim.y, gridDim.x, tm, tn);
      bz = blockIdx.z;
    }
    m0 = tm * kBM;
    n0 = tn * kBN;
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(full0 + 8 * s, 1);        // the producer's arrival (plus the bytes)
      cuda::mbar_init(empty0 + 8 * s, kWarps);  // one arrival per consumer warp
    }
    cuda::fence_mbarrier_init();  // visible to the TMA unit
  }
  __syncthreads();
  if (threadIdx.x < 128) {  // the producer warpgroup
    cuda::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      const int tiles = (k + kBK - 1) / kBK, total = count();
      int s = 0;
      uint32_t pass = 0;  // parity of the ring pass: the first finds every stage free
      for (int lin = first(); lin < total; lin += step()) {
        int m0, n0, bz;
        coords(lin, m0, n0, bz);
        for (int j = 0; j < tiles; ++j) {
          cuda::mbar_wait(empty0 + 8 * s, pass ^ 1);
          tma_fill_stage<kAStage, kBStage, kBK, kA64>(&map_a, &map_b, a_sm, b_sm, full0, s, j, m0, n0, bz,
                                                      &map_a2);
          if (++s == kStages) s = 0, pass ^= 1;
        }
      }
    }
    return;
  }
  cuda::setmaxnreg_inc<232>();
  const int tiles = (k + kBK - 1) / kBK, total = count();
  const int ct = threadIdx.x - 128, lane = ct % 32, warp = ct / 32, wm = warp / 4, wn = warp % 4;
  const FragAddrs<kBK, kBN, kNT, true, kA64> fr(a_sm, b_sm, wm * kWM, wn * kWN, lane);
  const int rem = k - (tiles - 1) * kBK;  // the last tile's depth holding data
  int rs = 0;                             // the ring's stage for the next k tile
  uint32_t rph = 0;                       // and the parity of its full phase
  for (int lin = first(); lin < total; lin += step()) {
    int m0, n0, bz;
    coords(lin, m0, n0, bz);
    float acc[4][kNT][4] = {};
    const uint32_t next = consume_ring<T, kStages, kAStage, kBStage, kBK, !kPersistent, kSnakeMma>(
        fr, [&](int st, uint32_t parity) { cuda::mbar_wait(full0 + 8 * st, parity); }, tiles, acc,
        [&](int st, int) {  // the warp's reads of the stage are done: release it
          if (lane == 0) cuda::mbar_arrive(empty0 + 8 * st);
          return 0u;
        },
        [](uint32_t, int, int) {}, [](int) {}, 2 * ((rem + 31) / 32), rs, rph);
    rs = static_cast<int>(next & 0xff), rph = next >> 8;
    // The epilogue: every copy into the ring this tile needed has landed (each was awaited); the
    // staging buffer is the ring itself unless kPersistent (whose last stores must have read it).
    if (kPersistent && ct == 0) cuda::bulk_wait_group_read();
    cuda::named_barrier_sync<kThreads>(1);  // the consumers are done with it
    acc_to_smem<T>(acc, c_sm, wn, wm * kWM, lane);
    cuda::fence_proxy_async_shared();  // the writes, to the bulk copies
    cuda::named_barrier_sync<kThreads>(1);
    if (ct == 0) {
#pragma unroll
      for (int i = 0; i < kBN / 64; ++i) cuda::tma_store_3d(&map_c, c_sm + i * 16384, n0 + 64 * i, m0, bz);
      cuda::bulk_commit_group();
    }
  }
  if (ct == 0) cuda::bulk_wait_group_read();  // before the block's memory goes
#else
  __trap();  // no sm_90a code for this GPU (the launcher refuses it)
#endif
}

template <typename Traits>
constexpr int ws_smem_bytes() {  // the ring, the persistent kernel's staging buffer, 1024-byte alignment
  return Ring<256, Traits::kStages, Traits::kBlockK>::kSmemBytes + (Traits::kPersistent ? kBM * 256 * 2 : 0) +
         1024;
}

// Sets the kernel up for the current device: cudaSuccess, or cudaErrorNoKernelImageForDevice
// when the binary has no sm_90a code for this GPU (a build without 9.0a has only the kernel's
// trap, with fewer than the 168 registers setmaxnreg's exchange needs).
template <typename Traits, typename T>
cudaError_t prepare_ws() {
  static signed char configured[64] = {};
  const cudaError_t err = cuda::configure_once(
      matmul_mma_ws_kernel<Traits, T>, ws_smem_bytes<Traits>(), configured,
      [](const cudaFuncAttributes& f) { return f.ptxVersion >= 90 && (f.numRegs + 7) / 8 * 8 >= 168; });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

template <typename Traits, typename T>
cudaError_t launch_ws(const GemmParams& p, cudaStream_t stream) {
  if (!mma_tma_loadable(p) || !mma_tma_storable(p)) return cudaErrorInvalidValue;
  const cudaError_t err = prepare_ws<Traits, T>();
  if (err != cudaSuccess) return err;
  constexpr int kBK = Traits::kBlockK;
  constexpr bool kA64 = Traits::kSplitABox && kBK == 96;
  CUtensorMap map_a{}, map_b{}, map_c{}, map_a2{};
  constexpr uint32_t kABox = kBK == 96 && !kA64 ? 32 : 64;
  constexpr CUtensorMapSwizzle kASwizzle =
      kABox == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  constexpr CUtensorMapL2promotion kPromo =
      Traits::kL2Fetch256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  if (!mma_tma_maps(p, kBK, kABox, kASwizzle, kPromo, true, &map_a, &map_b, &map_c) ||
      (kA64 && !cuda::make_tma_map_16bit(&map_a2, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, 32, kBM,
                                         CU_TENSOR_MAP_SWIZZLE_64B, kPromo)))
    return cudaErrorInvalidValue;
  const int tiles_m = static_cast<int>((p.m + kBM - 1) / kBM), tiles_n = static_cast<int>((p.n + 255) / 256);
  dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m), static_cast<unsigned>(p.batch));
  if constexpr (Traits::kPersistent) {
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    const int64_t total = static_cast<int64_t>(tiles_m) * tiles_n * p.batch;
    if (total == 0) return cudaSuccess;
    grid = dim3(static_cast<unsigned>(total < sms ? total : sms));
  }
  matmul_mma_ws_kernel<Traits, T><<<grid, kWsThreads, ws_smem_bytes<Traits>(), stream>>>(
      map_a, map_b, map_c, static_cast<int>(p.k), map_a2, tiles_m, tiles_n, static_cast<int>(p.batch));
  return cudaGetLastError();
}

}  // namespace mma
}  // namespace opforge
