// matmul, mma rung: the cp.async kernel (float16/bfloat16, sm_80+; variant "mma_cp_async"). A
// 128 x kBlockN tile of c per block of 8 warps (2 x 4), 64 x kBlockN / 4 per warp (the default
// 128 x 256: 4 x 8 mma tiles of 16 x 8 a warp, 128 accumulators a thread). The a and b tiles
// (kBlockK deep) stream through a kStages-deep cp.async ring (16-byte copies, zero-filled outside
// the matrices), so global loads of the next tiles overlap the tensor-core work on the current
// one; fragments are read with ldmatrix (b transposed on the fly, .trans), one 16-deep step ahead
// of the mma, and across tiles too: the block-wide barrier that hands over the next k tile sits
// before the last step's mma, so its first fragments load while those run. Blocks whose tile lies
// inside c copy whole k tiles from running pointers, spread over the steps, without bounds checks
// or per-chunk index math (most of the loop's integer instructions otherwise); fragment addresses
// are precomputed (FragAddrs). Shared tiles are XOR-swizzled by 16-byte chunk.
// Requirements (the launcher arranges them): row-major operands; k, n, the row and batch strides
// multiples of 8; 16-byte aligned bases.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/cp_async.cuh"
#include "common/cuda/launch.cuh"
#include "matmul/cuda/mma_kernel_common.cuh"

namespace opforge {
namespace mma {

// The shipped configuration; benchmarks/tuning/matmul/ derives candidates from it by name.
struct CpAsyncTraits {
  static constexpr int kBlockN = 256;  // 128 x 256 block tiles (128: two blocks per SM)
  static constexpr int kStages = 3;    // depth of the cp.async ring
  static constexpr int kBlockK = 64;   // depth of a k tile (32 or 64)
};

template <typename Traits, typename T>
__global__ void __launch_bounds__(kThreads, Traits::kBlockN == 128 ? 2 : 1)
    matmul_mma_cp_async_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m,
                               int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t a_bs,
                               int64_t b_bs, int64_t c_bs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kBN = Traits::kBlockN, kStages = Traits::kStages, kBK = Traits::kBlockK;
  using R = Ring<kBN, kStages, kBK>;
  constexpr int kATile = R::kATile, kBTile = R::kBTile, kWN = R::kWN, kNT = kWN / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const as = reinterpret_cast<T*>(smem_raw);  // [kStages][kATile]
  T* const bs = as + kStages * kATile;           // [kStages][kBTile]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  a += blockIdx.z * a_bs;
  b += blockIdx.z * b_bs;
  c += blockIdx.z * c_bs;

  // Each thread copies kBK / 16 16-byte chunks of the a tile and kBK * kBN / 2048 of the b tile
  // per stage.
  constexpr int kChunksA = kBK / 8, kRowsA = kThreads / kChunksA;  // a rows a pass of the block covers
  constexpr int kChunksB = kBN / 8, kRowsB = kThreads / kChunksB;
  static_assert(kRowsA % 8 == 0 && kRowsB % 8 == 0, "passes keep each thread's swizzle");
  const bool inside = m0 + kBM <= m && n0 + kBN <= n;
  // k tile k0 into stage `stage`: whole tiles inside the matrices by plain copies, edge tiles
  // chunk by chunk, zero-filled outside.
  auto load_tile = [&](int stage, int64_t k0) {
    if (inside && k0 + kBK <= k) {
      // Thread tid copies chunk tid % kChunks of rows tid / kChunks + pass * kRows: the same
      // swizzle in every pass, so shared offsets step by whole rows.
      const T* a_src = a + (m0 + tid / kChunksA) * lda + (tid % kChunksA) * 8 + k0;
      const T* b_src = b + (k0 + tid / kChunksB) * ldb + n0 + (tid % kChunksB) * 8;
      T* const a_dst = as + stage * kATile + a_off<kBK>(tid / kChunksA, (tid % kChunksA) * 8);
      T* const b_dst = bs + stage * kBTile + b_off<kBN>(tid / kChunksB, (tid % kChunksB) * 8);
#pragma unroll
      for (int s = 0; s < kBM / kRowsA; ++s)
        cuda::cp_async16(a_dst + s * kRowsA * kBK, a_src + s * kRowsA * lda, 16);
#pragma unroll
      for (int s = 0; s < kBK / kRowsB; ++s)
        cuda::cp_async16(b_dst + s * kRowsB * kBN, b_src + s * kRowsB * ldb, 16);
      return;
    }
#pragma unroll
    for (int s = 0; s < kBM * kChunksA / kThreads; ++s) {  // a: 128 rows x kBK / 8 chunks
      const int idx = tid + s * kThreads;
      const int r = idx / kChunksA, ch = idx % kChunksA;
      const int64_t gr = m0 + r, gk = k0 + ch * 8;
      const bool in = gr < m && gk < k;
      cuda::cp_async16(as + stage * kATile + a_off<kBK>(r, ch * 8), in ? a + gr * lda + gk : a, in ? 16 : 0);
    }
#pragma unroll
    for (int s = 0; s < kBK * kBN / (8 * kThreads); ++s) {  // b: kBK rows x kBN / 8 chunks
      const int idx = tid + s * kThreads;
      const int r = idx / (kBN / 8), ch = idx % (kBN / 8);
      const int64_t gk = k0 + r, gn = n0 + ch * 8;
      const bool in = gk < k && gn < n;
      cuda::cp_async16(bs + stage * kBTile + b_off<kBN>(r, ch * 8), in ? b + gk * ldb + gn : b, in ? 16 : 0);
    }
  };

  float acc[4][kNT][4] = {};  // [m16 tile][n8 tile][fragment]
  uint32_t af[2][4][4], bf[2][kNT][2];
  const int64_t tiles = (k + kBK - 1) / kBK;
  constexpr int kQ = kBK / 16;  // 16-deep mma steps per tile
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_tile(s, s * kBK);
    cuda::cp_async_commit();  // empty groups keep the count uniform
  }
  // Integer work kept off the loop: fragment addresses precomputed (FragAddrs), and the interior
  // copies walk running pointers. The barrier of tile t + 1 sits in tile t's last step, before
  // its mma: the first fragments of tile t + 1 are read while those run. A tile's copies are
  // spread over the kQ - 1 steps before.
  static_assert(kQ % 2 == 0, "fragment buffers alternate within and across tiles");
  constexpr int kParts = kQ - 1;
  constexpr uint32_t kAStage = kATile * 2, kBStage = kBTile * 2;  // bytes
  const uint32_t a_sm = cuda::smem_addr(as), b_sm = cuda::smem_addr(bs);
  const FragAddrs<kBK, kBN, kNT> fr(a_sm, b_sm, wm * kWM, wn * kWN, lane);
  auto frags = [&](uint32_t st_a, uint32_t st_b, int q, uint32_t(&fa)[4][4], uint32_t(&fb)[kNT][2]) {
    fr.load(st_a, st_b, q, fa, fb);
  };
  // Interior copies: chunk tid % kChunks of rows tid / kChunks + i * kRows, i < kCopiesA for a,
  // then the b rows.
  constexpr int kCopiesA = kBM / kRowsA, kCopies = kCopiesA + kBK / kRowsB;
  constexpr int kPer = (kCopies + kParts - 1) / kParts;
  const T* a_g = a + (m0 + tid / kChunksA) * lda + (tid % kChunksA) * 8 + (kStages - 1) * kBK;
  const T* b_g = b + ((kStages - 1) * kBK + tid / kChunksB) * ldb + n0 + (tid % kChunksB) * 8;
  const int64_t a_step = kRowsA * lda, b_step = kRowsB * ldb, b_tile = kBK * ldb;
  const uint32_t a_cp = a_sm + 2 * a_off<kBK>(tid / kChunksA, (tid % kChunksA) * 8);
  const uint32_t b_cp = b_sm + 2 * b_off<kBN>(tid / kChunksB, (tid % kChunksB) * 8);
  auto copy_part = [&](int stage, int part) {
    const T* pa = a_g + (part * kPer) * a_step;
    const T* pb = b_g + (part * kPer - kCopiesA) * b_step;
#pragma unroll
    for (int i = part * kPer; i < (part + 1) * kPer && i < kCopies; ++i) {
      if (i < kCopiesA) {
        cuda::cp_async16(a_cp + stage * kAStage + i * kRowsA * kBK * 2, pa, 16);
        pa += a_step;
      } else {
        if (i == kCopiesA) pb = b_g;
        cuda::cp_async16(b_cp + stage * kBStage + (i - kCopiesA) * kRowsB * kBN * 2, pb, 16);
        pb += b_step;
      }
    }
  };

  cuda::cp_async_wait<kStages - 2>();
  __syncthreads();
  if (tiles > 0) frags(0, 0, 0, af[0], bf[0]);
  int rs = 0, ws = kStages - 1;  // stage read in tile t, and written with tile t + kStages - 1
  for (int64_t t = 0; t < tiles; ++t) {
    const uint32_t st_a = rs * kAStage, st_b = rs * kBStage;
    const int64_t next = t + kStages - 1;
    const bool fast = inside && (next + 1) * kBK <= k;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      if (q < kParts) {
        if (fast)
          copy_part(ws, q);
        else if (q == 0 && next < tiles)
          load_tile(ws, next * kBK);
        if (q == kParts - 1) {
          cuda::cp_async_commit();
          a_g += kBK;
          b_g += b_tile;
        }
      }
      if (q + 1 < kQ) {
        frags(st_a, st_b, q + 1, af[(q + 1) & 1], bf[(q + 1) & 1]);
      } else {
        cuda::cp_async_wait<kStages - 2>();  // tile t + 1 has landed (for this thread)...
        __syncthreads();                     // ...for every thread; and tile t's readers are done
        rs = rs + 1 == kStages ? 0 : rs + 1;
        ws = ws + 1 == kStages ? 0 : ws + 1;
        if (t + 1 < tiles) frags(rs * kAStage, rs * kBStage, 0, af[0], bf[0]);
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < kNT; ++nj) cuda::mma_m16n8k16<T>(acc[mi][nj], af[q & 1][mi], bf[q & 1][nj]);
    }
  }
  cuda::cp_async_wait<0>();

  store_acc<T, kNT>(acc, c, m0 + wm * kWM, n0 + wn * kWN, m, n, ldc, c_bs, lane);
#else
  __trap();  // no sm_80 code for this GPU (the launcher refuses it): never return an unwritten output
#endif  // sm_80+
}

// Sets the kernel up for the current device: cudaSuccess, or cudaErrorNoKernelImageForDevice
// when the binary has no sm_80+ code for this GPU.
template <typename Traits, typename T>
cudaError_t prepare_cp_async() {
  static signed char configured[64] = {};
  const cudaError_t err =
      cuda::configure_once(matmul_mma_cp_async_kernel<Traits, T>,
                           Ring<Traits::kBlockN, Traits::kStages, Traits::kBlockK>::kSmemBytes, configured,
                           [](const cudaFuncAttributes& f) { return f.ptxVersion >= 80; });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

template <typename Traits, typename T>
cudaError_t launch_cp_async(const GemmParams& p, cudaStream_t stream) {
  if (!mma_chunk_readable(p)) return cudaErrorInvalidValue;
  constexpr int kBN = Traits::kBlockN;
  const cudaError_t err = prepare_cp_async<Traits, T>();
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.n + kBN - 1) / kBN), static_cast<unsigned>((p.m + kBM - 1) / kBM),
                  static_cast<unsigned>(p.batch));
  matmul_mma_cp_async_kernel<Traits, T>
      <<<grid, kThreads, Ring<kBN, Traits::kStages, Traits::kBlockK>::kSmemBytes, stream>>>(
          static_cast<const T*>(p.a), static_cast<const T*>(p.b), static_cast<T*>(p.c), p.m, p.n, p.k, p.a_rs,
          p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  return cudaGetLastError();
}

}  // namespace mma
}  // namespace opforge
