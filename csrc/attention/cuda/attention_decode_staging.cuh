// attention CUDA decode: the key tiles of a decode block (attention_decode_kernel.cuh): its share of
// its sequence's visible 64-key tiles, a paged cache's rows looked up a tile ahead, and a tile's K and
// V rows staged by cp.async.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/attention_mask.cuh"
#include "attention/cuda/attention_softmax.cuh"
#include "attention/cuda/attention_tile.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/math.cuh"
#include "common/cuda/math_constants.h"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/vector.cuh"

namespace opforge {
namespace attention_cuda {

constexpr int kDecodeThreads = 128, kDecodeWarps = 4;

// The visible 64-key tiles [tb, te) of a sequence's queries.
__device__ __forceinline__ void decode_visible_tiles(const AttentionPattern& pat, int& tb, int& te) {
  int64_t lo, hi;
  band_key_range(pat, 0, pat.sq, lo, hi);
  tb = static_cast<int>(lo / kDecodeTile);
  te = hi <= lo ? tb : static_cast<int>((hi + kDecodeTile - 1) / kDecodeTile);
}

// This block's share [t0, t1) of its sequence's visible 64-key tiles (chunk c of chunks).
__device__ __forceinline__ void decode_chunk_tiles(const AttentionPattern& pat, int chunks, int64_t c,
                                                   int& t0, int& t1) {
  int tb, te;
  decode_visible_tiles(pat, tb, te);
  const int per = (te - tb + chunks - 1) / chunks;
  t0 = tb + static_cast<int>(c) * per, t1 = min(te, t0 + per);
}

// A decode block's work: batch row b, kv head hk, chunk c of its sequence's `chunks`; b < 0: none
// (a block past the tokens-present split's last).
struct DecodeWork {
  int64_t b = -1, hk = 0;
  int c = 0, chunks = 1;
};

// The uniform split: the grid's (chunk, kv head, batch row). The tokens-present split (s.blocks,
// kv_lens): block i is chunk-slot j = i / Hkv of kv head i % Hkv; warp 0 sums the sequences' visible
// tiles (a chunk's tiles: max(s.min_tiles, ceil(Hkv x the sum / s.target))), then scans their chunk
// counts (max(1, ceil(tiles / a chunk's))) 32 sequences at a time to find the sequence whose chunks
// hold j. Every block computes the same sums from kv_lens, so the split needs no other kernel and no
// host read (CUDA graphs replay it with the lengths updated in place); the first block of each
// sequence writes its count for the merge. Called by every thread (one __syncthreads).
__device__ __forceinline__ DecodeWork decode_block_work(const AttentionParams& p, const DecodeSplit& s) {
  DecodeWork w;
  if (s.blocks == 0) {
    w.b = blockIdx.z, w.hk = blockIdx.y, w.c = static_cast<int>(blockIdx.x), w.chunks = s.chunks;
    return w;
  }
  __shared__ int64_t found[2];  // (b, c | chunks << 32)
  const AttentionPattern& pat = p.pattern;
  const int64_t j = blockIdx.x / p.kv_heads;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const auto seq_tiles = [&](int64_t b) {
      int tb, te;
      decode_visible_tiles(pat.at_unpacked(b), tb, te);
      return static_cast<int64_t>(te - tb);
    };
    int64_t total = 0;
    for (int64_t b = lane; b < p.batch; b += 32) total += seq_tiles(b);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
    const int64_t per = max(int64_t{s.min_tiles}, (total * p.kv_heads + s.target - 1) / s.target);
    if (lane == 0) found[0] = -1;
    __syncwarp();
    int64_t before = 0;  // chunks of the sequences before this pass's 32
    for (int64_t b0 = 0; b0 < p.batch && before <= j; b0 += 32) {
      const int64_t b = b0 + lane;
      const int64_t n = b < p.batch ? max(int64_t{1}, (seq_tiles(b) + per - 1) / per) : 0;
      int64_t incl = n;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int64_t x = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += x;
      }
      incl += before;
      if (n > 0 && incl - n <= j && j < incl) found[0] = b, found[1] = (j - (incl - n)) | (n << 32);
      before = __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  __syncthreads();
  w.b = found[0];
  if (w.b < 0) return w;
  w.hk = blockIdx.x % p.kv_heads;
  w.c = static_cast<int>(found[1] & 0xffffffff), w.chunks = static_cast<int>(found[1] >> 32);
  if (threadIdx.x == 0 && w.c == 0 && w.hk == 0) s.counts[w.b] = w.chunks;
  return w;
}

// A paged cache's rows of one 64-key tile as this thread's staging loop needs them: the tile's
// rows are spread 16 to a warp (row k * (128 / C) + warp * (32 / C) + lane / C in step k of the
// loop, C = kD / 8 16-byte chunks a row), and lane l (mod 16) holds the page and slot of its warp's
// l-th row, looked up one tile ahead so that the table read is not on the staging path; the staging
// loop takes them by shuffles. Unpaged caches: nothing is read.
struct DecodePageRows {
  int32_t page = 0, slot = 0;
};

template <int kD>
__device__ __forceinline__ DecodePageRows fetch_decode_page_rows(const AttentionParams& p, int64_t b,
                                                                 int tile, int64_t sk) {
  DecodePageRows r;
  constexpr int kC = kD / 8, kWarpRows = 32 / kC, kStepRows = kDecodeThreads / kC;
  static_assert(kC <= 32 && kDecodeTile * kC / kDecodeThreads * kWarpRows == 16);
  const int64_t j0 = int64_t{tile} * kDecodeTile;
  if (!p.block_table || j0 >= sk) return r;
  const int l = threadIdx.x % 16, warp = threadIdx.x / 32;
  const int64_t j = j0 + (l / kWarpRows) * kStepRows + warp * kWarpRows + l % kWarpRows;
  int64_t slot;
  r.page = static_cast<int32_t>(p.kv_page(b, j < sk ? j : j0, slot));
  r.slot = static_cast<int32_t>(slot);
  return r;
}

// Classifies tile `tile` for the block's queries and, unless nothing in it is visible, stages its K
// and V rows (Tr::kRowBytes apart, V Tr::kTileBytes after K) into stage `stage` of `stages`, with the
// L2::128B prefetch hint (a decode step reads its keys and values once: 0-3 % on the H200, LOG.md
// "Serving (issue 47), session 5"); one commit group either way. kbase / vbase: the kv head's (no batch
// offset: the batch row, or the page of a paged cache, is added here). pages: the tile's rows of a paged
// cache (fetch_decode_page_rows).
template <typename Tr, typename T>
__device__ __forceinline__ BlockKind stage_decode_tile(const AttentionParams& p, const AttentionPattern& pat,
                                                       int64_t b, int64_t hk, int64_t group,
                                                       SegmentRange q_range, const T* kbase, const T* vbase,
                                                       unsigned char* stages, int stage, int tile,
                                                       DecodePageRows pages) {
  constexpr int kD = Tr::kD;
  const int64_t j0 = int64_t{tile} * kDecodeTile, j1 = min(j0 + kDecodeTile, pat.sk);
  const BlockKind kind = group_tile_kind<kDecodeTile>(pat, b, hk * group, group, j0, j1, q_range);
  if (kind != BlockKind::kEmpty) {
    unsigned char* sk = stages + stage * 2 * Tr::kTileBytes;
    unsigned char* sv = sk + Tr::kTileBytes;
    if (!p.block_table) {
      const T* kb = kbase + b * p.k_bs;
      const T* vb = vbase + b * p.v_bs;
      for (int idx = threadIdx.x; idx < kDecodeTile * (kD / 8); idx += kDecodeThreads) {
        const int row = idx / (kD / 8), chunk = idx % (kD / 8);
        const int64_t j = j0 + row;
        const bool in = j < j1;
        const int64_t jj = in ? j : j0;
        cuda::cp_async16_l2_128(sk + row * Tr::kRowBytes + chunk * 16, kb + jj * p.k_ss + chunk * 8,
                                in ? 16 : 0);
        cuda::cp_async16_l2_128(sv + row * Tr::kRowBytes + chunk * 16, vb + jj * p.v_ss + chunk * 8,
                                in ? 16 : 0);
      }
    } else {  // (a paged cache: the rows' pages and slots from the lanes that looked them up)
      constexpr int kC = kD / 8, kWarpRows = 32 / kC;
      const int lane = threadIdx.x % 32, chunk = lane % kC;
#pragma unroll
      for (int step = 0; step < kDecodeTile * kC / kDecodeThreads; ++step) {
        const int row = (step * kDecodeThreads + threadIdx.x) / kC, src = step * kWarpRows + lane / kC;
        const int64_t page = __shfl_sync(0xffffffffu, pages.page, src);
        const int64_t slot = __shfl_sync(0xffffffffu, pages.slot, src);
        const int n = j0 + row < j1 ? 16 : 0;
        cuda::cp_async16_l2_128(sk + row * Tr::kRowBytes + chunk * 16,
                                kbase + page * p.k_bs + slot * p.k_ss + chunk * 8, n);
        cuda::cp_async16_l2_128(sv + row * Tr::kRowBytes + chunk * 16,
                                vbase + page * p.v_bs + slot * p.v_ss + chunk * 8, n);
      }
    }
  }
  cuda::cp_async_commit();
  return kind;
}

}  // namespace attention_cuda
}  // namespace opforge
