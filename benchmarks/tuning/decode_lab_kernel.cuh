// Tuning only (benchmarks/tuning/decode_lab.py builds it with torch's JIT; not part of the product):
// the tensor-core decode kernel of branch wip/decode-ws (paged rows, a one-chunk block writing the
// output itself, the merge as a programmatic dependent) with its choices as parameters: K/V stages,
// keys a tile (64 or 128: 64-key sub-tiles), the direct write and the programmatic launch on or off;
// to find which of them made that branch slower than main (LOG.md "Serving (issue 32)"). A modified
// copy of the shipped kernel by design (the variant under test); deleted once the question is settled.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/attention_mma_common.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/math.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/vector.cuh"

namespace opforge {
namespace decode_lab {

constexpr int kDecodeThreads = 128, kDecodeWarps = 4;
using attention_cuda::block_segment_range;
using attention_cuda::kNegInf;

struct LabSplit : DecodeSplit {
  bool direct = true;        // a block that is its rows' only chunk writes the output and LSE
  bool programmatic = true;  // the merge launched as a programmatic dependent
};

__device__ __forceinline__ void lab_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void lab_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// What the tile [j0, j1) holds for the block's queries (every row of the group: the band and the
// segments are the same for all heads; a block mask counts as visible where any head sees it).
__device__ __forceinline__ BlockKind decode_tile_kind(const AttentionPattern& pat, int64_t b, int64_t h0,
                                                      int64_t group, int64_t j0, int64_t j1, SegmentRange q_range, int tile_keys) {
  BlockKind kind = band_prefix_tile_kind(pat, 0, pat.sq, j0, j1);
  if (kind == BlockKind::kEmpty) return kind;
  if (pat.q_segments) {
    kind = combine(kind, segment_tile_kind(q_range, block_segment_range(pat.kv_seg_blocks, pat.kv_seg_nblocks, b, j0, j1)));
  }
  if (pat.mask_kinds && kind != BlockKind::kEmpty) {
    bool any = false, all = true;
    for (int64_t g = 0; g < (pat.mask_h == 1 ? 1 : group); ++g) {
      const BlockKind km = mask_tile_kind(pat, b, h0 + g, 0, pat.sq, j0, j1);
      any = any || km != BlockKind::kEmpty;
      all = all && km == BlockKind::kFull;
    }
    kind = combine(kind, !any ? BlockKind::kEmpty : all ? BlockKind::kFull : BlockKind::kPartial);
  }
  if (kind == BlockKind::kFull && j1 - j0 < tile_keys) kind = BlockKind::kPartial;  // the ragged last tile
  return kind;
}

// This block's share [t0, t1) of its sequence's visible 64-key tiles (chunk c of s.chunks).
__device__ __forceinline__ void decode_chunk_tiles(const AttentionPattern& pat, int chunks, int64_t c, int& t0, int& t1, int kDecodeTile) {
  int64_t lo, hi;
  band_key_range(pat, 0, pat.sq, lo, hi);
  const int tb = static_cast<int>(lo / kDecodeTile);
  const int te = hi <= lo ? tb : static_cast<int>((hi + kDecodeTile - 1) / kDecodeTile);
  const int per = (te - tb + chunks - 1) / chunks;
  t0 = tb + static_cast<int>(c) * per, t1 = min(te, t0 + per);
}

// Classifies tile `tile` for the block's queries and, unless nothing in it is visible, stages its K
// and V rows (Tr::kRowBytes apart, V Tr::kTileBytes after K) into stage `stage` of `stages`; one
// commit group either way. kbase / vbase: the kv head's (rows at kv_row: paged or not).
template <typename Tr, typename T>
__device__ __forceinline__ BlockKind stage_decode_tile(const AttentionParams& p, const AttentionPattern& pat, int64_t b,
                                                       int64_t hk, int64_t group, SegmentRange q_range, const T* kbase,
                                                       const T* vbase, unsigned char* stages, int stage,
                                                       int tile) {
  constexpr int kD = Tr::kD;
  const int64_t j0 = int64_t{tile} * Tr::kTile, j1 = min(j0 + Tr::kTile, pat.sk);
  const BlockKind kind = decode_tile_kind(pat, b, hk * group, group, j0, j1, q_range, Tr::kTile);
  if (kind != BlockKind::kEmpty) {
    unsigned char* sk = stages + stage * 2 * Tr::kTileBytes;
    unsigned char* sv = sk + Tr::kTileBytes;
    for (int idx = threadIdx.x; idx < Tr::kTile * (kD / 8); idx += kDecodeThreads) {
      const int row = idx / (kD / 8), chunk = idx % (kD / 8);
      const int64_t j = j0 + row;
      const bool in = j < j1;
      const int64_t jj = in ? j : j0;
      int64_t slot;
      const int64_t page = p.kv_page(b, jj, slot);
      cuda::cp_async16(sk + row * Tr::kRowBytes + chunk * 16, kbase + page * p.k_bs + slot * p.k_ss + chunk * 8,
                       in ? 16 : 0);
      cuda::cp_async16(sv + row * Tr::kRowBytes + chunk * 16, vbase + page * p.v_bs + slot * p.v_ss + chunk * 8,
                       in ? 16 : 0);
    }
  }
  cuda::cp_async_commit();
  return kind;
}

// The tensor-core decode kernel, for up to 16 query rows (GQA groups up to 16 at Sq = 1): the rows
// are one m16 tile (padded with zeros), warp w takes keys [16 w, 16 w + 16) of every staged tile
// (S = Q K^T and O += P V by mma.sync, P reused from the accumulators) and keeps its own softmax
// state; the four are combined in shared memory into the block's one state, written as a partial
// state for the merge, or as the output and LSE when the block is its rows' only chunk. K and V rows
// are addressed through the page table when the cache is paged (stage_decode_tile).
// kStages: K/V tiles staged at once (kStages - 1 in flight while one is computed). Two: three
// blocks an SM at head dims up to 128; three (two blocks an SM) measured slower (LOG.md).
template <int kD_, int kStages_, int kTile_>
struct LabTraits {
  static constexpr int kD = kD_;
  static constexpr int kTile = kTile_;
  static constexpr int kRows = 16;
  static constexpr int kStages = kStages_;
  static constexpr int kRowBytes = kD_ * 2 + 16;  // staged K / V rows padded: ldmatrix rows in distinct banks
  static constexpr int kTileBytes = kTile_ * kRowBytes;
  static constexpr int smem_bytes() { return kRows * kRowBytes + kStages * 2 * kTileBytes; }
  // (the stages hold warps 1-3's states for the in-block combine after the last tile)
  static_assert((kDecodeWarps - 1) * (kD_ / 8 + 1) * 32 * 16 <= kStages * 2 * kTileBytes);
};

template <typename Tr, typename T>
__global__ void __launch_bounds__(kDecodeThreads) lab_decode_kernel(const AttentionCudaArgs a, const LabSplit s) {
  constexpr int kD = Tr::kD, kSteps = kD / 16, kNd = kD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionParams& p = a.g.fwd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, hk = blockIdx.y, c = blockIdx.x;
  const AttentionPattern pat = p.pattern.at(b);
  const int64_t group = p.heads / p.kv_heads, sq = pat.sq;
  const int rows = s.rows;
  unsigned char* sq_rows = smem;
  unsigned char* stages = smem + Tr::kRows * Tr::kRowBytes;

  // The rows (row r: head hk * group + r / sq, query r % sq), zeros past `rows`.
  for (int idx = threadIdx.x; idx < Tr::kRows * (kD / 8); idx += kDecodeThreads) {
    const int r = idx / (kD / 8), chunk = idx % (kD / 8);
    const bool in = r < rows;
    const int64_t h = hk * group + (in ? r / sq : 0), i = in ? r % sq : 0;
    cuda::cp_async16(sq_rows + r * Tr::kRowBytes + chunk * 16,
                     static_cast<const T*>(p.q) + b * p.q_bs + h * p.q_hs + i * p.q_ss + chunk * 8, in ? 16 : 0);
  }
  cuda::cp_async_commit();

  int t0, t1;
  decode_chunk_tiles(pat, s.chunks, c, t0, t1, Tr::kTile);
  const SegmentRange q_range =
      pat.q_segments ? block_segment_range(pat.q_seg_blocks, pat.q_seg_nblocks, b, 0, sq) : SegmentRange{};

  const T* kbase = static_cast<const T*>(p.k) + hk * p.k_hs;
  const T* vbase = static_cast<const T*>(p.v) + hk * p.v_hs;
  const auto load_tile = [&](int tile, int stage) {
    return stage_decode_tile<Tr>(p, pat, b, hk, group, q_range, kbase, vbase, stages, stage, tile);
  };

  // Rows g and g + 8 of the tile: their heads and queries (for element tests), -1 for padding rows.
  int64_t row_h[2], row_i[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    row_h[half] = r < rows ? hk * group + r / sq : -1;
    row_i[half] = r < rows ? r % sq : 0;
  }
  uint32_t qa[kSteps][4];
  float o[kNd][4] = {}, m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
  const float scale = a.scale, cap = a.cap_log2 != 0.f ? a.cap_log2 / 1.4426950408889634f : 0.f;

  // The kinds of the staged tiles, two bits a stage (a register, not an indexed array).
  uint32_t kinds = 0;
#pragma unroll
  for (int st = 0; st < Tr::kStages - 1; ++st) {
    if (t0 + st < t1) {
      kinds |= static_cast<uint32_t>(load_tile(t0 + st, st)) << (2 * st);
    } else {
      cuda::cp_async_commit();  // (an empty group: the waits count groups)
    }
  }
  for (int tile = t0, it = 0; tile < t1; ++tile, ++it) {
    const int stage = it % Tr::kStages;
    const int ahead = tile + Tr::kStages - 1, ahead_stage = (it + Tr::kStages - 1) % Tr::kStages;
    if (ahead < t1) {
      kinds = (kinds & ~(3u << (2 * ahead_stage))) |
              (static_cast<uint32_t>(load_tile(ahead, ahead_stage)) << (2 * ahead_stage));
    } else {
      cuda::cp_async_commit();
    }
    cuda::cp_async_wait<Tr::kStages - 1>();  // this tile (and the rows) landed
    __syncthreads();
    const BlockKind kind = static_cast<BlockKind>((kinds >> (2 * stage)) & 3u);
    if (it == 0) {  // the rows' A fragments, kept for every tile
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        const int r = (lane % 8) + 8 * ((lane / 8) % 2), col = kk * 16 + 8 * (lane / 16);
        cuda::ldmatrix_x4(qa[kk], sq_rows + r * Tr::kRowBytes + col * 2);
      }
    }
    const unsigned char* sk = stages + stage * 2 * Tr::kTileBytes;
    const unsigned char* sv = sk + Tr::kTileBytes;
    const int64_t j0 = int64_t{tile} * Tr::kTile, j1 = min(j0 + Tr::kTile, pat.sk);
    if (kind != BlockKind::kEmpty) {
#pragma unroll
    for (int sub = 0; sub < Tr::kTile / 64; ++sub) {  // (lab: 64-key sub-tiles of a larger tile)
      const int kw = sub * 64 + 16 * warp;
      // S (16 rows x this warp's 16 keys): two n-tiles of 8 keys.
      float sc[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        uint32_t kb[4];
        const int key = kw + (lane % 8) + 8 * (lane / 16), col = kk * 16 + 8 * ((lane / 8) % 2);
        cuda::ldmatrix_x4(kb, sk + key * Tr::kRowBytes + col * 2);
        cuda::mma_m16n8k16<T>(sc[0], qa[kk], kb);
        cuda::mma_m16n8k16<T>(sc[1], qa[kk], kb + 2);
      }
      // Scale, softcap, the element tests; the rows' running max (over the quad of a row).
      float mx[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e / 2;
          const int64_t j = j0 + kw + 8 * n + 2 * t + (e % 2);
          float x = sc[n][e] * scale;
          if (cap != 0.f) x = cap * cuda::fast_tanh(x / cap);
          if (row_h[half] < 0 ||
              (kind == BlockKind::kPartial && (j >= j1 || !pat.visible(b, row_h[half], row_i[half], j)))) {
            x = kNegInf;
          }
          sc[n][e] = x;
          mx[half] = fmaxf(mx[half], x);
        }
      }
      uint32_t pa[4];
      float alpha[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
        mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
        const float m_new = fmaxf(m[half], mx[half]);
        // (a row with nothing visible yet keeps m = -inf: its p are 0, alpha 1)
        alpha[half] = m_new == kNegInf ? 1.f : __expf(m[half] - m_new);
        m[half] = m_new;
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e / 2;
          sc[n][e] = m[half] == kNegInf ? 0.f : __expf(sc[n][e] - m[half]);
          l[half] = (e % 2 == 0 && n == 0 ? l[half] * alpha[half] : l[half]) + sc[n][e];
        }
      }
      // P as the A operand (16 rows x 16 keys): pairs of the accumulators.
      pa[0] = cuda::pack2<T>(sc[0][0], sc[0][1]);
      pa[1] = cuda::pack2<T>(sc[0][2], sc[0][3]);
      pa[2] = cuda::pack2<T>(sc[1][0], sc[1][1]);
      pa[3] = cuda::pack2<T>(sc[1][2], sc[1][3]);
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd) {
        o[nd][0] *= alpha[0], o[nd][1] *= alpha[0], o[nd][2] *= alpha[1], o[nd][3] *= alpha[1];
      }
      // O += P V: V (this warp's 16 keys x kD), two 8-column n-tiles per transposed ldmatrix.
#pragma unroll
      for (int nd = 0; nd < kNd; nd += 2) {
        uint32_t vb[4];
        const int key = kw + (lane % 8) + 8 * ((lane / 8) % 2), col = 8 * (nd + lane / 16);
        cuda::ldmatrix_x4_trans(vb, sv + key * Tr::kRowBytes + col * 2);
        cuda::mma_m16n8k16<T>(o[nd], pa, vb);
        cuda::mma_m16n8k16<T>(o[nd + 1], pa, vb + 2);
      }
    }
    }
    __syncthreads();  // (the stage is refilled next)
  }

  // The four warps' states combined (warps 1-3 hand theirs to warp 0 through the idle stages, each
  // lane's fragments side by side), then written as this block's partial state of rows g, g + 8.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }
  cuda::cp_async_wait<0>();  // (no copy is left in flight where the states go)
  float4* handoff = reinterpret_cast<float4*>(stages);  // [warp 1-3][kNd + 1][32 lanes]
  if (warp > 0) {
    float4* mine = handoff + (warp - 1) * (kNd + 1) * 32 + lane;
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd) mine[nd * 32] = make_float4(o[nd][0], o[nd][1], o[nd][2], o[nd][3]);
    mine[kNd * 32] = make_float4(m[0], m[1], l[0], l[1]);
  }
  __syncthreads();
  if (warp > 0) return;
  float f[kDecodeWarps][2];  // each warp's weight, per half
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mw[kDecodeWarps], mx = m[half];
    mw[0] = m[half];
#pragma unroll
    for (int w = 1; w < kDecodeWarps; ++w) {
      const float4 ml = handoff[((w - 1) * (kNd + 1) + kNd) * 32 + lane];
      mw[w] = half == 0 ? ml.x : ml.y;
      mx = fmaxf(mx, mw[w]);
    }
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      f[w][half] = mw[w] == kNegInf ? 0.f : __expf(mw[w] - mx);
      const float lw = w == 0 ? l[half] : [&] {
        const float4 ml = handoff[((w - 1) * (kNd + 1) + kNd) * 32 + lane];
        return half == 0 ? ml.z : ml.w;
      }();
      sum += f[w][half] * lw;
    }
    m[half] = mx, l[half] = sum;
  }
#pragma unroll
  for (int nd = 0; nd < kNd; ++nd) {
    o[nd][0] *= f[0][0], o[nd][1] *= f[0][0], o[nd][2] *= f[0][1], o[nd][3] *= f[0][1];
#pragma unroll
    for (int w = 1; w < kDecodeWarps; ++w) {
      const float4 x = handoff[((w - 1) * (kNd + 1) + nd) * 32 + lane];
      o[nd][0] += f[w][0] * x.x, o[nd][1] += f[w][0] * x.y, o[nd][2] += f[w][1] * x.z, o[nd][3] += f[w][1] * x.w;
    }
  }
  const int64_t task = (b * p.kv_heads + hk) * s.chunks + c;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    if (r >= rows) continue;
    if (s.chunks == 1 && s.direct) {  // the rows' only chunk: the output and the LSE
      const int64_t h = hk * group + r / sq, i = r % sq;
      const float inv = l[half] > 0.f ? 1.f / l[half] : 0.f;
      T* out = static_cast<T*>(p.out) + b * p.o_bs + h * p.o_hs + i * p.o_ss;
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd) {
        cuda::store_pair<T>(out + 8 * nd + 2 * t, o[nd][2 * half] * inv, o[nd][2 * half + 1] * inv, true);
      }
      if (t == 0) {
        static_cast<float*>(p.lse)[(b * p.heads + h) * sq + i] = l[half] > 0.f ? m[half] + __logf(l[half]) : kNegInf;
      }
      continue;
    }
    float* out = s.part + (task * rows + r) * decode_part_stride(kD);
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd) {
      *reinterpret_cast<float2*>(out + 8 * nd + 2 * t) = make_float2(o[nd][2 * half], o[nd][2 * half + 1]);
    }
    if (t == 0) out[kD] = m[half], out[kD + 1] = l[half];
  }
  lab_launch_dependents();  // (the merge may start once every block is here or gone)
}

// One block a query row: the chunks' partial states merged into the output and the LSE. Every warp
// finds the max and the weighted sum over all parts (lanes over parts, reductions in a fixed order);
// warp w sums the outputs of parts w, w + 4, ..., and the four sums are added in warp order
// (deterministic). Lane l owns output columns l * kD / 32 onwards.
constexpr int kMergeThreads = 128;

template <int kD, typename T>
__global__ void __launch_bounds__(kMergeThreads) lab_merge_kernel(const AttentionCudaArgs a, const LabSplit s) {
  constexpr int kCols = kD / 32, kWarps = kMergeThreads / 32;
  __shared__ float partial[kWarps - 1][kD];
  const AttentionParams& p = a.g.fwd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  lab_grid_dependency_wait();  // (launched as the decode kernel's programmatic dependent)
  const int64_t row = blockIdx.x;  // (b, hk, r)
  const int64_t r = row % s.rows, bh = row / s.rows, hk = bh % p.kv_heads, b = bh / p.kv_heads;
  const int64_t group = p.heads / p.kv_heads, sq = p.pattern.sq, h = hk * group + r / sq, i = r % sq;
  const int parts = s.chunks;
  const float* first = s.part + (bh * parts * s.rows + r) * decode_part_stride(kD);
  const int64_t step = int64_t{s.rows} * decode_part_stride(kD);  // from one chunk's state to the next
  float mx = kNegInf;
  for (int c = lane; c < parts; c += 32) mx = fmaxf(mx, first[c * step + kD]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float acc[kCols] = {}, sum = 0.f;
  if (mx != kNegInf) {
    for (int c = lane; c < parts; c += 32) {
      const float mc = first[c * step + kD];
      if (mc != kNegInf) sum += __expf(mc - mx) * first[c * step + kD + 1];
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
#pragma unroll 4
    for (int c = warp; c < parts; c += kWarps) {
      const float* part = first + c * step;
      const float mc = part[kD];
      const float w = mc == kNegInf ? 0.f : __expf(mc - mx);
      constexpr int kVec = kCols < 4 ? kCols : 4;  // (16-byte loads at most: the states' rows are 16-byte aligned)
#pragma unroll
      for (int e0 = 0; e0 < kCols; e0 += kVec) {
        const auto x = *reinterpret_cast<const cuda::Pack<float, kVec>*>(part + lane * kCols + e0);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e0 + e] += w * x.v[e];
      }
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int e = 0; e < kCols; ++e) partial[warp - 1][lane * kCols + e] = acc[e];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w) {
#pragma unroll
    for (int e = 0; e < kCols; ++e) acc[e] += partial[w][lane * kCols + e];
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  T* out = static_cast<T*>(p.out) + b * p.o_bs + h * p.o_hs + i * p.o_ss + lane * kCols;
#pragma unroll
  for (int e = 0; e < kCols; e += 2) cuda::store_pair<T>(out + e, acc[e] * inv, acc[e + 1] * inv, true);
  if (lane == 0) {
    float* lse = static_cast<float*>(p.lse) + (b * p.heads + h) * sq + i;
    *lse = sum > 0.f ? mx + __logf(sum) : kNegInf;
  }
}


template <typename Tr, typename T>
cudaError_t lab_launch(const AttentionCudaArgs& a, const LabSplit& s, cudaStream_t stream) {
  const AttentionParams& p = a.g.fwd;
  cudaError_t err = cudaFuncSetAttribute(lab_decode_kernel<Tr, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Tr::smem_bytes());
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(s.chunks), static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.batch));
  lab_decode_kernel<Tr, T><<<grid, kDecodeThreads, Tr::smem_bytes(), stream>>>(a, s);
  err = cudaGetLastError();
  if (err != cudaSuccess || (s.chunks == 1 && s.direct)) return err;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(p.batch * p.kv_heads * s.rows));
  config.blockDim = dim3(kMergeThreads);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = s.programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, lab_merge_kernel<Tr::kD, T>, a, s);
}

template <typename Tr>
int lab_blocks_per_sm() {
  if (cudaFuncSetAttribute(lab_decode_kernel<Tr, __nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           Tr::smem_bytes()) != cudaSuccess) {
    return 0;
  }
  int blocks = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, lab_decode_kernel<Tr, __nv_bfloat16>, kDecodeThreads,
                                                Tr::smem_bytes());
  return blocks;
}

}  // namespace decode_lab
}  // namespace opforge
