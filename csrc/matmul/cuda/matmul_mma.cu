// matmul rung 5, "mma" (float16/bfloat16, sm_80+): tensor cores through mma.sync.m16n8k16 with
// float32 accumulation. On sm_90 the default is configuration 99 (the warp-specialised kernel
// below, persistent: one block per SM walking the tiles in groups of 16 tile rows (odd groups
// right to left, odd m16 rows' mma over their n8 tiles in reverse), a producer
// warpgroup filling the stages by TMA, 64-deep k tiles, each tile stored by TMA from a buffer of
// its own while the next one's stages fill) in builds with sm_90a code, else 74 (the TMA kernel:
// 96-deep k tiles, its warps refilling the stages themselves); elsewhere, and where TMA
// cannot serve a call, configuration 9, the cp.async kernel described
// here: a 128 x 256 tile of c per block of 8 warps (2 x 4), 64 x 64 per warp (4 x 8 mma tiles,
// 128 accumulators a thread). The a and b tiles (64 deep) stream through a 3-stage cp.async
// ring (16-byte copies, zero-filled outside the matrices), so global loads of the next tiles
// overlap the tensor-core work on the current one; fragments are read with ldmatrix (b
// transposed on the fly, .trans), one 16-deep step ahead of the mma, and across tiles too: the
// barrier sits before the last step's mma. Shared tiles are XOR-swizzled by 16-byte chunk so
// that the 8 rows an ldmatrix reads fall in different banks.
// The launcher guarantees: row-major operands; k, n, the row and batch strides multiples of 8;
// 16-byte aligned bases. Device code needs sm_80 (cp.async, mma.m16n8k16): for older targets in
// the arch list the kernel is compiled empty and the launcher refuses the variant.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "matmul/cuda/matmul_kernels.h"
#include "matmul/cuda/tensor_core_common.cuh"
#include "matmul/cuda/tma_map.cuh"

namespace opforge {
namespace {

constexpr int kBM = 128, kThreads = 256;
constexpr int kWM = 64;  // warp tile: 4 x (kBN / 32) mma tiles of 16 x 8

// kBN: 128 (warp tiles 64 x 32) or 256 (64 x 64: twice the mma per fragment loaded, one block
// of 8 warps per SM); kStages: depth of the cp.async ring; kBK: depth of a tile (32 or 64: half
// the barriers).
template <int kBN, int kStages, int kBK>
struct Config {
  static constexpr int kWN = kBN / 4;
  static constexpr int kATile = kBM * kBK, kBTile = kBK * kBN;  // elements per stage
  static constexpr int kSmemBytes = kStages * (kATile + kBTile) * 2;
};

using tc::smem_addr;

// 16 bytes global -> shared, asynchronously; `bytes` = 0 writes zeros (a chunk outside the matrix).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async16_raw(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// mbarriers (kMbar): `full` completes when every thread's copies of a stage have landed
// (cp.async.mbarrier.arrive.noinc: counted as each thread's arrival), `empty` when every warp has
// read the stage.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Returns the phase token (unused: waits go by parity).
__device__ __forceinline__ uint64_t mbar_arrive(uint32_t bar) {
  uint64_t state;
  asm volatile("mbarrier.arrive.shared.b64 %0, [%1];\n" : "=l"(state) : "r"(bar) : "memory");
  return state;
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

using tc::ldmatrix_x4;
using tc::ldmatrix_x4_trans;
using tc::mma16816;

// Element offsets in the swizzled shared tiles. a: [kBM][kBK], kBK / 8 chunks of 8 per row, chunk
// c of row r at c ^ ((r / 2) % 4) for 4 chunks, c ^ (r % 8) for 8. b: [kBK][kBN], kBN / 8 chunks
// per row, chunk c of row r at c ^ (r % 8). The 8 rows an ldmatrix reads hit 8 different chunks.
template <int kBK>
__device__ __forceinline__ int a_off(int r, int k) {
  const int swz = kBK == 32 ? ((r >> 1) & 3) : (r & 7);
  return r * kBK + (((k / 8) ^ swz) * 8) + k % 8;
}
template <int kBN>
__device__ __forceinline__ int b_off(int r, int n) { return r * kBN + (((n / 8) ^ (r & 7)) * 8) + n % 8; }

// Fragment addresses precomputed for the pipelined loops: a warp's shared addresses for every
// 16-deep step's a fragments and every pair of b's n8 tiles are a few registers plus immediates
// (the swizzle only XORs chunk bits that the step and pair indices do not change).
// TMA-filled b (kBoxes): kBN / 64 boxes of [kBK][64], each a 128-byte-swizzled 8 KB block (TMA's
// 128-byte swizzle spans 64 16-bit columns at most): chunk c of row r at c ^ (r % 8) in its box.
template <int kBK>
__device__ __forceinline__ int b_box_off(int r, int n) {
  return (n / 64) * kBK * 64 + r * 64 + ((((n % 64) / 8) ^ (r & 7)) * 8) + n % 8;
}

// TMA-filled a 96 deep (the sm_90 default): three boxes of [kBM][32], 64-byte swizzle (TMA's: chunk c of
// row r at c ^ ((r / 2) % 4)), so a step's addresses are those of the step two before plus a box.
__device__ __forceinline__ int a_box32_off(int r, int k) {
  return (k / 32) * kBM * 32 + r * 32 + ((((k % 32) / 8) ^ ((r >> 1) & 3)) * 8) + k % 8;
}

// kA64 (96 deep): a in a [kBM][64] box (128-byte swizzle) then a [kBM][32] one (64-byte).
template <int kBK, int kBN, int kNT, bool kBoxes = false, bool kA64 = false>
struct FragAddrs {
  static constexpr bool kAMixed = kBoxes && kBK == 96 && kA64;    // a in a 64- and a 32-wide box
  static constexpr bool kABoxes = kBoxes && kBK == 96 && !kA64;  // a in 32-wide boxes
  static constexpr int kQ = kBK / 16, kBPitch = kBoxes ? 64 : kBN;  // b's row pitch in shared memory
  static constexpr int kAPitch = kABoxes ? 32 : kBK, kQA = kABoxes ? 2 : kQ;
  uint32_t a[kQA], b[kNT / 2];  // step q's a fragment (m16 tile 0); pair p's b fragment (step 0)
  __device__ __forceinline__ FragAddrs(uint32_t a_sm, uint32_t b_sm, int row0, int col0, int lane) {
#pragma unroll
    for (int q = 0; q < kQA; ++q)
      a[q] = a_sm + 2 * (kAMixed ? (q < 4 ? a_off<64>(row0 + lane % 16, q * 16 + (lane / 16) * 8)
                                          : kBM * 64 + a_box32_off(row0 + lane % 16, (q - 4) * 16 + (lane / 16) * 8))
                         : kABoxes ? a_box32_off(row0 + lane % 16, q * 16 + (lane / 16) * 8)
                                   : a_off<kBK>(row0 + lane % 16, q * 16 + (lane / 16) * 8));
#pragma unroll
    for (int pr = 0; pr < kNT / 2; ++pr)
      b[pr] = b_sm + 2 * (kBoxes ? b_box_off<kBK>(lane % 8 + ((lane / 8) % 2) * 8, col0 + pr * 16 + (lane / 16) * 8)
                                 : b_off<kBN>(lane % 8 + ((lane / 8) % 2) * 8, col0 + pr * 16 + (lane / 16) * 8));
  }
  // Step q's fragments of the stage at byte offsets st_a, st_b.
  __device__ __forceinline__ void load(uint32_t st_a, uint32_t st_b, int q, uint32_t (&fa)[4][4],
                                       uint32_t (&fb)[kNT][2]) const {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const uint32_t aq = kABoxes ? a[q % 2] + (q / 2) * kBM * 32 * 2 : a[q];
      const int pitch = kAMixed ? (q < 4 ? 64 : 32) : kAPitch;
      ldmatrix_x4(fa[mi], st_a + aq + mi * 16 * pitch * 2);
    }
#pragma unroll
    for (int pr = 0; pr < kNT / 2; ++pr) {
      uint32_t r4[4];
      ldmatrix_x4_trans(r4, st_b + b[pr] + q * 16 * kBPitch * 2);
      fb[2 * pr][0] = r4[0];
      fb[2 * pr][1] = r4[1];
      fb[2 * pr + 1][0] = r4[2];
      fb[2 * pr + 1][1] = r4[3];
    }
  }
};

// Stores a warp's 64 x (8 kNT) accumulators (mma m16n8 layout: d0, d1 at row lane / 4, columns
// 2 (lane % 4) + 0, 1; d2, d3 eight rows below) at rows r0.., columns c0.. of c, rounded to T.
template <typename T, int kNT>
__device__ __forceinline__ void store_acc(const float (&acc)[4][kNT][4], T* c, int64_t r0, int64_t c0, int64_t m,
                                          int64_t n, int64_t ldc, int64_t c_bs, int lane) {
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
          tc::store_pair<T>(c + row * ldc + col, acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1], pairs && col + 1 < n);
        if (row < m && col + 1 < n && !pairs) tc::store_pair<T>(c + row * ldc + col + 1, acc[mi][nj][2 * h + 1], 0.f, false);
      }
    }
  }
}

// kFast: blocks whose tile lies inside c copy whole k tiles from per-thread base pointers, with
// no bounds checks or per-chunk index math (most of the loop's integer instructions otherwise).
template <typename T, int kBN, int kStages, int kBK, bool kFast, bool kPipe, bool kMbar = false>
__global__ void __launch_bounds__(kThreads, kBN == 128 ? 2 : 1)  // 128-wide: two blocks per SM
    matmul_mma_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int64_t m, int64_t n,
                      int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t a_bs, int64_t b_bs, int64_t c_bs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using C = Config<kBN, kStages, kBK>;
  constexpr int kATile = C::kATile, kBTile = C::kBTile, kWN = C::kWN, kNT = kWN / 8;
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
  const bool inside = kFast && m0 + kBM <= m && n0 + kBN <= n;
  auto load_tile = [&](int stage, int64_t k0) {
    if (inside && k0 + kBK <= k) {
      // Thread tid copies chunk tid % kChunks of rows tid / kChunks + pass * kRows: the same
      // swizzle in every pass, so shared offsets step by whole rows.
      const T* a_src = a + (m0 + tid / kChunksA) * lda + (tid % kChunksA) * 8 + k0;
      const T* b_src = b + (k0 + tid / kChunksB) * ldb + n0 + (tid % kChunksB) * 8;
      T* const a_dst = as + stage * kATile + a_off<kBK>(tid / kChunksA, (tid % kChunksA) * 8);
      T* const b_dst = bs + stage * kBTile + b_off<kBN>(tid / kChunksB, (tid % kChunksB) * 8);
#pragma unroll
      for (int s = 0; s < kBM / kRowsA; ++s) cp_async16(a_dst + s * kRowsA * kBK, a_src + s * kRowsA * lda, 16);
#pragma unroll
      for (int s = 0; s < kBK / kRowsB; ++s) cp_async16(b_dst + s * kRowsB * kBN, b_src + s * kRowsB * ldb, 16);
      return;
    }
#pragma unroll
    for (int s = 0; s < kBM * kChunksA / kThreads; ++s) {  // a: 128 rows x kBK / 8 chunks
      const int idx = tid + s * kThreads;
      const int r = idx / kChunksA, ch = idx % kChunksA;
      const int64_t gr = m0 + r, gk = k0 + ch * 8;
      const bool in = gr < m && gk < k;
      cp_async16(as + stage * kATile + a_off<kBK>(r, ch * 8), in ? a + gr * lda + gk : a, in ? 16 : 0);
    }
#pragma unroll
    for (int s = 0; s < kBK * kBN / (8 * kThreads); ++s) {  // b: kBK rows x kBN / 8 chunks
      const int idx = tid + s * kThreads;
      const int r = idx / (kBN / 8), ch = idx % (kBN / 8);
      const int64_t gk = k0 + r, gn = n0 + ch * 8;
      const bool in = gk < k && gn < n;
      cp_async16(bs + stage * kBTile + b_off<kBN>(r, ch * 8), in ? b + gk * ldb + gn : b, in ? 16 : 0);
    }
  };

  // Fragments of 16-deep step q + 1 are loaded while step q's mma run (two register sets).
  auto load_frags = [&](const T* at, const T* bt, int kk, uint32_t (&fa)[4][4], uint32_t (&fb)[kNT][2]) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {  // rows 0-15 of the m16 tile, k 0-7 then 8-15
      const int r = wm * kWM + mi * 16 + (lane % 16);
      ldmatrix_x4(fa[mi], at + a_off<kBK>(r, kk + (lane / 16) * 8));
    }
#pragma unroll
    for (int nj = 0; nj < kNT; nj += 2) {  // two n8 tiles: (k 0-7, k 8-15) x (n, n + 8)
      const int kr = kk + (lane % 8) + ((lane / 8) % 2) * 8;
      const int col = wn * kWN + nj * 8 + (lane / 16) * 8;
      uint32_t r4[4];
      ldmatrix_x4_trans(r4, bt + b_off<kBN>(kr, col));
      fb[nj][0] = r4[0];
      fb[nj][1] = r4[1];
      fb[nj + 1][0] = r4[2];
      fb[nj + 1][1] = r4[3];
    }
  };
  float acc[4][kNT][4] = {};  // [m16 tile][n8 tile][fragment]
  uint32_t af[2][4][4], bf[2][kNT][2];
  const int64_t tiles = (k + kBK - 1) / kBK;
  constexpr int kQ = kBK / 16;  // 16-deep mma steps per tile
  // kMbar: per-stage full/empty mbarriers instead of a block-wide barrier per tile, so the warps
  // drift apart (up to the ring's slack) and one warp's copies and waits overlap another's mma.
  static_assert(!kMbar || kPipe, "mbarriers only in the pipelined loop");
  __shared__ __align__(8) uint64_t full_bar[kMbar ? kStages : 1], empty_bar[kMbar ? kStages : 1];
  const uint32_t full0 = tc::smem_addr(full_bar), empty0 = tc::smem_addr(empty_bar);
  if constexpr (kMbar) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        mbar_init(full0 + 8 * s, kThreads);
        mbar_init(empty0 + 8 * s, kThreads / 32);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_tile(s, s * kBK);
    if constexpr (kMbar) {
      if (s < tiles) mbar_arrive_copies(full0 + 8 * s);
    } else {
      cp_async_commit();  // empty groups keep the count uniform
    }
  }
  if constexpr (kPipe) {
    // Integer work kept off the loop: fragment addresses precomputed (FragAddrs), and the
    // interior copies walk running pointers. The barrier of
    // tile t + 1 sits in tile t's last step, before its mma: the first fragments of tile t + 1
    // are read while those run. A tile's copies are spread over the kQ - 1 steps before.
    static_assert(kQ % 2 == 0, "fragment buffers alternate within and across tiles");
    constexpr int kParts = kQ - 1;
    constexpr uint32_t kAStage = kATile * 2, kBStage = kBTile * 2;  // bytes
    const uint32_t a_sm = tc::smem_addr(as), b_sm = tc::smem_addr(bs);
    const FragAddrs<kBK, kBN, kNT> fr(a_sm, b_sm, wm * kWM, wn * kWN, lane);
    auto frags = [&](uint32_t st_a, uint32_t st_b, int q, uint32_t (&fa)[4][4], uint32_t (&fb)[kNT][2]) {
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
          cp_async16_raw(a_cp + stage * kAStage + i * kRowsA * kBK * 2, pa, 16);
          pa += a_step;
        } else {
          if (i == kCopiesA) pb = b_g;
          cp_async16_raw(b_cp + stage * kBStage + (i - kCopiesA) * kRowsB * kBN * 2, pb, 16);
          pb += b_step;
        }
      }
    };


    if constexpr (kMbar) {
      if (tiles > 0) mbar_wait(full0, 0);
    } else {
      cp_async_wait<kStages - 2>();
      __syncthreads();
    }
    if (tiles > 0) frags(0, 0, 0, af[0], bf[0]);
    int rs = 0, ws = kStages - 1;  // stage read in tile t, and written with tile t + kStages - 1
    uint32_t rph = 0, wph = 1;     // kMbar: parity of tile t's full phase; of the empty phase ws awaits
    for (int64_t t = 0; t < tiles; ++t) {
      const uint32_t st_a = rs * kAStage, st_b = rs * kBStage;
      const int64_t next = t + kStages - 1;
      const bool fast = inside && (next + 1) * kBK <= k;
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        if (q < kParts) {
          if constexpr (kMbar) {
            if (q == 0 && t > 0 && next < tiles) mbar_wait(empty0 + 8 * ws, wph);  // tile t - 1 read
          }
          if (fast) copy_part(ws, q);
          else if (q == 0 && next < tiles) load_tile(ws, next * kBK);
          if (q == kParts - 1) {
            if constexpr (kMbar) {
              if (next < tiles) mbar_arrive_copies(full0 + 8 * ws);
            } else {
              cp_async_commit();
            }
            a_g += kBK;
            b_g += b_tile;
          }
        }
        if (q + 1 < kQ) {
          frags(st_a, st_b, q + 1, af[(q + 1) & 1], bf[(q + 1) & 1]);
        } else {
          if constexpr (kMbar) {
            __syncwarp();  // the warp's reads of tile t are done (its last fragments are loaded)
            if (lane == 0) mbar_arrive(empty0 + 8 * rs);
          } else {
            cp_async_wait<kStages - 2>();  // tile t + 1 has landed (for this thread)...
            __syncthreads();               // ...for every thread; and tile t's readers are done
          }
          rs = rs + 1 == kStages ? 0 : rs + 1;
          ws = ws + 1 == kStages ? 0 : ws + 1;
          rph ^= rs == 0;
          wph ^= ws == 0;
          if (t + 1 < tiles) {
            if constexpr (kMbar) mbar_wait(full0 + 8 * rs, rph);  // tile t + 1 has landed
            frags(rs * kAStage, rs * kBStage, 0, af[0], bf[0]);
          }
        }
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
          for (int nj = 0; nj < kNT; ++nj) mma16816<T>(acc[mi][nj], af[q & 1][mi], bf[q & 1][nj]);
      }
    }
  } else {
    for (int64_t t = 0; t < tiles; ++t) {
      cp_async_wait<kStages - 2>();  // tile t has landed (for this thread)...
      __syncthreads();               // ...for every thread; and tile t-1's readers are done
      const int64_t next = t + kStages - 1;
      if (next < tiles) load_tile(static_cast<int>(next % kStages), next * kBK);
      cp_async_commit();
      const T* at = as + (t % kStages) * kATile;
      const T* bt = bs + (t % kStages) * kBTile;
      load_frags(at, bt, 0, af[0], bf[0]);
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        if (q + 1 < kQ) load_frags(at, bt, (q + 1) * 16, af[(q + 1) & 1], bf[(q + 1) & 1]);
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
          for (int nj = 0; nj < kNT; ++nj) mma16816<T>(acc[mi][nj], af[q & 1][mi], bf[q & 1][nj]);
      }
    }
  }
  cp_async_wait<0>();

  store_acc<T, kNT>(acc, c, m0 + wm * kWM, n0 + wn * kWN, m, n, ldc, c_bs, lane);
#else
  __trap();  // no sm_80 code for this GPU: never return an unwritten output
#endif  // sm_80+
}

// TMA variant (sm_90: H100/H200; the default there): the cp.async kernel's tiles, warps and
// ldmatrix/mma loop, but the stages are filled by the tensor memory accelerator. One thread issues
// a stage's copies (one 128 x 64 box of a, four 64 x 64 boxes of b, 128-byte swizzle, zeros outside
// the matrices), which complete on the stage's "full" mbarrier. Each warp counts itself out of a
// stage (an atomic in shared memory) once it has read its last fragments there, and the last one
// refills it at once (kStages k tiles ahead). The warps carry no copy addresses or bounds, wait on
// no cp.async group, meet at no block-wide barrier and never wait to refill: a warp waits only for
// data that has not landed. Measured against the alternatives
// (benchmarks/results/h200-matmul/tuning/README.md): a fixed thread refilling after an "empty"
// mbarrier wait was 4% slower, a ninth copying warp cannot launch (288 threads x 224 registers
// overflow a sub-partition's register file), a persistent grid, a producer warpgroup and two blocks
// of 128 x 128 tiles per SM gained nothing, nor did stream-K over the last two waves, stages
// refilled by piece, the hand-over (or its count) every other tile, or an early test for the next
// tile's landing, or clusters of 2 sharing b by multicast (benchmarks/micro/mma_mix.cu puts the
// loop with its per-tile hand-over at 573 TFLOP/s without L2 traffic, against 648 for the mma
// alone). Configuration 74 (the default where the build has no sm_90a code; the warp-specialised
// kernel below, 99 by default, replaces its refills elsewhere) also stores the tile by TMA
// (kTmaStore): 2-3% faster at 4096^3 and 8192^3 than the per-thread stores (configuration 20), 10%
// at 8192 x 1024 x 8192; it takes the tiles in groups of 16 tile rows (kGroupRows), 1-3% faster
// than row by row (30); and its k tiles are 96 deep (kBK; a in three 32-wide boxes with TMA's
// 64-byte swizzle, 216 KB for the 3 stages), so the per-tile hand-over comes every 6 steps instead
// of 4: mma_mix's loop ceiling 597 TFLOP/s against 571, the kernel's traced cycles per 64 of k 1701
// against 1776, and at 4096^3 0.683x the cuBLAS call timed next to it on average (seven timings)
// against 0.666x (nine) for 64-deep tiles (40) in the same runs. The last k tile's mma stop where
// its data does (kTrim: 4096 = 42 x 96 + 64).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (used only there)
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// 3-D TMA copy of the box at (x, y, z) of `map` to shared address dst, completing on `bar`.
__device__ __forceinline__ void tma_load3(uint32_t dst, const CUtensorMap* map, int x, int y, int z, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y), "r"(z)
      : "memory");
}
// Stage s of the TMA kernels' ring (a at a_sm + s kAStage, b at b_sm + s kBStage) <- k tile j of
// the 128 x kBN output tile at (m0, n0) of batch bz: one kBK x 128 box of a (kBK 64; 96: three
// 32-wide boxes), kBN / 64 boxes of kBK x 64 of b, completing on the stage's full mbarrier
// (full0 + 8 s). One thread.
// kA64 (96 deep): a as a 64-wide box of map_a (128-byte swizzle) and a 32-wide one of map_a2.
template <uint32_t kAStage, uint32_t kBStage, int kBK = 64, bool kA64 = false>
__device__ __forceinline__ void tma_fill_stage(const CUtensorMap* map_a, const CUtensorMap* map_b, uint32_t a_sm,
                                               uint32_t b_sm, uint32_t full0, int s, int j, int m0, int n0, int bz,
                                               const CUtensorMap* map_a2 = nullptr) {
  constexpr int kBoxesB = kBStage / (kBK * 64 * 2);
  const uint32_t full = full0 + 8 * s;
  mbar_expect_tx(full, kAStage + kBStage);
  if constexpr (kBK == 96 && kA64) {
    tma_load3(a_sm + s * kAStage, map_a, j * kBK, m0, bz, full);
    tma_load3(a_sm + s * kAStage + kBM * 64 * 2, map_a2, j * kBK + 64, m0, bz, full);
  } else if constexpr (kBK == 96) {
#pragma unroll
    for (int i = 0; i < 3; ++i) tma_load3(a_sm + s * kAStage + i * kBM * 64, map_a, j * kBK + 32 * i, m0, bz, full);
  } else {
    tma_load3(a_sm + s * kAStage, map_a, j * kBK, m0, bz, full);
  }
#pragma unroll
  for (int i = 0; i < kBoxesB; ++i)
    tma_load3(b_sm + s * kBStage + i * kBK * 128, map_b, n0 + 64 * i, j * kBK, bz, full);
}
// The TMA-store epilogue: a warp's 64 x 64 accumulators, rounded to T, into box `box` (64 columns
// x 128 rows, 128-byte rows, TMA's 128-byte swizzle: chunk c of row r at c ^ (r % 8), so the 8
// rows one store instruction writes hit 8 different chunks) of the buffer at c_sm, rows r0...
template <typename T>
__device__ __forceinline__ void acc_to_smem(const float (&acc)[4][8][4], uint32_t c_sm, int box, int r0, int lane) {
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int nj = 0; nj < 8; ++nj)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = r0 + mi * 16 + lane / 4 + h * 8;
        const uint32_t addr = c_sm + box * 16384 + row * 128 + ((nj ^ (row & 7)) * 16) + (lane % 4) * 4;
        const uint32_t v = tc::pack2<T>(acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1]);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
      }
}
#endif

// The consumer loop of the TMA kernel: a warp's 64 x 64 piece of the 128 x 256 tile over `tiles`
// 64-deep k tiles in the ring at stage offsets kAStage, kBStage, each awaited by wait(s, parity)
// (the stage's "full" mbarrier). Once per tile, after the warp's last fragments of it are loaded
// (and a __syncwarp), token = release(s, t) hands stage s back and finish(token, s, t) follows
// (the split keeps the kernel's code as measured: merging the two changed ptxas's schedule).
// kBK: 64 or 96 (kQ = kBK / 16 steps a tile). kTrim: the last tile's steps stop at last_steps
// (even), those that hold data (and that tile's stage is not released). rs, rph: the stage of the
// first k tile and the parity of its full phase (a persistent kernel's ring runs on across its
// output tiles); returns those of the k tile after the last, as rs | rph << 8.
// kSnakeMma: odd m16 rows take their n8 tiles in reverse (the b fragment at the turn is reused).
template <typename T, int kStages, uint32_t kAStage, uint32_t kBStage, int kBK = 64, bool kTrim = false,
          bool kSnakeMma = false, typename Frags, typename Wait, typename Release, typename Finish, typename Landed>
__device__ __forceinline__ uint32_t consume_ring(const Frags& fr, Wait wait, int tiles, float (&acc)[4][8][4],
                                                 Release release, Finish finish, Landed landed, int last_steps = 0,
                                                 int rs = 0, uint32_t rph = 0) {
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
          mma16816<T>(acc[mi][nj], af[q & 1][mi], bf[q & 1][nj]);
        }
    }
  }
  return static_cast<uint32_t>(rs) | rph << 8;
}

// The block's output tile (m0, n0) when blocks in launch order take the tiles of kGroupRows tile
// rows column by column: a wave of 132 blocks then shares fewer panels of a and b than whole tile
// rows would (4096^3, 32 x 16 tiles: a wave spans 16 rows by 8-9 columns, against 8-9 whole rows
// of 16 columns).
// grouped_tile_of: the same for output tile lin of a tiles_m x tiles_n grid.
// kSnake: odd groups walk their columns right to left (the b panels the last group read last).
template <int kGroupRows, int kBN, bool kSnake = false>
__device__ __forceinline__ void grouped_tile_of(int lin, int tiles_m, int tiles_n, int& m0, int& n0) {
  const int group = lin / (kGroupRows * tiles_n), first = group * kGroupRows;
  const int rows = tiles_m - first < kGroupRows ? tiles_m - first : kGroupRows;
  const int w = lin - group * kGroupRows * tiles_n;
  m0 = (first + w % rows) * kBM;
  n0 = (kSnake && (group & 1) ? tiles_n - 1 - w / rows : w / rows) * kBN;
}
template <int kGroupRows, int kBN>
__device__ __forceinline__ void grouped_tile(int& m0, int& n0) {
  grouped_tile_of<kGroupRows, kBN>(blockIdx.x + gridDim.x * blockIdx.y, gridDim.y, gridDim.x, m0, n0);
}

#ifdef OPFORGE_MATMUL_TUNING
// Timeline of the TMA kernel's first kTraceBlocks blocks (kTrace, tuning): per warp and k tile,
// the SM clock when the warp released the tile's stage ([0]) and when the next tile's data had
// landed for it ([1]); per k tile, when its stage fill was issued ([2], by warp 0's slot).
constexpr int kTraceBlocks = 16, kTraceTiles = 64;
__device__ unsigned long long g_mma_trace[kTraceBlocks][8][kTraceTiles][3];
#endif

// kTmaStore: the epilogue rounds the tile into the (then idle) ring's shared memory and one
// thread stores it with bulk tensor copies (no per-element bounds checks: TMA clips at c's
// edges); map_c is unused otherwise.
// kBK: 64 or 96 (a in three 32-wide boxes). kTrim: the last k tile's mma stop after the steps
// that hold data (k's remainder, rounded up to 32); the rest would multiply TMA's zeros.
// kNoRefill (a tuning diagnostic, wrong results): each stage is filled once, at the start, and
// the loop re-reads that data, with no traffic from L2 and no waits (the counts still run).
template <typename T, int kStages, bool kTmaStore = false, bool kTrace = false, int kGroupRows = 0, int kBK = 64,
          bool kTrim = false, bool kNoRefill = false>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_mma_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          const __grid_constant__ CUtensorMap map_c, T* __restrict__ c, int m, int n, int k,
                          int64_t ldc, int64_t c_bs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kBN = 256, kWarps = kThreads / 32;
  using C = Config<kBN, kStages, kBK>;
  constexpr int kWN = C::kWN, kNT = kWN / 8;
  constexpr uint32_t kAStage = C::kATile * 2, kBStage = C::kBTile * 2;  // bytes
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_bar[kStages];
  __shared__ uint32_t readers_done[kStages];  // warps done with the stage, ever
  const uint32_t a_sm = (tc::smem_addr(smem_raw) + 1023) & ~1023u;  // the swizzle's 1024-byte atoms
  const uint32_t b_sm = a_sm + kStages * kAStage;
  const uint32_t full0 = tc::smem_addr(full_bar), done0 = tc::smem_addr(readers_done);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;
  int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const int bz = blockIdx.z;
  if constexpr (kGroupRows > 0) grouped_tile<kGroupRows, kBN>(m0, n0);
  const int tiles = (k + kBK - 1) / kBK;
#ifdef OPFORGE_MATMUL_TUNING
  const int trace_block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const auto stamp = [&](int w, int t, int e) {
    if constexpr (kTrace) {
      if (trace_block < kTraceBlocks && t < kTraceTiles) g_mma_trace[trace_block][w][t][e] = clock64();
    }
  };
#else
  const auto stamp = [](int, int, int) {};
#endif
  auto issue = [&](int s, int j) {  // k tile j into stage s (one thread)
    stamp(0, j, 2);
    tma_fill_stage<kAStage, kBStage, kBK>(&map_a, &map_b, a_sm, b_sm, full0, s, j, m0, n0, bz);
  };
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);  // the issuing thread's arrival (plus the bytes)
      readers_done[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();
  if (tid == 0)
    for (int s = 0; s < kStages && s < tiles; ++s) issue(s, s);

  const FragAddrs<kBK, kBN, kNT, true> fr(a_sm, b_sm, wm * kWM, wn * kWN, lane);
  float acc[4][kNT][4] = {};
  const auto count_out = [&](uint32_t counter) {  // lane 0: one more reader done; the count before
    uint32_t before = 0;
    if (lane == 0)
      asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], 1;\n" : "=r"(before) : "r"(counter) : "memory");
    return before;
  };
  const auto stamp_landed = [&](int t) {
    if (lane == 0) stamp(warp, t, 1);
  };
  const int rem = k - (tiles - 1) * kBK;  // the last tile's depth holding data
  consume_ring<T, kStages, kAStage, kBStage, kBK, kTrim>(
      fr,
      [&, waits = 0](int rs, uint32_t parity) mutable {
        if (!kNoRefill || waits++ < kStages) mbar_wait(full0 + 8 * rs, parity);
      },
      tiles, acc,
      [&](int rs, int t) {  // the warp counts itself out of stage rs
        if (lane == 0) stamp(warp, t, 0);
        return count_out(done0 + 4 * rs);
      },
      [&](uint32_t before, int rs, int t) {
        if (!kNoRefill && lane == 0 && before % kWarps == kWarps - 1 && t + kStages < tiles) {  // the last reader refills
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // reads before TMA's writes
          issue(rs, t + kStages);
        }
      },
      stamp_landed, 2 * ((rem + 31) / 32));
  if constexpr (kTmaStore) {
    static_assert(128 * kBN * 2 <= kStages * (kAStage + kBStage), "the tile fits in the ring");
    __syncthreads();  // every warp is done with the ring (and every copy into it has landed)
    acc_to_smem<T>(acc, a_sm, wn, wm * kWM, lane);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the writes, to the bulk copies
    __syncthreads();
    if (tid == 0) {
#pragma unroll
      for (int i = 0; i < kBN / 64; ++i) tc::tma_store3(&map_c, a_sm + i * 16384, n0 + 64 * i, m0, bz);
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // before the block's memory goes
    }
  } else {
    store_acc<T, kNT>(acc, c + bz * c_bs, m0 + wm * kWM, n0 + wn * kWN, m, n, ldc, c_bs, lane);
  }
#else
  __trap();  // no sm_90 code for this GPU: the launcher falls back to the cp.async kernel
#endif  // sm_90+
}

// The warp-specialised TMA kernel (sm_90a: setmaxnreg; configuration 88, and persistent (below) the
// default where the build has 9.0a code): the TMA kernel's consumers (8 warps, the same tiles,
// 96-deep k tiles, trim, grouped order and TMA-store epilogue), but a producer warpgroup's thread 0
// refills each stage as soon as every consumer warp has released it on the stage's "empty"
// mbarrier: a warp's hand-over is one mbarrier arrive (no fence, atomic or refill in its loop) and
// its wait for the next stage. 384 threads start at 168 registers; the producers give theirs back
// (setmaxnreg.dec to 40) and the consumers take 232 (each scheduler: two consumer warps and a
// sleeping producer warp).
// kA64: a as a 64-wide box (128-byte swizzle) and a 32-wide one (map_a2) instead of three 32-wide.
// Measured at the H200's power cap (matmul_tune.py --power: 4 s each back to back): 469 TFLOP/s
// against the TMA kernel's 454-458, cuBLAS 658-670, the a boxes and L2 promotion +0.6%.
constexpr int kWsThreads = kThreads + 128;
// kPersistent (configuration 91; with kSnake and kSnakeMma, 99, the default with 9.0a code; at the
// cap 481.5-481.8 TFLOP/s against 88's 472.9-473.4, power-0a6d185-ring-staging.log in the tuning
// results): one block per SM walks the output tiles (grouped order, batch outermost; tiles_m x
// tiles_n x batch of them) with one k-tile sequence through the ring, so the producer fills the
// next tile's stages while the consumers store the last tile, from a staging buffer of its own
// after the ring (64 KB: 64-deep k tiles, 3 stages). No trim then (a trimmed k tile's stage would
// never be released).
template <typename T, int kStages, int kBK, bool kA64 = false, bool kPersistent = false, bool kSnake = false,
          bool kSnakeMma = false>
__global__ void __launch_bounds__(kWsThreads, 1)
    matmul_mma_ws_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                         const __grid_constant__ CUtensorMap map_c, int k, const __grid_constant__ CUtensorMap map_a2,
                         int tiles_m, int tiles_n, int batch) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBN = 256, kGroupRows = 16, kWarps = kThreads / 32;
  using C = Config<kBN, kStages, kBK>;
  constexpr int kWN = C::kWN, kNT = kWN / 8;
  constexpr uint32_t kAStage = C::kATile * 2, kBStage = C::kBTile * 2;  // bytes
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_bar[kStages], empty_bar[kStages];
  const uint32_t a_sm = (tc::smem_addr(smem_raw) + 1023) & ~1023u;  // the swizzle's 1024-byte atoms
  const uint32_t b_sm = a_sm + kStages * kAStage;
  const uint32_t c_sm = kPersistent ? b_sm + kStages * kBStage : a_sm;  // the tile staged for its stores
  const uint32_t full0 = tc::smem_addr(full_bar), empty0 = tc::smem_addr(empty_bar);
  // The blocks' tiles: lin = blockIdx.x, + gridDim.x, ... (kPersistent), else the grid's one. Computed
  // on each side of setmaxnreg: values live across it get spilled.
  const auto first = [] { return kPersistent ? static_cast<int>(blockIdx.x) : 0; };
  const auto step = [] { return kPersistent ? static_cast<int>(gridDim.x) : 1; };
  const auto count = [&] { return kPersistent ? tiles_m * tiles_n * batch : 1; };
  const auto coords = [&](int lin, int& m0, int& n0, int& bz) {
    if constexpr (kPersistent) {
      bz = lin / (tiles_m * tiles_n);
      grouped_tile_of<kGroupRows, kBN, kSnake>(lin - bz * tiles_m * tiles_n, tiles_m, tiles_n, m0, n0);
    } else {
      grouped_tile<kGroupRows, kBN>(m0, n0);
      bz = blockIdx.z;
    }
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);        // the producer's arrival (plus the bytes)
      mbar_init(empty0 + 8 * s, kWarps);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
  }
  __syncthreads();
  if (threadIdx.x < 128) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      const int tiles = (k + kBK - 1) / kBK, total = count();
      int s = 0;
      uint32_t pass = 0;  // parity of the ring pass: the first finds every stage free
      for (int lin = first(); lin < total; lin += step()) {
        int m0, n0, bz;
        coords(lin, m0, n0, bz);
        for (int j = 0; j < tiles; ++j) {
          mbar_wait(empty0 + 8 * s, pass ^ 1);
          tma_fill_stage<kAStage, kBStage, kBK, kA64>(&map_a, &map_b, a_sm, b_sm, full0, s, j, m0, n0, bz, &map_a2);
          if (++s == kStages) s = 0, pass ^= 1;
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int tiles = (k + kBK - 1) / kBK, total = count();
  const int ct = threadIdx.x - 128, lane = ct % 32, warp = ct / 32, wm = warp / 4, wn = warp % 4;
  const FragAddrs<kBK, kBN, kNT, true, kA64> fr(a_sm, b_sm, wm * kWM, wn * kWN, lane);
  const int rem = k - (tiles - 1) * kBK;  // the last tile's depth holding data
  int rs = 0;        // the ring's stage for the next k tile
  uint32_t rph = 0;  // and the parity of its full phase
  for (int lin = first(); lin < total; lin += step()) {
    int m0, n0, bz;
    coords(lin, m0, n0, bz);
    float acc[4][kNT][4] = {};
    const uint32_t next = consume_ring<T, kStages, kAStage, kBStage, kBK, !kPersistent, kSnakeMma>(
        fr, [&](int st, uint32_t parity) { mbar_wait(full0 + 8 * st, parity); }, tiles, acc,
        [&](int st, int) {  // the warp's reads of the stage are done: release it
          if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty0 + 8 * st) : "memory");
          return 0u;
        },
        [](uint32_t, int, int) {}, [](int) {}, 2 * ((rem + 31) / 32), rs, rph);
    rs = static_cast<int>(next & 0xff), rph = next >> 8;
    // The epilogue: every copy into the ring this tile needed has landed (each was awaited); the
    // staging buffer is the ring itself unless kPersistent (whose last stores must have read it).
    if (kPersistent && ct == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");  // the consumers are done with it
    acc_to_smem<T>(acc, c_sm, wn, wm * kWM, lane);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the writes, to the bulk copies
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
    if (ct == 0) {
#pragma unroll
      for (int i = 0; i < kBN / 64; ++i) tc::tma_store3(&map_c, c_sm + i * 16384, n0 + 64 * i, m0, bz);
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
  }
  if (ct == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // before the block's memory goes
#else
  __trap();  // no sm_90a code for this GPU: the launcher falls back to the TMA kernel
#endif
}


template <typename T, int kBN, int kStages, int kBK = 32, bool kFast = false, bool kPipe = false, bool kMbar = false>
cudaError_t launch(const GemmParams& p, cudaStream_t stream) {
  using C = Config<kBN, kStages, kBK>;
  const auto kernel = matmul_mma_kernel<T, kBN, kStages, kBK, kFast, kPipe, kMbar>;
  static signed char configured[64] = {};
  const cudaError_t err =
      tc::configure_once(kernel, C::kSmemBytes, configured, [](const cudaFuncAttributes&) { return true; });
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.n + kBN - 1) / kBN), static_cast<unsigned>((p.m + kBM - 1) / kBM),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, kThreads, C::kSmemBytes, stream>>>(static_cast<const T*>(p.a), static_cast<const T*>(p.b),
                                                    static_cast<T*>(p.c), p.m, p.n, p.k, p.a_rs, p.b_rs, p.c_rs,
                                                    p.a_bs, p.b_bs, p.c_bs);
  return cudaGetLastError();
}

// The TMA kernel where it can run: its sm_90 code is in the binary (PTX target 9.0+: the device
// is then an sm_90 one too), the batch strides are not 0 (TMA strides) and the coordinates fit
// in int. Else the cp.async kernel (configuration 9). kTmaStore (the bulk-store epilogue) needs
// c's base and strides in multiples of 16 bytes; else the same kernel stores pairs from registers.
template <typename T, int kStages, bool kTmaStore = false, bool kTrace = false, int kGroupRows = 0, int kBK = 64,
          bool kTrim = false, bool kNoRefill = false>
cudaError_t launch_tma(const GemmParams& p, cudaStream_t stream) {
  if constexpr (kTmaStore) {
    if (!tc::tma_storable(p)) return launch_tma<T, kStages, false, kTrace, kGroupRows, kBK, kTrim, kNoRefill>(p, stream);
  }
  const auto fallback = [&] { return launch<T, 256, 3, 64, true, true>(p, stream); };
  using C = Config<256, kStages, kBK>;
  constexpr int kSmem = C::kSmemBytes + 1024;  // + alignment to 1024 bytes
  constexpr int64_t kMax = (int64_t{1} << 31) - 512;
  if ((p.batch > 1 && (p.a_bs == 0 || p.b_bs == 0)) || p.m >= kMax || p.n >= kMax || p.k >= kMax) return fallback();
  const auto kernel = matmul_mma_tma_kernel<T, kStages, kTmaStore, kTrace, kGroupRows, kBK, kTrim, kNoRefill>;
  static signed char configured[64] = {};
  const cudaError_t err = tc::configure_once(kernel, kSmem, configured,
                                             [](const cudaFuncAttributes& f) { return f.ptxVersion >= 90; });
  if (err == cudaErrorInvalidConfiguration) return fallback();
  if (err != cudaSuccess) return err;
  CUtensorMap map_a{}, map_b{}, map_c{};
  constexpr uint32_t kABox = kBK == 96 ? 32 : 64;  // a's box width: 96 deep takes three of 32
  constexpr CUtensorMapSwizzle kASwizzle = kBK == 96 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  if (!tc::make_tma_map(&map_a, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, kABox, kBM, kASwizzle) ||
      !tc::make_tma_map(&map_b, p.b, p.dtype, p.k, p.n, p.batch, p.b_rs, p.b_bs, 64, kBK) ||
      (kTmaStore && !tc::make_tma_map(&map_c, p.c, p.dtype, p.m, p.n, p.batch, p.c_rs, p.c_bs, 64, kBM)))
    return fallback();
  const dim3 grid(static_cast<unsigned>((p.n + 255) / 256), static_cast<unsigned>((p.m + kBM - 1) / kBM),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, kThreads, kSmem, stream>>>(map_a, map_b, map_c, static_cast<T*>(p.c), static_cast<int>(p.m),
                                            static_cast<int>(p.n), static_cast<int>(p.k), p.c_rs, p.c_bs);
  return cudaGetLastError();
}

// The warp-specialised kernel where it can run: the calls the TMA kernel takes whose c TMA can
// store, and a binary with its sm_90a code (a build without 9.0a has only its trap: fewer than
// the 168 registers setmaxnreg's exchange needs). Else the TMA kernel (configuration 74).
// kOpts: 1, a in a 64- and a 32-wide box (96 deep); 2, L2 fetches of a and b promoted to 256 bytes.
// 8: odd tile-row groups right to left (kSnake); 16: odd m16 rows' n8 tiles in reverse (kSnakeMma).
// kPersistent: one block per SM (or per tile, if fewer), a staging buffer after the ring.
template <typename T, int kStages, int kBK, int kOpts = 0, bool kPersistent = false>
cudaError_t launch_ws(const GemmParams& p, cudaStream_t stream) {
  const auto fallback = [&] { return launch_tma<T, 3, true, false, 16, 96, true>(p, stream); };
  using C = Config<256, kStages, kBK>;
  constexpr int kSmem = C::kSmemBytes + (kPersistent ? kBM * 256 * 2 : 0) + 1024;  // + alignment to 1024 bytes
  constexpr int64_t kMax = (int64_t{1} << 31) - 512;
  if ((p.batch > 1 && (p.a_bs == 0 || p.b_bs == 0)) || p.m >= kMax || p.n >= kMax || p.k >= kMax ||
      !tc::tma_storable(p))
    return fallback();
  constexpr bool kA64 = (kOpts & 1) && kBK == 96;
  const auto kernel = matmul_mma_ws_kernel<T, kStages, kBK, kA64, kPersistent, (kOpts & 8) != 0, (kOpts & 16) != 0>;
  static signed char configured[64] = {};
  const cudaError_t err = tc::configure_once(kernel, kSmem, configured, [](const cudaFuncAttributes& f) {
    return f.ptxVersion >= 90 && (f.numRegs + 7) / 8 * 8 >= 168;
  });
  if (err == cudaErrorInvalidConfiguration) return fallback();
  if (err != cudaSuccess) return err;
  CUtensorMap map_a{}, map_b{}, map_c{}, map_a2{};
  constexpr uint32_t kABox = kBK == 96 && !kA64 ? 32 : 64;
  constexpr CUtensorMapSwizzle kASwizzle = kABox == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  constexpr CUtensorMapL2promotion kPromo =
      kOpts & 2 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  if (!tc::make_tma_map(&map_a, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, kABox, kBM, kASwizzle, kPromo) ||
      !tc::make_tma_map(&map_b, p.b, p.dtype, p.k, p.n, p.batch, p.b_rs, p.b_bs, 64, kBK, CU_TENSOR_MAP_SWIZZLE_128B,
                        kPromo) ||
      (kA64 && !tc::make_tma_map(&map_a2, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, 32, kBM,
                                 CU_TENSOR_MAP_SWIZZLE_64B, kPromo)) ||
      !tc::make_tma_map(&map_c, p.c, p.dtype, p.m, p.n, p.batch, p.c_rs, p.c_bs, 64, kBM))
    return fallback();
  const int tiles_m = static_cast<int>((p.m + kBM - 1) / kBM), tiles_n = static_cast<int>((p.n + 255) / 256);
  dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m), static_cast<unsigned>(p.batch));
  if constexpr (kPersistent) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev))
      return cudaGetLastError();
    const int64_t total = static_cast<int64_t>(tiles_m) * tiles_n * p.batch;
    if (total == 0) return cudaSuccess;
    grid = dim3(static_cast<unsigned>(total < sms ? total : sms));
  }
  kernel<<<grid, kWsThreads, kSmem, stream>>>(map_a, map_b, map_c, static_cast<int>(p.k), map_a2, tiles_m, tiles_n,
                                              static_cast<int>(p.batch));
  return cudaGetLastError();
}

// Configuration kCfg (see matmul_kernels.h). The extension builds only the default; the tuning
// build (OPFORGE_MATMUL_TUNING) all of them. Configurations that no longer exist (they return
// cudaErrorInvalidValue; measured next to the default of the time, logs and numbers in
// benchmarks/results/h200-matmul/tuning/README.md) were:
// - 12: 9 with 32-bit copy strides in uniform registers: 0.600x against 9's 0.604x.
// - 15, 16: A ninth, producer warp doing all the copies (3 and 4 stages): 288 threads at 224
//   registers do not fit (a sub-partition's 3 warps need 21504 of its 16384): never launched.
// - 17-19: Stages filled by TMA but refilled by one thread after an "empty" mbarrier wait (17, 3
//   stages: 0.62x; 18, 4 stages), 19: 17 with ldmatrix spread in program order (ptxas re-bunched
//   them): no gain over cfg 9. Superseded by 20.
// - 22, 23: 20 and 21 persistent (one block per SM walking grouped tiles, its k tiles one sequence
//   through the ring): 0.623x against 20's 0.625x in the same run. Removed.
// - 24-26: 20 released by "empty" mbarrier arrives instead of the atomic (no fence round trip) and
//   refilled by thread 0 two tiles late (24: in step 1, 25: step 0; 4 stages) or one tile late in
//   step 3 (26, 3 stages): 0.616x, 0.610x, 0.593x against 20's 0.636x in the same run.
// - 27-29, 31-33: a producer
//   warpgroup refilling on "empty" mbarriers, setmaxnreg 40/232 (27, 3 stages; 28, 4): 0.648x /
//   0.640x against 20's 0.634x; 128 x 128 tiles of 4 warps, two blocks per SM (29; 31 with the TMA
//   store): 0.592x / 0.654x, L2 traffic up by a third; 30 with the refill decision deferred past
//   the tile's last mma (32; 33, 4 stages): 0.651x / 0.654x against 30's 0.697x. Removed.
// - 34-37: 30 with warps 4-7 (each scheduler's second warp) starting 400, 200, 800 cycles late
//   (37: 400, 4 stages), so that the two warps' tile-boundary gaps would not coincide: 469, 468,
//   467, 464 TFLOP/s at 4096^3 against 30's 467 in the same run. Removed.
// - 38: 30 persistent (one k-tile sequence through the ring across the block's output tiles,
//   grouped by 8 tile rows; each tile stored from a buffer of its own while the next one's mma
//   run): 470 TFLOP/s at 4096^3 against 30's 472 in the same run, 451 vs 448 at 8192^3. Removed.
// - 41-51: 41, 48: 30 and 40 with 4 stages: 467.7
//   vs 469.3 TFLOP/s at 4096^3, and the same cycles per k tile as 40 in its trace (the leading
//   warps' lead grows by the extra stage and they still wait); 42: 40 persistent with stream-K
//   over the last two waves (partial tiles summed through a workspace): 437 vs 30's 476 TFLOP/s at
//   4096^3, 439 vs 452 at 8192^3 (the stream-K blocks work at staggered k offsets, so the panels
//   they read no longer share L2); 46: the tile boundary's atomic, wait and loads amid the last
//   step's mma: 485 vs 40's 487; 43-45, 47, 49-51: diagnostics (half the fragment reads: +1.5% at
//   4096^3; no refills and no waits: +10%, 6% fewer cycles per k tile; 47 hung).
// - 52-57: each stage in six pieces with their
//   own full mbarriers and reader counts (a's two 64-row halves, refilled by the last of their 4
//   readers; b's four 64-column boxes, by the second of their 2), so that no piece waits for the
//   slowest of 8 warps: 419 TFLOP/s at 4096^3 against 40's 489 (52; 53, 4 stages: 421; 55, a
//   scheduler's pair sharing a's half: 420; 56, one release fence per warp and tile: 431; 57,
//   both: 426). Its timeline (54): 2274 cycles per k tile per warp against 1773, the warps 6668
//   cycles apart against 2562, 812 cycles from release to the next tile's landing against 276: the
//   two waits and counts a tile cost more than the finer refills gained. Removed.
// - 58, 60-63 (benchmarks/micro/mma_mix.cu had put 7.6% of the loop's own ceiling on the
//   per-tile hand-over, a count and a wait, even with the data there): the hand-over every
//   other k tile over a ring of 4 (58: 469 vs 481.5 TFLOP/s at 4096^3; a warp then waits for two
//   tiles at once, one of them a tile early); the count every
//   other tile, the wait after each (63: 477 vs 482 / 500); the next tile's landing tested in step
//   1 or 2, waited for at the boundary only if it had not (60, 61: 478 vs 478; 62 traced: 1837
//   cycles per k tile against 1785). Removed.
// - 64-66: 40 in clusters of 2 blocks on tile rows 2i, 2i + 1 sharing b by TMA multicast: each
//   block refilled its own a when its 8 warps had left a stage, then counted itself into the
//   cluster's count of that stage (in block 0), and the second of the two loaded both halves of b
//   into both (a third less L2 traffic per block). Correct on its check shapes, but 303 / 305
//   TFLOP/s at 4096^3 (64: 3 stages; 65: 4) against 40's 487.6 in the same run: the cluster-scope
//   release count and proxy fence compile to a MEMBAR.ALL.GPU each, in the refilling warp's path;
//   with the count relaxed and the fence at block scope (66, timing only) still 423: a refill of b
//   now waits for the slower of 16 warps in two SMs. Removed.
// - 67-69: 40 with each warp's count moved into the tile's next-to-last step (67: right after its
//   last fragment loads; 68: amid that step's mma; 69: 68 traced), the refill decision still at the
//   boundary: 471.9 / 476.5 against 40's 487.0 / 481.8 TFLOP/s at 4096^3 in the same run
//   (mma_mix: 566.5 / 571.0 against 571.3: the count's cost is its MEMBAR and ATOMS, not their
//   latency). Removed.
// - 70-73: 70 was 74 without kTrim (0.663-0.694x cuBLAS at 4096^3, mean 0.678, against 40's
//   0.638-0.707x, mean 0.666, in the same runs), 71 it traced; 72, 73: 40 and 70 with each fill
//   prefetching the tile two after it into L2 (cp.async.bulk.prefetch.tensor): 445-449 and
//   403-434 TFLOP/s. Removed.
// - 76-78: 74 with stage 0 filled alone and the other two once it had landed (76), over groups of
//   8 or 32 tile rows (77, 78): 473-481, 469-474, 473-474 TFLOP/s at 4096^3 against 74's 444-510
//   in the same run (cuBLAS 644-755 next to them): no gain above the run's noise. Removed.
// - 80-84: 74 refilling a and half of b (80, diagnostic: a pair's multicast traffic), b only
//   (81, diagnostic), a in a 64- and a 32-wide box (82), L2 fetches of 256 bytes (83), both (84):
//   at the power cap (matmul_tune.py --power) 459, 469, 459, 459, 460 TFLOP/s against 74's
//   457-458 and 79's (no refills at all) 512-525. 84's boxes and promotion are in 88. Removed.
// - 86, 87, 89, 90: 85 in clusters of 2 blocks on tile rows 2i, 2i + 1 sharing b by TMA multicast
//   (each block's producer loading its a and one half of b into both; every consumer warp
//   arriving on both blocks' empty barriers, no fence: correct), 96 deep (86) or 64 deep with 4
//   stages (87), and with 88's a boxes (90); 89: 85 64 deep with 4 stages. At the power cap 466.6,
//   467.9, 464.9, 466.2 TFLOP/s against 85's 466.4-469.8 in the same runs: the third less L2
//   traffic does not pay for a refill waiting on 16 warps in two SMs. Removed.
// - 93: 91 with 88's 96-deep k tiles and a boxes; the 216 KB ring leaving no room for a staging
//   buffer, each tile was staged in the ring (the producer claimed one stage after a tile's k
//   tiles without filling it; the storing thread handed it back once the stores had read it, and
//   a trimmed last k tile released its stage): correct on the check shapes, at the power cap 478.3
//   / 477.3 TFLOP/s against 91's 481.8 / 481.5 and 88's 472.9 / 473.4 in the same run, at a lower
//   clock (1691-1697 MHz against 1709-1712). Removed.
// - 94: 91 with a stream-K tail (the last wave's k tiles, or the last two waves' if the last is
//   under half full, shared out evenly over the SMs; partial tiles through scratch memory and
//   per-launch nonce flags to the block holding each tile's first k tiles): correct on the check
//   shapes, but at the power cap 465.8 / 465.7 TFLOP/s against 91's 490.6 / 488.9, and in the
//   timer 0.691x / 0.697x / 0.637x cuBLAS at 4096^3 / 8192^3 / 8192 x 1024 x 8192 against 91's
//   0.706x / 0.733x / 0.719x in the same run (as 42 before it). Its mma loop had lost the uniform
//   bounds of 91's (the pieces' k ranges from 64-bit divisions: WARPSYNC, S2R in the loop); again
//   with the whole tiles and the pieces in loops of their own and the ranges computed by the
//   launcher (both loops as 91's in SASS): 461.8 / 460.6 against 91's 470.7 / 470.3 at the cap,
//   0.693x / 0.705x / 0.754x against 0.717x / 0.731x / 0.718x in the timer. Removed.
// - 95-97: 91 with each consumer warp storing its own 64 x 64 piece by TMA (a 64-row box; no block
//   barrier in the epilogue, each warp waiting only for its own last store's read), and 91 over
//   groups of 8 and 32 tile rows: at the power cap 465.0 / 466.6, 463.2 / 463.5 and 464.9 / 465.0
//   TFLOP/s against 91's 467.2 / 469.8 in the same run (cuBLAS 641.8 / 646.4). Removed.
template <typename T, int kCfg>
cudaError_t launch_cfg(const GemmParams& p, cudaStream_t stream) {
  if constexpr (kCfg == 0) {
    return launch<T, 128, 3>(p, stream);
  } else if constexpr (kCfg == 1) {
    return launch<T, 256, 3>(p, stream);
  } else if constexpr (kCfg == 2) {
    return launch<T, 256, 4>(p, stream);
  } else if constexpr (kCfg == 3) {
    return launch<T, 128, 4>(p, stream);
  } else if constexpr (kCfg == 4) {
    return launch<T, 256, 3, 64>(p, stream);
  } else if constexpr (kCfg == 5) {
    return launch<T, 256, 4, 64>(p, stream);
  } else if constexpr (kCfg == 6) {  // 96 KB, 124 registers: two blocks per SM
    return launch<T, 128, 3, 64>(p, stream);
  } else if constexpr (kCfg == 7) {
    return launch<T, 256, 3, 64, true>(p, stream);
  } else if constexpr (kCfg == 8) {
    return launch<T, 128, 3, 64, true>(p, stream);
  } else if constexpr (kCfg == 9) {   // cfg 7, cross-tile fragment prefetch
    return launch<T, 256, 3, 64, true, true>(p, stream);
  } else if constexpr (kCfg == 10) {  // 32-deep, 4 stages
    return launch<T, 256, 4, 32, true, true>(p, stream);
  } else if constexpr (kCfg == 11) {  // cfg 9, 4 stages (192 KB)
    return launch<T, 256, 4, 64, true, true>(p, stream);
  } else if constexpr (kCfg == 13) {  // cfg 9, mbarriers (0.63x)
    return launch<T, 256, 3, 64, true, true, true>(p, stream);
  } else if constexpr (kCfg == 14) {  // 13, 4 stages
    return launch<T, 256, 4, 64, true, true, true>(p, stream);
  } else if constexpr (kCfg == 20) {  // TMA, the last warp to read a stage refills it (sm_90; else 9)
    return launch_tma<T, 3>(p, stream);
  } else if constexpr (kCfg == 21) {  // 20, 4 stages
    return launch_tma<T, 4>(p, stream);
  } else if constexpr (kCfg == 30) {  // 20, the tile stored by TMA
    return launch_tma<T, 3, true>(p, stream);
  } else if constexpr (kCfg == 39) {  // 40 with its timeline recorded (tuning: matmul_tune.py --trace)
    return launch_tma<T, 3, true, true, 16>(p, stream);
  } else if constexpr (kCfg == 40) {  // 30, blocks over groups of 16 tile rows (74 with 64-deep k tiles)
    return launch_tma<T, 3, true, false, 16>(p, stream);
  } else if constexpr (kCfg == 74) {  // 40, 96-deep k tiles, the last one's mma only over its data (default)
    return launch_tma<T, 3, true, false, 16, 96, true>(p, stream);
  } else if constexpr (kCfg == 75) {  // 74 traced
    return launch_tma<T, 3, true, true, 16, 96, true>(p, stream);
  } else if constexpr (kCfg == 79) {  // diagnostic (wrong results): 74 with no refills and no waits
    return launch_tma<T, 3, true, false, 16, 96, true, true>(p, stream);
  } else if constexpr (kCfg == 85) {  // 74's consumers, a producer warpgroup refilling (sm_90a)
    return launch_ws<T, 3, 96>(p, stream);
  } else if constexpr (kCfg == 88) {  // 85, a in a 64- and a 32-wide box, L2 fetches of 256 bytes
    return launch_ws<T, 3, 96, 3>(p, stream);
  } else if constexpr (kCfg == 91) {  // the warp-specialised kernel persistent (64 deep, 3 stages)
    return launch_ws<T, 3, 64, 2, true>(p, stream);
  } else if constexpr (kCfg == 98) {  // 91, odd tile-row groups walking their columns right to left
    return launch_ws<T, 3, 64, 2 | 8, true>(p, stream);
  } else if constexpr (kCfg == 99) {  // 98, odd m16 rows taking their n8 tiles in reverse (default)
    return launch_ws<T, 3, 64, 2 | 8 | 16, true>(p, stream);
  } else if constexpr (kCfg == 92) {  // 91 not persistent: 85 64 deep, L2 fetches of 256 bytes
    return launch_ws<T, 3, 64, 2>(p, stream);
  } else {
    return cudaErrorInvalidValue;
  }
}

// The default: the warp-specialised kernel where the build has sm_90a code (it falls back to the
// TMA kernel, 74, on GPUs or calls it cannot serve), else 74 (which falls back to the cp.async one).
#ifndef OPFORGE_MMA_CONFIG
#if defined(OPFORGE_HAS_SM90A) && OPFORGE_HAS_SM90A
#define OPFORGE_MMA_CONFIG 99
#else
#define OPFORGE_MMA_CONFIG 74
#endif
#endif

template <typename T>
cudaError_t launch_config(const GemmParams& p, cudaStream_t stream, int config) {
#ifdef OPFORGE_MATMUL_TUNING
  switch (config) {
#define OPFORGE_MMA_CASE(n) \
  case n: return launch_cfg<T, n>(p, stream);
    // The configurations that still exist (the others' entries in launch_cfg say what they were).
    OPFORGE_MMA_CASE(0) OPFORGE_MMA_CASE(1) OPFORGE_MMA_CASE(2) OPFORGE_MMA_CASE(3) OPFORGE_MMA_CASE(4)
    OPFORGE_MMA_CASE(5) OPFORGE_MMA_CASE(6) OPFORGE_MMA_CASE(7) OPFORGE_MMA_CASE(8) OPFORGE_MMA_CASE(9)
    OPFORGE_MMA_CASE(10) OPFORGE_MMA_CASE(11) OPFORGE_MMA_CASE(13) OPFORGE_MMA_CASE(14) OPFORGE_MMA_CASE(20)
    OPFORGE_MMA_CASE(21) OPFORGE_MMA_CASE(30) OPFORGE_MMA_CASE(39) OPFORGE_MMA_CASE(40)
    OPFORGE_MMA_CASE(74) OPFORGE_MMA_CASE(75) OPFORGE_MMA_CASE(79)
    OPFORGE_MMA_CASE(85) OPFORGE_MMA_CASE(88) OPFORGE_MMA_CASE(91) OPFORGE_MMA_CASE(92) OPFORGE_MMA_CASE(98)
    OPFORGE_MMA_CASE(99)
#undef OPFORGE_MMA_CASE
    default: return cudaErrorInvalidValue;
  }
#else
  return config == OPFORGE_MMA_CONFIG ? launch_cfg<T, OPFORGE_MMA_CONFIG>(p, stream) : cudaErrorInvalidValue;
#endif
}

}  // namespace

int matmul_mma_cuda_config(const GemmParams& p, void* stream, int config) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (config < 0) config = OPFORGE_MMA_CONFIG;
  switch (p.dtype) {
    case DType::kBFloat16: return launch_config<__nv_bfloat16>(p, s, config);
    case DType::kFloat16: return launch_config<__half>(p, s, config);
    default: return cudaErrorInvalidValue;
  }
}

int matmul_mma_cuda(const GemmParams& p, void* stream) { return matmul_mma_cuda_config(p, stream, -1); }

#ifdef OPFORGE_MATMUL_TUNING
// Copies configuration 39's timeline (the last run's) to host memory (matmul_tune.py --trace).
extern "C" int opforge_tune_mma_trace(void* dst, size_t bytes) {
  if (bytes > sizeof(g_mma_trace)) return cudaErrorInvalidValue;
  return cudaMemcpyFromSymbol(dst, g_mma_trace, bytes);
}
#endif

}  // namespace opforge
