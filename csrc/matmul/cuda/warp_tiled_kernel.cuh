// matmul rung 4, "warp_tiled" (float32): the register-blocked scheme organised by warps, with the
// shared tiles double-buffered. A 128 x 128 tile of c per block of 8 warps (2 x 4), each warp a
// 64 x 32 tile made of two 32 x 32 sub-tiles, each lane a 4 x 8 piece of each (8 x 8 in all). A
// warp's shared-memory reads then span only its own 64 rows and 32 columns: 8 distinct float4 of
// a (broadcast to the 4 lanes that share them) and 8 of b per k step. Two kernels (no torch):
//  - matmul_warp_tiled_staged_kernel (variant "warp_tiled_staged", any layout and GPU): the next
//    k tile (16 deep) is fetched from global memory into registers while the current one is
//    computed, then stored into the other shared buffer: one barrier per tile, and global latency
//    hidden behind 16 k steps. Blocks inside the matrices load without bounds checks.
//  - matmul_warp_tiled_cp_async_kernel (variant "warp_tiled_cp_async", sm_80+, calls whose
//    4-float groups are 16-byte accesses: simt_vectorizable): 32-deep tiles filled by cp.async
//    instead, with no staging registers, so two blocks share an SM (0.82x -> 0.91x cuBLAS at
//    4096^3). "warp_tiled" is this one where it can run, else the staged one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/cp_async.cuh"
#include "common/cuda/launch.cuh"
#include "matmul/cuda/simt_common.cuh"
#include "matmul/matmul_params.h"

namespace opforge {
namespace warp_tiled {

constexpr int kBM = 128, kPad = 4, kThreads = 256;
constexpr int kWM = 64;  // warp tile rows; 2 x 4 warps

// The shipped configurations; benchmarks/tuning/matmul/ derives candidates from them by name.
struct StagedTraits {
  static constexpr int kBlockN = 128;        // tile width: 128 (8 x 8 a lane) or 256 (8 x 16)
  static constexpr int kBlockK = 16;         // depth of a shared tile (16 staged floats a thread)
  static constexpr int kMinBlocksPerSm = 1;  // what the registers must allow (8-deep tiles fit two)
};
struct CpAsyncTraits {
  static constexpr int kBlockN = 128;
  static constexpr int kBlockK = 32;  // 66 KB of dynamic shared memory a block; two blocks per SM
};

// One k tile of a warp's FMAs: for each of kBK k steps, 8 a values (rows tm*4.. of the warp's
// two 32-row sub-tiles) and 8 b values per 32-column sub-tile from shared memory, then 8 x 8 kSubN
// FMAs into acc. at, bt: the tile's shared buffers, a transposed ([k][m]) and b ([k][n]).
template <int kBK, int kBN>
__device__ __forceinline__ void warp_tile_fma(const float (*at)[kBM + kPad], const float (*bt)[kBN + kPad],
                                              float (&acc)[8][8 * (kBN / 128)], int wm, int wn, int tm,
                                              int tn) {
  constexpr int kWN = kBN / 4, kSubN = kWN / 32;
#pragma unroll
  for (int kk = 0; kk < kBK; ++kk) {
    float rm[8], rn[8 * kSubN];
    simt::unpack(*reinterpret_cast<const float4*>(&at[kk][wm * kWM + tm * 4]), rm);
    simt::unpack(*reinterpret_cast<const float4*>(&at[kk][wm * kWM + 32 + tm * 4]), rm + 4);
#pragma unroll
    for (int q = 0; q < kSubN; ++q) {
      simt::unpack(*reinterpret_cast<const float4*>(&bt[kk][wn * kWN + q * 32 + tn * 8]), rn + 8 * q);
      simt::unpack(*reinterpret_cast<const float4*>(&bt[kk][wn * kWN + q * 32 + tn * 8 + 4]), rn + 8 * q + 4);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8 * kSubN; ++j) acc[i][j] = fmaf(rm[i], rn[j], acc[i][j]);
  }
}

// Stores a lane's 8 x 8 kSubN results: row i at r0 + (i / 4) * 32 + i % 4, sub-tile q's 8
// columns at c0 + q * 32.
template <bool kVec, int kBN>
__device__ __forceinline__ void store_warp_tile(float* c, const float (&acc)[8][8 * (kBN / 128)], int64_t r0,
                                                int64_t c0, int64_t m, int64_t n, int64_t ldc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = r0 + (i / 4) * 32 + i % 4;
#pragma unroll
    for (int q = 0; q < kBN / 128; ++q) {
      const int64_t col = c0 + q * 32;
      const float* v = acc[i] + 8 * q;
      simt::store4<kVec>(c, row, col, m, n, ldc, make_float4(v[0], v[1], v[2], v[3]));
      simt::store4<kVec>(c, row, col + 4, m, n, ldc, make_float4(v[4], v[5], v[6], v[7]));
    }
  }
}

// kBlockN: tile width, 128 (warp tiles 64 x 32, 8 x 8 a lane) or 256 (64 x 64, 8 x 16 a lane: 24
// floats read from shared memory per 128 FMAs instead of 16 per 64). kBlockK: depth of a shared
// tile. kMinBlocksPerSm: blocks per SM the registers must allow. With 16-deep tiles each thread
// stages 16 floats of the next tile and the 128-wide kernel takes 169 registers (one block of 8
// warps per SM); 8-deep tiles halve that staging, so it fits in 128 registers and two blocks
// share an SM, each one's barriers covered by the other's work.
template <typename Traits, bool kVec>
__global__ void __launch_bounds__(kThreads, Traits::kMinBlocksPerSm)
    matmul_warp_tiled_staged_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ c, int64_t m, int64_t n, int64_t k, int64_t lda,
                                    int64_t ldb, int64_t ldc, int64_t a_bs, int64_t b_bs, int64_t c_bs) {
  constexpr int kBN = Traits::kBlockN, kBK = Traits::kBlockK;
  constexpr int kWN = kBN / 4, kSubN = kWN / 32;  // warp tile columns; 32-column sub-tiles of it
  __shared__ __align__(16) float as[2][kBK][kBM + kPad];
  __shared__ __align__(16) float bs[2][kBK][kBN + kPad];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;  // this warp's tile: rows wm*64.., columns wn*kWN..
  const int tm = lane / 4, tn = lane % 4;  // this lane's rows tm*4 + {0..3} of each 32-row sub-tile, columns
                                           // tn*8..+7 of each 32-column one
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  a += blockIdx.z * a_bs;
  b += blockIdx.z * b_bs;
  c += blockIdx.z * c_bs;

  // Each thread moves kLoadsA float4 of the a tile (128 rows x kBK; row tid/2, k (tid%2)*4, and 8
  // more for 16-deep tiles: a warp's transposed stores then hit 32 different banks) and kLoadsB of
  // the b tile (kBK k x kBN columns).
  constexpr int kLoadsA = kBK / 8, kLoadsB = kBN * kBK / (4 * kThreads), kChunksB = kBN / 4;
  static_assert(kBM * kBK == kLoadsA * 4 * kThreads && kLoadsB >= 1, "whole float4 per thread");
  float4 ra[kLoadsA], rb[kLoadsB];
  const int a_row = tid / 2, a_k = (tid % 2) * 4;
  // Blocks whose tile lies inside c read whole k tiles without bounds checks (all but the last
  // k tile): a tenth of the instructions of the loop otherwise go to the checks.
  const bool inside = kVec && m0 + kBM <= m && n0 + kBN <= n;
  const float* a_inner = a + (m0 + a_row) * lda + a_k;
  const float* b_inner = b + n0;
  auto fetch = [&](int64_t k0) {
    if (inside && k0 + kBK <= k) {
#pragma unroll
      for (int s = 0; s < kLoadsA; ++s) ra[s] = __ldg(reinterpret_cast<const float4*>(a_inner + k0 + 8 * s));
#pragma unroll
      for (int s = 0; s < kLoadsB; ++s) {
        const int idx = tid + s * kThreads;
        rb[s] = __ldg(
            reinterpret_cast<const float4*>(b_inner + (k0 + idx / kChunksB) * ldb + (idx % kChunksB) * 4));
      }
      return;
    }
#pragma unroll
    for (int s = 0; s < kLoadsA; ++s) ra[s] = simt::load4<kVec>(a, m0 + a_row, k0 + a_k + 8 * s, m, k, lda);
#pragma unroll
    for (int s = 0; s < kLoadsB; ++s) {
      const int idx = tid + s * kThreads;
      rb[s] = simt::load4<kVec>(b, k0 + idx / kChunksB, n0 + (idx % kChunksB) * 4, k, n, ldb);
    }
  };
  auto stash = [&](int buf) {
#pragma unroll
    for (int s = 0; s < kLoadsA; ++s) {
      float v[4];
      simt::unpack(ra[s], v);
#pragma unroll
      for (int i = 0; i < 4; ++i) as[buf][a_k + 8 * s + i][a_row] = v[i];
    }
#pragma unroll
    for (int s = 0; s < kLoadsB; ++s) {
      const int idx = tid + s * kThreads;
      *reinterpret_cast<float4*>(&bs[buf][idx / kChunksB][(idx % kChunksB) * 4]) = rb[s];
    }
  };

  float acc[8][8 * kSubN] = {};  // rows: sub-tile (2) x 4; columns: sub-tile x 8
  const int64_t tiles = (k + kBK - 1) / kBK;
  if (tiles > 0) {
    fetch(0);
    stash(0);
  }
  __syncthreads();
  for (int64_t t = 0; t < tiles; ++t) {
    const int cur = static_cast<int>(t & 1);
    if (t + 1 < tiles) fetch((t + 1) * kBK);  // in flight while this tile is computed
    warp_tile_fma<kBK, kBN>(as[cur], bs[cur], acc, wm, wn, tm, tn);
    if (t + 1 < tiles) stash(cur ^ 1);  // nobody reads that buffer during this tile
    __syncthreads();
  }
  store_warp_tile<kVec, kBN>(c, acc, m0 + wm * kWM + tm * 4, n0 + wn * kWN + tn * 8, m, n, ldc);
}

// The same tiles fed by cp.async (sm_80+): global -> shared copies that need no staging
// registers, so 16- and 32-deep tiles (kBK) fit in 128 registers and two blocks share an SM (each
// one's barrier covered by the other's FMAs; 32-deep tiles in dynamic shared memory, 66 KB a
// block). a is transposed on the way in with 4-byte copies (kBK threads on a row's contiguous
// floats); b moves in 16-byte chunks. Edge chunks are zero-filled by the copy itself (a short
// source size). Serves vectorizable calls (simt_vectorizable).
template <typename Traits>
__global__ void __launch_bounds__(kThreads, 2)
    matmul_warp_tiled_cp_async_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int64_t m, int64_t n, int64_t k, int64_t lda,
                                      int64_t ldb, int64_t ldc, int64_t a_bs, int64_t b_bs, int64_t c_bs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kBN = Traits::kBlockN, kBK = Traits::kBlockK;
  constexpr int kWN = kBN / 4, kSubN = kWN / 32;
  extern __shared__ __align__(16) float smem_f[];  // as[2][kBK][kBM + kPad], then bs[2][kBK][kBN + kPad]
  auto as = reinterpret_cast<float(*)[kBK][kBM + kPad]>(smem_f);
  auto bs = reinterpret_cast<float(*)[kBK][kBN + kPad]>(smem_f + 2 * kBK * (kBM + kPad));
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;
  const int tm = lane / 4, tn = lane % 4;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  a += blockIdx.z * a_bs;
  b += blockIdx.z * b_bs;
  c += blockIdx.z * c_bs;

  constexpr int kCopiesA = kBM * kBK / kThreads, kChunksB = kBN / 4, kRowsB = kThreads / kChunksB;
  constexpr int kCopiesB = kBK / kRowsB;
  const int a_r = tid / kBK, a_k = tid % kBK, b_r = tid / kChunksB, b_c = (tid % kChunksB) * 4;
  const bool inside = m0 + kBM <= m && n0 + kBN <= n;
  const float* const a_g = a + (m0 + a_r) * lda + a_k;
  const float* const b_g = b + b_r * ldb + n0 + b_c;
  auto issue = [&](int buf, int64_t k0) {
    if (inside && k0 + kBK <= k) {
#pragma unroll
      for (int i = 0; i < kCopiesA; ++i)
        cuda::cp_async4(&as[buf][a_k][a_r + i * (kThreads / kBK)], a_g + k0 + i * (kThreads / kBK) * lda, 4);
#pragma unroll
      for (int i = 0; i < kCopiesB; ++i)
        cuda::cp_async16(&bs[buf][b_r + i * kRowsB][b_c], b_g + (k0 + i * kRowsB) * ldb, 16);
      return;
    }
#pragma unroll
    for (int i = 0; i < kCopiesA; ++i) {
      const int64_t row = m0 + a_r + i * (kThreads / kBK), kk = k0 + a_k;
      const bool in = row < m && kk < k;
      cuda::cp_async4(&as[buf][a_k][a_r + i * (kThreads / kBK)], in ? a + row * lda + kk : a, in ? 4 : 0);
    }
#pragma unroll
    for (int i = 0; i < kCopiesB; ++i) {
      const int64_t kk = k0 + b_r + i * kRowsB, col = n0 + b_c;
      const int bytes = kk < k && col < n ? 4 * static_cast<int>(n - col < 4 ? n - col : 4) : 0;
      cuda::cp_async16(&bs[buf][b_r + i * kRowsB][b_c], bytes ? b + kk * ldb + col : b, bytes);
    }
  };

  float acc[8][8 * kSubN] = {};
  const int64_t tiles = (k + kBK - 1) / kBK;
  if (tiles > 0) issue(0, 0);
  cuda::cp_async_commit();
  for (int64_t t = 0; t < tiles; ++t) {
    const int cur = static_cast<int>(t & 1);
    cuda::cp_async_wait<0>();
    __syncthreads();  // tile t is in for everyone, and everyone is done with tile t - 1's buffer
    if (t + 1 < tiles) issue(cur ^ 1, (t + 1) * kBK);
    cuda::cp_async_commit();
    warp_tile_fma<kBK, kBN>(as[cur], bs[cur], acc, wm, wn, tm, tn);
  }
  store_warp_tile<true, kBN>(c, acc, m0 + wm * kWM + tm * 4, n0 + wn * kWN + tn * 8, m, n, ldc);
#else
  __trap();  // no sm_80 code for this GPU; the launcher only picks this kernel on sm_80+
#endif
}

template <typename Traits>
cudaError_t launch_staged(const GemmParams& p, cudaStream_t s) {
  constexpr int kBN = Traits::kBlockN;
  const dim3 grid(static_cast<unsigned>((p.n + kBN - 1) / kBN), static_cast<unsigned>((p.m + kBM - 1) / kBM),
                  static_cast<unsigned>(p.batch));
  const auto* a = static_cast<const float*>(p.a);
  const auto* b = static_cast<const float*>(p.b);
  auto* c = static_cast<float*>(p.c);
  if (simt_vectorizable(p))
    matmul_warp_tiled_staged_kernel<Traits, true>
        <<<grid, kThreads, 0, s>>>(a, b, c, p.m, p.n, p.k, p.a_rs, p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  else
    matmul_warp_tiled_staged_kernel<Traits, false>
        <<<grid, kThreads, 0, s>>>(a, b, c, p.m, p.n, p.k, p.a_rs, p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  return cudaGetLastError();
}

template <typename Traits>
constexpr int cp_async_smem_bytes() {
  return 2 * Traits::kBlockK * (kBM + kPad + Traits::kBlockN + kPad) * 4;
}

// Sets the kernel up for the current device: cudaSuccess, or cudaErrorNoKernelImageForDevice
// when the binary has no sm_80+ code for this GPU (its PTX target: an arch list without sm_80
// leaves it a trap, even on a newer GPU through JIT).
template <typename Traits>
cudaError_t prepare_cp_async() {
  static signed char configured[64] = {};
  const cudaError_t err =
      cuda::configure_once(matmul_warp_tiled_cp_async_kernel<Traits>, cp_async_smem_bytes<Traits>(),
                           configured, [](const cudaFuncAttributes& f) { return f.ptxVersion >= 80; });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

template <typename Traits>
cudaError_t launch_cp_async(const GemmParams& p, cudaStream_t s) {
  if (!simt_vectorizable(p)) return cudaErrorInvalidValue;
  const cudaError_t err = prepare_cp_async<Traits>();
  if (err != cudaSuccess) return err;
  constexpr int kBN = Traits::kBlockN;
  const dim3 grid(static_cast<unsigned>((p.n + kBN - 1) / kBN), static_cast<unsigned>((p.m + kBM - 1) / kBM),
                  static_cast<unsigned>(p.batch));
  matmul_warp_tiled_cp_async_kernel<Traits><<<grid, kThreads, cp_async_smem_bytes<Traits>(), s>>>(
      static_cast<const float*>(p.a), static_cast<const float*>(p.b), static_cast<float*>(p.c), p.m, p.n, p.k,
      p.a_rs, p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  return cudaGetLastError();
}

}  // namespace warp_tiled
}  // namespace opforge
