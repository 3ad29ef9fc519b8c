// attention CUDA: a block's walk over the tiles its pattern leaves visible, the same decisions in
// every warp: a query block over key tiles (KeyWalk: the forwards, the dQ pass) and a key block
// over the query tiles of each of its heads (QueryWalk: the backward's dK/dV passes), 32 tiles
// classified at a time (TileChunk, one a lane) and a block mask's empty stretches skipped
// (next_mask_block). KeyWalk also copies a tile's K and V rows for the mma.sync kernels (paged
// caches through their table).

#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/attention_mask.cuh"
#include "attention/cuda/attention_tile.cuh"
#include "common/cuda/cp_async.cuh"

namespace opforge {
namespace attention_cuda {

// 32 consecutive tiles classified at once, one a lane (one round of loads instead of 32), kept as
// bit masks: which have something visible, which are partial, and which parts of the pattern a
// partial one must test.
struct TileChunk {
  int first = -1;  // the chunk's first tile (-1: none yet)
  int64_t head = -1;
  uint32_t visible = 0, partial = 0, band = 0, seg = 0, mask = 0;

  __device__ __forceinline__ void set(int base, int64_t h, const TileClass& c) {
    first = base;
    head = h;
    visible = __ballot_sync(0xffffffffu, c.kind != BlockKind::kEmpty);
    partial = __ballot_sync(0xffffffffu, c.kind == BlockKind::kPartial);
    band = __ballot_sync(0xffffffffu, c.band);
    seg = __ballot_sync(0xffffffffu, c.seg);
    mask = __ballot_sync(0xffffffffu, c.mask);
  }
  // The first visible tile at or after `from` in this chunk (its class in tc), or -1.
  __device__ __forceinline__ int find(int from, TileClass& tc) const {
    const uint32_t m = visible & (0xffffffffu << (from - first));
    if (!m) return -1;
    const int bit = __ffs(m) - 1;
    tc.kind = (partial >> bit) & 1u ? BlockKind::kPartial : BlockKind::kFull;
    tc.band = (band >> bit) & 1u;
    tc.seg = (seg >> bit) & 1u;
    tc.mask = (mask >> bit) & 1u;
    return first + bit;
  }
};

// The first block at or after `from` of a block mask's row or column of n blocks (kinds `stride`
// bytes apart) that is not empty (kind full or partial), or n: the warp's lanes read kPerLane kinds
// each, 32 kPerLane blocks a round (one memory latency), so that a sparse mask's walk skips its empty
// stretches (a long row of a sliding or dilated block pattern) instead of classifying them 32 tiles at a
// time.
template <int kPerLane = 16>
__device__ __forceinline__ int next_mask_block(const uint8_t* kinds, int64_t stride, int from, int n,
                                               int lane) {
  for (int base = from; base < n; base += 32 * kPerLane) {
    uint32_t seen = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int i = base + lane * kPerLane + k;
      if (i < n) {
        const uint8_t kind = kinds[i * stride];
        seen |= static_cast<uint32_t>(kind == 1 || kind == 2) << k;
      }
    }
    const uint32_t lanes = __ballot_sync(0xffffffffu, seen != 0);
    if (lanes) {
      const int first = __ffs(lanes) - 1;
      return base + first * kPerLane + __ffs(__shfl_sync(0xffffffffu, seen, first)) - 1;
    }
  }
  return n;
}

// A query block [i0, i1) of (b, h) walking the key tiles (kBlockN keys) it sees: the next one
// with something visible (every warp finds the same, classifying 32 tiles at a time), and the copy
// of a tile's K and V rows into a stage (K, then V kBlockN * kD values after it). pat: batch row
// b's pattern (p.pattern.at(b)). kSkipMask (the block-mask forms): where the block's queries lie in
// one row of mask blocks and more than one chunk of tiles is left, the walk jumps over that row's
// empty blocks (next_mask_block) before it classifies the next 32 tiles.
template <int kBlockN, int kD, int kThreads, typename T, bool kSkipMask = false>
struct KeyWalk {
  const AttentionPattern& pat;
  int64_t b, h, i0, i1;
  const T* k;
  const T* v;
  int64_t k_ss, v_ss;
  SegmentRange q_range;  // the block's query segment ids
  int begin = 0, end = 0;
  TileChunk chunk;
  const uint8_t* mask_row = nullptr;  // (kSkipMask) the kinds of the block's row of mask blocks

  const AttentionParams& prm;

  __device__ KeyWalk(const AttentionParams& p, const AttentionPattern& pat_, int64_t b_, int64_t h_,
                     int64_t i0_, int64_t i1_)
      : pat(pat_), b(b_), h(h_), i0(i0_), i1(i1_), k_ss(p.k_ss), v_ss(p.v_ss), prm(p) {
    const int64_t hk = h / (p.heads / p.kv_heads);
    // (a paged cache: the kv head's column; each row's page comes from the table, rows_of)
    k = static_cast<const T*>(p.k) + (p.block_table ? hk * p.k_hs : p.k_at(b, hk));
    v = static_cast<const T*>(p.v) + (p.block_table ? hk * p.v_hs : p.v_at(b, hk));
    if (pat.q_segments) q_range = block_segment_range(pat.q_seg_blocks, pat.q_seg_nblocks, b, i0, i1);
    key_tiles<kBlockN>(pat, i0, i1, begin, end);
    if (kSkipMask && pat.mask_kinds && i0 < i1 && i0 / pat.block_q == (i1 - 1) / pat.block_q) {
      mask_row = pat.mask_kinds + pat.mask_block(b, h, i0 / pat.block_q, 0);
    }
  }

  __device__ int next(int from, TileClass& tc, int lane) {
    while (from < end) {
      if (chunk.first < 0 || from < chunk.first || from >= chunk.first + 32) {
        if (kSkipMask && mask_row &&
            end - from > 32) {  // past the row's empty mask blocks (more than a chunk left)
          const int nk = static_cast<int>(pat.mask_nk);
          const int blk =
              next_mask_block(mask_row, 1, static_cast<int>(int64_t{from} * kBlockN / pat.block_k), nk, lane);
          if (blk >= nk) break;
          from = max(from, static_cast<int>(int64_t{blk} * pat.block_k / kBlockN));
          if (from >= end) break;
        }
        const int t = from + lane;
        TileClass c;
        if (t < end) {
          const int64_t j0 = int64_t{t} * kBlockN, j1 = min(j0 + kBlockN, pat.sk);
          const SegmentRange kr = pat.q_segments
                                      ? block_segment_range(pat.kv_seg_blocks, pat.kv_seg_nblocks, b, j0, j1)
                                      : SegmentRange{};
          c = classify(pat, b, h, i0, i1, j0, j1, q_range, kr, j1 - j0 < kBlockN);
        }
        chunk.set(from, h, c);
      }
      const int found = chunk.find(from, tc);
      if (found >= 0) return found;
      from = chunk.first + 32;
    }
    return end;
  }

  __device__ void load(uint32_t stage, int tile, int tid) const {
    load_rows<kBlockN, kD, kThreads>(stage, k, k_ss, int64_t{tile} * kBlockN, pat.sk, tid);
    load_rows<kBlockN, kD, kThreads>(stage + kBlockN * kD * 2, v, v_ss, int64_t{tile} * kBlockN, pat.sk, tid);
    cuda::cp_async_commit();
  }

  // A paged cache's rows of tile `tile` that thread tid copies (rows tid / C + n kThreads / C of the
  // tile, C = kD / 8 chunks a row): their pages and slots, looked up ahead of load() so that the
  // table reads are off the copy path. Unpaged caches (or no such tile): nothing is read.
  struct PageRows {
    static constexpr int kChunks = kD / 8, kPer = kBlockN * kChunks / kThreads;
    static_assert(kThreads % kChunks == 0, "a thread's chunks are one column of rows");
    int32_t page[kPer], slot[kPer];
  };
  __device__ PageRows rows_of(int tile, int tid) const {
    PageRows r;
    if (!prm.block_table || tile >= end) return r;
    const int64_t j0 = int64_t{tile} * kBlockN;  // (< pat.sk: the walk's tiles hold keys)
#pragma unroll
    for (int n = 0; n < PageRows::kPer; ++n) {
      const int64_t j = j0 + tid / PageRows::kChunks + n * (kThreads / PageRows::kChunks);
      int64_t slot;
      r.page[n] = static_cast<int32_t>(prm.kv_page(b, j < pat.sk ? j : j0, slot));
      r.slot[n] = static_cast<int32_t>(slot);
    }
    return r;
  }
  // load(), for either cache: a paged one's rows at the pages rows_of(tile) found.
  __device__ void load(uint32_t stage, int tile, int tid, const PageRows& rows) const {
    if (!prm.block_table) return load(stage, tile, tid);
    constexpr int kChunks = PageRows::kChunks;
    const int c = tid % kChunks;
    const int64_t j0 = int64_t{tile} * kBlockN;
#pragma unroll
    for (int n = 0; n < PageRows::kPer; ++n) {
      const int r = tid / kChunks + n * (kThreads / kChunks);
      const int bytes = j0 + r < pat.sk ? 16 : 0;
      const int64_t page = rows.page[n], slot = rows.slot[n];
      cuda::cp_async16(stage + tile_offset<kD>(r, c), k + page * prm.k_bs + slot * k_ss + c * 8, bytes);
      cuda::cp_async16(stage + kBlockN * kD * 2 + tile_offset<kD>(r, c),
                       v + page * prm.v_bs + slot * v_ss + c * 8, bytes);
    }
    cuda::cp_async_commit();
  }
};

// A key block [j0, j1) of batch row b walking, for one query head h at a time, the query tiles
// (kBlockM queries) that see it: the next one with something visible (every warp finds the same,
// 32 tiles classified at a time).
// ragged: the block has fewer keys than the kernel's block, so every tile is partial (its rows past
// the last key must be masked: the one-pass backward's dQ sums over every row of the block).
// kSkipMask (the block-mask forms): where the block's keys lie in one column of mask blocks and more
// than one chunk of tiles is left, the walk jumps over that column's empty blocks (next_mask_block)
// before it classifies the next 32 tiles.
template <int kBlockM, bool kSkipMask = false>
struct QueryWalk {
  const AttentionPattern& pat;
  int64_t b, j0, j1;
  bool ragged;
  SegmentRange kv_range;  // the block's key segment ids
  int begin = 0, end = 0;
  TileChunk chunk;
  int mask_col = -1;  // (kSkipMask) the block's column of mask blocks, or -1

  __device__ QueryWalk(const AttentionPattern& p, int64_t b_, int64_t j0_, int64_t j1_, bool ragged_)
      : pat(p), b(b_), j0(j0_), j1(j1_), ragged(ragged_) {
    if (pat.q_segments) kv_range = block_segment_range(pat.kv_seg_blocks, pat.kv_seg_nblocks, b, j0, j1);
    query_tiles<kBlockM>(pat, j0, j1, begin, end);
    if (kSkipMask && pat.mask_kinds && j0 < j1 && j0 / pat.block_k == (j1 - 1) / pat.block_k) {
      mask_col = static_cast<int>(j0 / pat.block_k);
    }
  }

  __device__ int next(int64_t h, int from, TileClass& tc, int lane) {
    while (from < end) {
      if (chunk.first < 0 || chunk.head != h || from < chunk.first || from >= chunk.first + 32) {
        if (kSkipMask && mask_col >= 0 &&
            end - from > 32) {  // past the column's empty mask blocks (more than a chunk left)
          const int nq = static_cast<int>(pat.mask_nq);
          const int blk = next_mask_block(pat.mask_kinds + pat.mask_block(b, h, 0, mask_col), pat.mask_nk,
                                          static_cast<int>(int64_t{from} * kBlockM / pat.block_q), nq, lane);
          if (blk >= nq) break;
          from = max(from, static_cast<int>(int64_t{blk} * pat.block_q / kBlockM));
          if (from >= end) break;
        }
        const int t = from + lane;
        TileClass c;
        if (t < end) {
          const int64_t i0 = int64_t{t} * kBlockM, i1 = min(i0 + kBlockM, pat.sq);
          const SegmentRange qr = pat.q_segments
                                      ? block_segment_range(pat.q_seg_blocks, pat.q_seg_nblocks, b, i0, i1)
                                      : SegmentRange{};
          c = classify(pat, b, h, i0, i1, j0, j1, qr, kv_range, ragged);
        }
        chunk.set(from, h, c);
      }
      const int found = chunk.find(from, tc);
      if (found >= 0) return found;
      from = chunk.first + 32;
    }
    return end;
  }

  // How many key blocks (of kBlockN keys) after block `block` (of `blocks`) see query tile `tile`
  // of head h: this block's turn among them (the same decisions as their walks; every lane gets the
  // count).
  template <int kBlockN>
  __device__ int rank(int64_t h, int tile, int block, int blocks, int lane) const {
    int n = 0;
    for (int base = block + 1; base < blocks; base += 32) {
      const int kb = base + lane;
      bool seen = false;
      if (kb < blocks) {
        const int64_t k0 = int64_t{kb} * kBlockN, k1 = min(k0 + kBlockN, pat.sk);
        int qb, qe;
        query_tiles<kBlockM>(pat, k0, k1, qb, qe);
        if (tile >= qb && tile < qe) {
          const SegmentRange kr = pat.q_segments
                                      ? block_segment_range(pat.kv_seg_blocks, pat.kv_seg_nblocks, b, k0, k1)
                                      : SegmentRange{};
          seen = query_tile_visible<kBlockM>(pat, b, h, k0, k1, kr, tile);
        }
      }
      n += __popc(__ballot_sync(0xffffffffu, seen));
    }
    return n;
  }
};

}  // namespace attention_cuda
}  // namespace opforge
