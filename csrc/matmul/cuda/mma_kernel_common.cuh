// matmul, the mma rung (float16/bfloat16, mma.sync.m16n8k16 with float32 accumulation): what its
// three kernels share (no torch). Every kernel computes a 128 x kBlockN tile of c per block of 8
// warps (2 x 4), each warp 64 x kBlockN / 4 of it (4 x kBlockN / 32 mma tiles of 16 x 8), from
// a ring of kStages shared-memory stages holding kBlockK-deep tiles of a and b. The kernels
// differ in how the stages are filled and handed over:
//  - mma_cp_async_kernel.cuh (sm_80+): every thread copies its chunks with cp.async, one
//    block-wide barrier per k tile;
//  - mma_tma_kernel.cuh (sm_90): one thread fills a stage with TMA bulk copies; the last warp to
//    read a stage refills it;
//  - mma_ws_kernel.cuh (sm_90a): a producer warpgroup fills the stages, the 8 consumer warps
//    release them on mbarriers (warp specialisation); persistent.
// This header holds the tile layouts in shared memory, the fragment addressing, the consumer loop
// of the two TMA kernels and both epilogues.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/mbarrier.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/swizzle.cuh"
#include "common/cuda/tma.cuh"
#include "matmul/matmul_params.h"

namespace opforge {
namespace mma {

constexpr int kBM = 128, kThreads = 256;  // block tile rows; 8 warps (2 x 4)
constexpr int kWM = 64;                   // warp tile rows: 4 m16 tiles

// The ring of a kernel with block tile width kBN, kStages stages of kBK-deep k tiles.
template <int kBN, int kStages, int kBK>
struct Ring {
  static constexpr int kWN = kBN / 4;                           // warp tile columns
  static constexpr int kATile = kBM * kBK, kBTile = kBK * kBN;  // elements per stage
  static constexpr int kSmemBytes = kStages * (kATile + kBTile) * 2;
};

// Element offsets in the swizzled shared tiles (common/cuda/swizzle.cuh). cp.async-filled tiles:
// a is [kBM][kBK] (kBK / 8 chunks of 8 a row: the 64-byte swizzle for 32-deep tiles, the 128-byte
// one for 64), b is [kBK][kBN] (the 128-byte pattern on the low chunk bits). The 8 rows an
// ldmatrix reads hit 8 different chunks.
template <int kBK>
__device__ __forceinline__ int a_off(int r, int k) {
  const int chunk = kBK == 32 ? cuda::swizzle64_chunk(r, k / 8) : cuda::swizzle128_chunk(r, k / 8);
  return r * kBK + chunk * 8 + k % 8;
}
template <int kBN>
__device__ __forceinline__ int b_off(int r, int n) {
  return r * kBN + cuda::swizzle128_chunk(r, n / 8) * 8 + n % 8;
}
// TMA-filled b (kBoxes): kBN / 64 boxes of [kBK][64], each 128-byte swizzled (TMA's 128-byte
// swizzle spans 64 16-bit columns at most).
template <int kBK>
__device__ __forceinline__ int b_box_off(int r, int n) {
  return (n / 64) * kBK * 64 + r * 64 + cuda::swizzle128_chunk(r, (n % 64) / 8) * 8 + n % 8;
}
// TMA-filled a 96 deep: three boxes of [kBM][32] in TMA's 64-byte swizzle, so a step's addresses
// are those of the step two before plus a box.
__device__ __forceinline__ int a_box32_off(int r, int k) {
  return (k / 32) * kBM * 32 + r * 32 + cuda::swizzle64_chunk(r, (k % 32) / 8) * 8 + k % 8;
}

// A warp's fragment addresses, precomputed: its shared addresses for every 16-deep step's a
// fragments and every pair of b's n8 tiles are a few registers plus immediates (the swizzle only
// XORs chunk bits that the step and pair indices do not change). kBoxes: the tiles of the TMA
// kernels (b in 64-column boxes; 96 deep, a in 32-wide boxes, or kA64: a 64-wide box (128-byte
// swizzle) then a 32-wide one).
template <int kBK, int kBN, int kNT, bool kBoxes = false, bool kA64 = false>
struct FragAddrs {
  static constexpr bool kAMixed = kBoxes && kBK == 96 && kA64;      // a in a 64- and a 32-wide box
  static constexpr bool kABoxes = kBoxes && kBK == 96 && !kA64;     // a in 32-wide boxes
  static constexpr int kQ = kBK / 16, kBPitch = kBoxes ? 64 : kBN;  // b's row pitch in shared memory
  static constexpr int kAPitch = kABoxes ? 32 : kBK, kQA = kABoxes ? 2 : kQ;
  uint32_t a[kQA], b[kNT / 2];  // step q's a fragment (m16 tile 0); pair p's b fragment (step 0)
  __device__ __forceinline__ FragAddrs(uint32_t a_sm, uint32_t b_sm, int row0, int col0, int lane) {
#pragma unroll
    for (int q = 0; q < kQA; ++q)
      a[q] = a_sm +
             2 * (kAMixed   ? (q < 4 ? a_off<64>(row0 + lane % 16, q * 16 + (lane / 16) * 8)
                                     : kBM * 64 + a_box32_off(row0 + lane % 16, (q - 4) * 16 + (lane / 16) * 8))
                  : kABoxes ? a_box32_off(row0 + lane % 16, q * 16 + (lane / 16) * 8)
                            : a_off<kBK>(row0 + lane % 16, q * 16 + (lane / 16) * 8));
#pragma unroll
    for (int pr = 0; pr < kNT / 2; ++pr)
      b[pr] = b_sm +
              2 * (kBoxes ? b_box_off<kBK>(lane % 8 + ((lane / 8) % 2) * 8, col0 + pr * 16 + (lane / 16) * 8)
                          : b_off<kBN>(lane % 8 + ((lane / 8) % 2) * 8, col0 + pr * 16 + (lane / 16) * 8));
  }
  // Step q's fragments of the stage at byte offsets st_a, st_b.
  __device__ __forceinline__ void load(uint32_t st_a, uint32_t st_b, int q, uint32_t (&fa)[4][4],
                                       uint32_t (&fb)[kNT][2]) const {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const uint32_t aq = kABoxes ? a[q % 2] + (q / 2) * kBM * 32 * 2 : a[q];
      const int pitch = kAMixed ? (q < 4 ? 64 : 32) : kAPitch;
      cuda::ldmatrix_x4(fa[mi], st_a + aq + mi * 16 * pitch * 2);
    }
#pragma unroll
    for (int pr = 0; pr < kNT / 2; ++pr) {
      uint32_t r4[4];
      cuda::ldmatrix_x4_trans(r4, st_b + b[pr] + q * 16 * kBPitch * 2);
      fb[2 * pr][0] = r4[0];
      fb[2 * pr][1] = r4[1];
      fb[2 * pr + 1][0] = r4[2];
      fb[2 * pr + 1][1] = r4[3];
    }
  }
};

// The register epilogue: a warp's 64 x (8 kNT) accumulators (mma m16n8 layout: d0, d1 at row
// lane / 4, columns 2 (lane % 4) + 0, 1; d2, d3 eight rows below) stored at rows r0.., columns
// c0.. of c, rounded to T, pairs in one store where c's layout allows.
template <typename T, int kNT>
__device__ __forceinline__ void store_acc(const float (&acc)[4][kNT][4], T* c, int64_t r0, int64_t c0,
                                          int64_t m, int64_t n, int64_t ldc, int64_t c_bs, int lane) {
  const bool pairs = ((ldc | c_bs) & 1) == 0 && reinterpret_cast<uintptr_t>(c) % 4 == 0;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int nj = 0; nj < kNT; ++nj) {
      const int64_t col = c0 + nj * 8 + (lane % 4) * 2;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = r0 + mi * 16 + lane / 4 + h * 8;
        if (row < m && col < n)
          cuda::store_pair<T>(c + row * ldc + col, acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1],
                              pairs && col + 1 < n);
        if (row < m && col + 1 < n && !pairs)
          cuda::store_pair<T>(c + row * ldc + col + 1, acc[mi][nj][2 * h + 1], 0.f, false);
      }
    }
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (used only there)
// Stage s of the TMA kernels' ring (a at a_sm + s kAStage, b at b_sm + s kBStage) <- k tile j of
// the 128 x kBN output tile at (m0, n0) of batch bz: one kBK x 128 box of a (kBK 64; 96: three
// 32-wide boxes, or kA64: a 64-wide box of map_a and a 32-wide one of map_a2), kBN / 64 boxes of
// kBK x 64 of b, completing on the stage's full mbarrier (full0 + 8 s). One thread.
template <uint32_t kAStage, uint32_t kBStage, int kBK = 64, bool kA64 = false>
__device__ __forceinline__ void tma_fill_stage(const CUtensorMap* map_a, const CUtensorMap* map_b,
                                               uint32_t a_sm, uint32_t b_sm, uint32_t full0, int s, int j,
                                               int m0, int n0, int bz, const CUtensorMap* map_a2 = nullptr) {
  constexpr int kBoxesB = kBStage / (kBK * 64 * 2);
  const uint32_t full = full0 + 8 * s;
  cuda::mbar_arrive_expect_tx(full, kAStage + kBStage);
  if constexpr (kBK == 96 && kA64) {
    cuda::tma_load_3d(a_sm + s * kAStage, map_a, j * kBK, m0, bz, full);
    cuda::tma_load_3d(a_sm + s * kAStage + kBM * 64 * 2, map_a2, j * kBK + 64, m0, bz, full);
  } else if constexpr (kBK == 96) {
#pragma unroll
    for (int i = 0; i < 3; ++i)
      cuda::tma_load_3d(a_sm + s * kAStage + i * kBM * 64, map_a, j * kBK + 32 * i, m0, bz, full);
  } else {
    cuda::tma_load_3d(a_sm + s * kAStage, map_a, j * kBK, m0, bz, full);
  }
#pragma unroll
  for (int i = 0; i < kBoxesB; ++i)
    cuda::tma_load_3d(b_sm + s * kBStage + i * kBK * 128, map_b, n0 + 64 * i, j * kBK, bz, full);
}

// The TMA-store epilogue's staging: a warp's 64 x 64 accumulators, rounded to T, into box `box`
// (64 columns x 128 rows of 128 bytes, 16 KB) of the buffer at c_sm, rows r0.., in the layout a
// TMA store reads (the 8 rows one store instruction writes hit 8 different chunks).
template <typename T>
__device__ __forceinline__ void acc_to_smem(const float (&acc)[4][8][4], uint32_t c_sm, int box, int r0,
                                            int lane) {
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int nj = 0; nj < 8; ++nj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = r0 + mi * 16 + lane / 4 + h * 8;
        cuda::stage_pair_swizzle128(c_sm + box * 16384, row, nj, lane,
                                    cuda::pack2<T>(acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1]));
      }
}
#endif

// The consumer loop of the TMA kernels: a warp's 64 x 64 piece of the 128 x 256 tile over `tiles`
// k tiles in the ring at stage offsets kAStage, kBStage, each awaited by wait(s, parity) (the
// stage's "full" mbarrier). Once per tile, after the warp's last fragments of it are loaded (and
// a __syncwarp), token = release(s, t) hands stage s back and finish(token, s, t) follows (the
// split keeps the kernel's code as measured: merging the two changed ptxas's schedule); landed(t)
// runs when k tile t's data is there (the kernels' hooks). kBK: 64 or 96 (kQ = kBK / 16 steps a
// tile). kTrim: the last tile's steps stop at last_steps (even), those that hold data (and that
// tile's stage is not released). rs, rph: the stage of the first k tile and the parity of its
// full phase (a persistent kernel's ring runs on across its output tiles); returns those of the
// k tile after the last, as rs | rph << 8. kSnakeMma: odd m16 rows take their n8 tiles in
// reverse (the b fragment at the turn is reused).
template <typename T, int kStages, uint32_t kAStage, uint32_t kBStage, int kBK = 64, bool kTrim = false,
          bool kSnakeMma = false, typename Frags, typename Wait, typename Release, typename Finish,
          typename Landed>
__device__ __forceinline__ uint32_t consume_ring(const Frags& fr, Wait wait, int tiles, float (&acc)[4][8][4],
                                                 Release release, Finish finish, Landed landed,
                                                 int last_steps = 0, int rs = 0, uint32_t rph = 0) {
  constexpr int kQ = kBK / 16, kNT = 8;
  static_assert(kQ % 2 == 0, "the next tile's first fragments go where step kQ - 1's did not");
  uint32_t af[2][4][4], bf[2][kNT][2];
  if (tiles > 0) {
    wait(rs, rph);
    fr.load(rs * kAStage, rs * kBStage, 0, af[0], bf[0]);
  }
  for (int t = 0; t < tiles; ++t) {
    const uint32_t st_a = rs * kAStage, st_b = rs * kBStage;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      if constexpr (kTrim) {
        if (q > 0 && q % 2 == 0 && q == last_steps && t + 1 == tiles) break;  // the rest is zeros
      }
      if (q + 1 < kQ) {
        fr.load(st_a, st_b, q + 1, af[(q + 1) & 1], bf[(q + 1) & 1]);
      } else {
        __syncwarp();  // the warp's reads of k tile t are done (its last fragments are loaded)
        finish(release(rs, t), rs, t);
        rs = rs + 1 == kStages ? 0 : rs + 1;
        rph ^= rs == 0;
        if (t + 1 < tiles) {
          wait(rs, rph);  // k tile t + 1 has landed
          landed(t + 1);
          fr.load(rs * kAStage, rs * kBStage, 0, af[0], bf[0]);
        }
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const int nj = kSnakeMma && (mi & 1) ? kNT - 1 - j : j;
          cuda::mma_m16n8k16<T>(acc[mi][nj], af[q & 1][mi], bf[q & 1][nj]);
        }
    }
  }
  return static_cast<uint32_t>(rs) | rph << 8;
}

// The TMA kernels' maps: a (m x k, boxes of kABox columns x kBM rows), b (k x n, 64 x kBK boxes),
// c (m x n, 64 x kBM boxes; only when store_c). False if the driver refuses one.
inline bool mma_tma_maps(const GemmParams& p, int kBK, uint32_t a_box, CUtensorMapSwizzle a_swizzle,
                         CUtensorMapL2promotion promotion, bool store_c, CUtensorMap* map_a,
                         CUtensorMap* map_b, CUtensorMap* map_c) {
  return cuda::make_tma_map_16bit(map_a, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, a_box, kBM,
                                  a_swizzle, promotion) &&
         cuda::make_tma_map_16bit(map_b, p.b, p.dtype, p.k, p.n, p.batch, p.b_rs, p.b_bs, 64, kBK,
                                  CU_TENSOR_MAP_SWIZZLE_128B, promotion) &&
         (!store_c ||
          cuda::make_tma_map_16bit(map_c, p.c, p.dtype, p.m, p.n, p.batch, p.c_rs, p.c_bs, 64, kBM));
}

}  // namespace mma
}  // namespace opforge
