// attention CUDA, mma.sync kernels (sm_80+): what the forward and backward passes share. Tiles of
// rows of head_dim 16-bit values in shared memory (16-byte chunks in the 128-byte XOR swizzle,
// filled by cp.async), their ldmatrix fragments, the walk over the tiles a pattern leaves visible
// (attention_params.h classifies them), and the element mask of partial tiles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/attention_cuda.h"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/math.cuh"
#include "common/cuda/math_constants.h"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/swizzle.cuh"
#include "common/cuda/vector.cuh"

namespace opforge {
namespace attention_cuda {

using cuda::ldmatrix_x4;
using cuda::ldmatrix_x4_trans;
using cuda::mma_m16n8k16;
using cuda::pack2;

constexpr float kNegInf = -__builtin_huge_valf();

// A tile of rows of kD 16-bit values: row r's 16-byte chunk c at r * 2 kD + 16 (c ^ (r % 8)).
template <int kD>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * (kD * 2) + (cuda::swizzle128_chunk(row, chunk) << 4));
}

// Rows [row0, row0 + kRows) of a matrix of `rows` rows (row stride ld elements, unit column
// stride, 16-byte aligned rows) into the tile at shared address `tile`; rows past the end are
// zero-filled. By kThreads threads.
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_rows(uint32_t tile, const T* base, int64_t ld, int64_t row0,
                                          int64_t rows, int tid) {
  constexpr int kChunks = kD / 8, kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int n = 0; n < kTotal / kThreads; ++n) {
    const int idx = tid + n * kThreads, r = idx / kChunks, c = idx % kChunks;
    const int64_t gr = row0 + r;
    const bool in = gr < rows;
    cuda::cp_async16(tile + tile_offset<kD>(r, c), base + (in ? gr * ld : 0) + c * 8, in ? 16 : 0);
  }
}

// kRows floats [row0, row0 + kRows) of a vector of `rows` into shared memory (zeros past the end).
template <int kRows, int kThreads>
__device__ __forceinline__ void load_floats(float* dst, const float* src, int64_t row0, int64_t rows,
                                            int tid) {
  for (int r = tid; r < kRows; r += kThreads) {
    const bool in = row0 + r < rows;
    cuda::cp_async4(dst + r, src + (in ? row0 + r : 0), in ? 4 : 0);
  }
}

// mma.sync fragments from a tile. A (16 x 16: rows r0.., k chunks 2 kk, 2 kk + 1).
template <int kD>
__device__ __forceinline__ void frag_a(uint32_t* a, uint32_t tile, int r0, int kk, int lane) {
  ldmatrix_x4(a, tile + tile_offset<kD>(r0 + (lane & 15), kk * 2 + (lane >> 4)));
}
// B of two n8 tiles whose n index runs along the tile's rows (n0..n0 + 15) and k along its
// columns (chunks 2 kk, 2 kk + 1): b[0..1] for rows n0.., b[2..3] for n0 + 8...
template <int kD>
__device__ __forceinline__ void frag_b(uint32_t* b, uint32_t tile, int n0, int kk, int lane) {
  ldmatrix_x4(b, tile + tile_offset<kD>(n0 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
}
// B of two n8 tiles whose k index runs along the tile's rows (k0..k0 + 15) and n along its
// columns (chunks 2 np, 2 np + 1): b[0..1] for columns 16 np.., b[2..3] for 16 np + 8...
template <int kD>
__device__ __forceinline__ void frag_b_trans(uint32_t* b, uint32_t tile, int k0, int np, int lane) {
  ldmatrix_x4_trans(b,
                    tile + tile_offset<kD>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), np * 2 + (lane >> 4)));
}
// The A fragment of k chunk kk (columns 16 kk..) of a 16-row accumulator block, rounded to T.
template <typename T, int kN>
__device__ __forceinline__ void acc_to_a(uint32_t* a, const float (&acc)[kN][4], int kk) {
  a[0] = pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// ---- the pattern ----------------------------------------------------------------------------

// A tile's kind, and which parts of the pattern its partial elements must be checked against.
struct TileClass {
  BlockKind kind = BlockKind::kEmpty;
  bool band = false, seg = false, mask = false;
};

// A TileClass as the bits of an int, for kernels whose producer hands tiles to consumers through
// shared memory.
__device__ __forceinline__ int tile_class_bits(const TileClass& c) {
  return static_cast<int>(c.kind) | (c.band << 2) | (c.seg << 3) | (c.mask << 4);
}
__device__ __forceinline__ TileClass tile_class_from_bits(int bits) {
  TileClass c;
  c.kind = static_cast<BlockKind>(bits & 3);
  c.band = (bits >> 2) & 1;
  c.seg = (bits >> 3) & 1;
  c.mask = (bits >> 4) & 1;
  return c;
}

// Tile [i0, i1) x [j0, j1) of (b, h). q_range: the queries' segment ids (unused without
// segments); the keys' are summarised here. ragged: the tile has fewer columns than the kernel's
// tile (which must then be masked).
__device__ __forceinline__ TileClass classify(const AttentionPattern& p, int64_t b, int64_t h, int64_t i0,
                                              int64_t i1, int64_t j0, int64_t j1, SegmentRange q_range,
                                              SegmentRange kv_range, bool ragged) {
  TileClass c;
  const BlockKind kb = band_prefix_tile_kind(p, i0, i1, j0, j1);
  if (kb == BlockKind::kEmpty) return c;
  BlockKind kind = kb;
  if (p.q_segments) {
    const BlockKind ks = segment_tile_kind(q_range, kv_range);
    c.seg = ks == BlockKind::kPartial;
    kind = combine(kind, ks);
  }
  if (kind != BlockKind::kEmpty && p.mask_kinds) {
    const BlockKind km = mask_tile_kind(p, b, h, i0, i1, j0, j1);
    c.mask = km == BlockKind::kPartial;
    kind = combine(kind, km);
  }
  c.band = kb == BlockKind::kPartial || ragged;
  if (kind == BlockKind::kFull && ragged) kind = BlockKind::kPartial;
  c.kind = kind;
  return c;
}

// The key tiles [begin, end) (of kBlockN keys) that queries [i0, i1) may see: the band's reach,
// and every tile from 0 under a prefix. Tiles inside are classified one by one.
template <int kBlockN>
__device__ __forceinline__ void key_tiles(const AttentionPattern& p, int64_t i0, int64_t i1, int& begin,
                                          int& end) {
  int64_t lo, hi;
  band_key_range(p, i0, i1, lo, hi);
  begin = static_cast<int>(lo / kBlockN);
  end = hi <= lo ? begin : static_cast<int>((hi + kBlockN - 1) / kBlockN);
}

// Segment ids of rows [start, end) of batch row b (start a multiple of 32) from the per-32-row
// summaries ((B, nblocks, 2) min / max), two a step (a walk classifying tiles waits for two memory
// latencies a round of 128-row tiles, not four).
__device__ __forceinline__ SegmentRange block_segment_range(const int64_t* blocks, int64_t nblocks, int64_t b,
                                                            int64_t start, int64_t end) {
  SegmentRange r{0x7fffffffffffffffLL, -0x7fffffffffffffffLL - 1};
  const int64_t* row = blocks + b * nblocks * 2;
  const int64_t k0 = start / 32, k1 = (end - 1) / 32;
  for (int64_t k = k0; k <= k1; k += 2) {  // (two summaries a step: their loads in flight together)
    const bool two = k + 1 <= k1;
    const int64_t lo0 = row[2 * k], hi0 = row[2 * k + 1];
    const int64_t lo1 = two ? row[2 * k + 2] : lo0, hi1 = two ? row[2 * k + 3] : hi0;
    r.lo = min(r.lo, min(lo0, lo1));
    r.hi = max(r.hi, max(hi0, hi1));
  }
  return r;
}

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

// The query tiles [begin, end) (of kBlockM queries) that may see keys [j0, j1).
template <int kBlockM>
__device__ __forceinline__ void query_tiles(const AttentionPattern& p, int64_t j0, int64_t j1, int& begin,
                                            int& end) {
  int64_t lo = 0, hi = p.sq;
  if (!(p.prefix_len > 0 && j0 < p.prefix_len)) {
    const int64_t off = p.sk - p.sq, right = p.band_right();
    if (right >= 0) lo = max(int64_t{0}, j0 - right - off);
    if (p.window_left >= 0) hi = min(p.sq, j1 - 1 + p.window_left - off + 1);
  }
  begin = static_cast<int>(lo / kBlockM);
  end = hi <= lo ? begin : static_cast<int>((hi + kBlockM - 1) / kBlockM);
}

// Does key block [j0, j1) of batch row b see query tile `tile` (kBlockM queries) of head h? The
// decision QueryWalk makes for each tile, for one tile (kv_range: the block's key segment ids).
template <int kBlockM>
__device__ __forceinline__ bool query_tile_visible(const AttentionPattern& pat, int64_t b, int64_t h,
                                                   int64_t j0, int64_t j1, SegmentRange kv_range, int tile) {
  const int64_t i0 = int64_t{tile} * kBlockM, i1 = min(i0 + kBlockM, pat.sq);
  const SegmentRange qr =
      pat.q_segments ? block_segment_range(pat.q_seg_blocks, pat.q_seg_nblocks, b, i0, i1) : SegmentRange{};
  return classify(pat, b, h, i0, i1, j0, j1, qr, kv_range, false).kind != BlockKind::kEmpty;
}

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

// The word of a block mask's bits that holds elements (i, j..j+31) (j a multiple of 32, so the word
// lies in one mask block): all ones for a full block, zero for an empty one or an index outside
// mask_bits.
__device__ __forceinline__ uint32_t mask_word(const AttentionPattern& p, int64_t b, int64_t h, int i, int j) {
  const int bq = static_cast<int>(p.block_q), bk = static_cast<int>(p.block_k);
  const int64_t m = p.mask_block(b, h, i / bq, j / bk);
  const auto kind = static_cast<BlockKind>(p.mask_kinds[m]);
  if (kind == BlockKind::kFull) return 0xffffffffu;
  const int64_t index = kind == BlockKind::kPartial ? p.mask_index[m] : -1;
  if (index < 0 || index >= p.mask_partials) return 0u;
  return p.mask_bits[(index * bq + i % bq) * (bk / 32) + (j % bk) / 32];
}

// Of a 32-column word of mask bits, the 8 bits thread t of a quad holds (bit 2 k + e: column
// 8 k + 2 t + e; bit 8 k + u of the word is column 8 k + u).
__device__ __forceinline__ uint32_t quad_bits(uint32_t word, int t) {
  word >>= 2 * t;
  return (word & 3u) | ((word >> 6) & 0xcu) | ((word >> 12) & 0x30u) | ((word >> 18) & 0xc0u);
}

// The block mask's bits of query row `row` over columns c0 .. c0 + kCols - 1 (c0 a multiple of 32)
// that thread t of a quad holds (bit 2 nt + e: column nt * 8 + 2 t + e; as mask_tile's sets).
// Words are read only where `want` has a bit (of their 8), and never past the last key.
template <int kCols>
__device__ __forceinline__ uint32_t mask_row_bits(const AttentionPattern& p, int64_t b, int64_t h, int row,
                                                  int c0, int t, uint32_t want) {
  uint32_t bits = 0;
#pragma unroll
  for (int w = 0; w < kCols / 32; ++w) {
    if (!((want >> (8 * w)) & 0xffu) || c0 + 32 * w >= p.sk) continue;
    bits |= quad_bits(mask_word(p, b, h, row, c0 + 32 * w), t) << (8 * w);
  }
  return bits;
}
// The same from the row's kCols / 32 words already in shared memory (16-byte aligned when 4, 8
// when 2; a producer staged them).
template <int kCols>
__device__ __forceinline__ uint32_t mask_row_bits_staged(const uint32_t* words, int t) {
  constexpr int kW = kCols / 32;
  static_assert(kW == 2 || kW == 4, "64 or 128 columns");
  uint32_t w[kW];
  if constexpr (kW == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(words);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(words);
    w[0] = v.x, w[1] = v.y;
  }
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kW; ++i) bits |= quad_bits(w[i], t) << (8 * i);
  return bits;
}

// mask_tile's block-mask bits of a warp's tile (rows are queries) read ahead, before the scores
// they mask are ready (the loads then overlap the matrix product): bits[r] for row row0 + g + 8 r.
template <int kCols>
__device__ __forceinline__ void mask_rows_ahead(const AttentionPattern& p, int64_t b, int64_t h, int64_t row0,
                                                int64_t col0, int lane, uint32_t (&bits)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + lane / 4 + 8 * r;
    bits[r] = row < p.sq ? mask_row_bits<kCols>(p, b, h, static_cast<int>(row), static_cast<int>(col0),
                                                lane % 4, 0xffffffffu)
                         : 0u;
  }
}

inline __device__ int clamp_col(int64_t x, int n) {
  return static_cast<int>(x < -1 ? int64_t{-1} : x > n ? int64_t{n} : x);
}

// The bits (in mask_tile_bits' order: bit n is column (n / 2) * 8 + 2 t + n % 2, increasing with
// n) of thread t's columns below x: the first count of them, count = #{m : 8 m + 2 t + e < x} over
// e = 0, 1 (each clamped to [0, kCols / 8]).
template <int kCols>
__device__ __forceinline__ uint32_t columns_below(int x, int t) {
  const int c0 = min(max((x - 2 * t + 7) >> 3, 0), kCols / 8),
            c1 = min(max((x - 2 * t + 6) >> 3, 0), kCols / 8);
  const int count = c0 + c1;
  return count >= 32 ? 0xffffffffu : (1u << count) - 1u;
}

// Sets the masked elements of a partial tile's scores (a warp's 16 rows of a 16 x kCols block,
// accumulator layout) to -inf. kKeysAsRows: rows are keys (j), columns queries (i) (the dK/dV
// pass); else rows are queries, columns keys. row0 / col0: the global index of the warp's first
// row and of column 0 (col0 a multiple of 32).
// Each of a thread's two rows gets a bit set of its kCols / 4 columns (bit 2 nt + e: column
// nt * 8 + 2 t + e), narrowed by the band, the segments and the block mask in turn, then applied
// once: the code stays small (a kernel whose loop outgrows the instruction cache stalls on
// fetches), and the rarely used parts are loops, not unrolled copies.
// mask_rows: the block mask's bits of the thread's two rows (in the sets' order), read ahead
// (mask_rows_ahead) or from bits a producer staged (nullptr: read here). mask_tile_bits only
// computes the two rows' sets (a kernel may then apply them on every tile, all bits set on full
// ones, without two code paths through the scores: apply_visibility).
template <bool kKeysAsRows, int kCols>
__device__ __forceinline__ void mask_tile_bits(uint32_t (&vis_rows)[2], const AttentionPattern& p,
                                               const TileClass& tc, int64_t b, int64_t h, int64_t row0,
                                               int64_t col0, int lane, const uint32_t* mask_rows = nullptr) {
  static_assert(kCols % 32 == 0 && kCols <= 128, "a row's columns in one 32-bit set");
  constexpr int kBits = kCols / 4;
  const int g = lane / 4, t = lane % 4;
  const int64_t off = p.sk - p.sq;
  const auto column = [t](int n) { return (n / 2) * 8 + 2 * t + n % 2; };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    // A row past the end sees nothing (the one-pass backward's dQ sums over every key row).
    if (row >= (kKeysAsRows ? p.sk : p.sq)) {
      vis_rows[r] = 0;
      continue;
    }
    // Columns [lo, hi] are in the band; columns below pc see the row by the prefix; cmax bounds them.
    int lo = -1, hi = kCols, pc = -1, cmax;
    const int64_t right = p.band_right();
    if (!kKeysAsRows) {
      const int64_t pos = row + off;
      if (p.window_left >= 0) lo = clamp_col(pos - p.window_left - col0, kCols);
      if (right >= 0) hi = clamp_col(pos + right - col0, kCols);
      pc = clamp_col(p.prefix_len - col0, kCols);
      cmax = clamp_col(p.sk - col0, kCols);
    } else {
      if (right >= 0) lo = clamp_col(row - right - off - col0, kCols);
      if (p.window_left >= 0) hi = clamp_col(row + p.window_left - off - col0, kCols);
      pc = row < p.prefix_len ? kCols : -1;
      cmax = clamp_col(p.sq - col0, kCols);
    }
    // Visible by band and bounds: [0, p_end) (the prefix) and [b_lo, b_hi]. The thread's columns
    // increase with their bit, so each bound is a prefix of the bits (columns_below).
    const int p_end = min(pc, cmax), b_lo = tc.band ? lo : 0, b_hi = min(tc.band ? hi : kCols, cmax - 1);
    uint32_t vis =
        columns_below<kCols>(p_end, t) | (columns_below<kCols>(b_hi + 1, t) & ~columns_below<kCols>(b_lo, t));
    if (tc.seg) {  // the row's segment against each still-visible column's
      const int64_t row_seg =
          kKeysAsRows ? p.kv_segments[b * p.kv_seg_bs + row] : p.q_segments[b * p.q_seg_bs + row];
      const int64_t* cols = kKeysAsRows ? p.q_segments + b * p.q_seg_bs : p.kv_segments + b * p.kv_seg_bs;
#pragma unroll 4
      for (int n = 0; n < kBits; ++n) {
        if ((vis >> n) & 1u && cols[col0 + column(n)] != row_seg) vis &= ~(1u << n);
      }
    }
    if (tc.mask) {  // (int arithmetic: positions are below 2^30 on CUDA.)
      const int rw = static_cast<int>(row), c0 = static_cast<int>(col0);
      uint32_t bits = 0;
      if (mask_rows) {
        bits = mask_rows[r];
      } else if (!kKeysAsRows) {
        bits = mask_row_bits<kCols>(p, b, h, rw, c0, t, vis);
      } else {
        // Columns are queries, each its own row of bits: the word holding this key in each. Where
        // the columns lie in one mask block (always, for the kernels' tiles) its kind is read once.
        const int bq = static_cast<int>(p.block_q), bk = static_cast<int>(p.block_k);
        if (c0 / bq == (c0 + kCols - 1) / bq) {
          const int64_t m = p.mask_block(b, h, c0 / bq, rw / bk);
          const auto kind = static_cast<BlockKind>(p.mask_kinds[m]);
          const int64_t index = kind == BlockKind::kPartial ? p.mask_index[m] : -1;
          if (kind == BlockKind::kFull) {
            bits = 0xffffffffu;
          } else if (index >= 0 && index < p.mask_partials) {
            const int stride = bk / 32;
            const uint32_t* words = p.mask_bits + (index * bq + c0 % bq) * stride + (rw % bk) / 32;
#pragma unroll 8
            for (int n = 0; n < kBits; ++n) {
              if ((vis >> n) & 1u) bits |= ((words[column(n) * stride] >> (rw & 31)) & 1u) << n;
            }
          }
        } else {
#pragma unroll 4
          for (int n = 0; n < kBits; ++n) {
            if ((vis >> n) & 1u)
              bits |= ((mask_word(p, b, h, c0 + column(n), rw & ~31) >> (rw & 31)) & 1u) << n;
          }
        }
      }
      vis &= bits;
    }
    vis_rows[r] = vis;
  }
}
// Sets to -inf the elements whose bit in vis_rows is clear (bit 2 nt + e of row r: x[nt][2 r + e]).
template <int kN>
__device__ __forceinline__ void apply_visibility(float (&x)[kN][4], const uint32_t (&vis_rows)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (!((vis_rows[r] >> (2 * nt + e)) & 1u)) x[nt][2 * r + e] = kNegInf;
      }
    }
  }
}
template <bool kKeysAsRows, int kCols>
__device__ __forceinline__ void mask_tile(float (&x)[kCols / 8][4], const AttentionPattern& p,
                                          const TileClass& tc, int64_t b, int64_t h, int64_t row0,
                                          int64_t col0, int lane, const uint32_t* mask_rows = nullptr) {
  uint32_t vis[2];
  mask_tile_bits<kKeysAsRows, kCols>(vis, p, tc, b, h, row0, col0, lane, mask_rows);
  apply_visibility(x, vis);
}

// Scores in the log2 domain: s * scale * log2(e), or with a softcap c: c log2(e) tanh(s scale / c)
// (tanh.approx, as every CUDA kernel computes it: a backward recomputes the forward's P).
template <int kN>
__device__ __forceinline__ void scores_log2(float (&s)[kN][4], const AttentionCudaArgs& a) {
  if (a.cap_log2 != 0.f) {
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = a.cap_log2 * cuda::fast_tanh(s[n][e] * a.cap_inv_scale);
  } else {
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= a.scale_log2;
  }
}

// One key tile of the online softmax for a warp's 16 rows (elements 0, 1: row g; 2, 3: row g + 8):
// the running max and sum updated from the tile's scores, the scores turned into P in place, and
// each row's factor corr by which the output accumulated so far must be rescaled (a row that has
// seen nothing yet keeps max -inf and P 0). The scores are x with log2-domain values x k (k > 0):
// either already in the log2 domain (k = 1, scores_log2) or raw with k = scale log2(e), the scale
// then applied in the exponent's FFMA (exp2(x k - max k), FlashAttention's form: one FMUL an
// element less); m_run stays in x's units. softmax_step leaves the output alone (a kernel whose P V
// product of the previous tile is still running rescales it afterwards, rescale_rows);
// online_softmax does both.
template <int kN>
__device__ __forceinline__ void softmax_step(float (&s)[kN][4], float (&m_run)[2], float (&l_run)[2],
                                             float (&corr)[2], float k = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float v[kN];  // the row's max as a tree (log2 kN deep, not a chain of kN: it gates the exponentials)
#pragma unroll
    for (int n = 0; n < kN; ++n) v[n] = fmaxf(s[n][2 * r], s[n][2 * r + 1]);
#pragma unroll
    for (int w = 1; w < kN; w *= 2)
#pragma unroll
      for (int n = 0; n + w < kN; n += 2 * w) v[n] = fmaxf(v[n], v[n + w]);
    float mx = fmaxf(m_run[r], v[0]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float use = mx == kNegInf ? 0.f : mx * k;
    corr[r] = cuda::fast_exp2(fmaf(m_run[r], k, -use));
    m_run[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      s[n][2 * r] = cuda::fast_exp2(fmaf(s[n][2 * r], k, -use));
      s[n][2 * r + 1] = cuda::fast_exp2(fmaf(s[n][2 * r + 1], k, -use));
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    l_run[r] = l_run[r] * corr[r] + sum;
  }
}
template <int kDT>
__device__ __forceinline__ void rescale_rows(float (&o)[kDT][4], const float (&corr)[2]) {
#pragma unroll
  for (int n = 0; n < kDT; ++n) {
    o[n][0] *= corr[0], o[n][1] *= corr[0];
    o[n][2] *= corr[1], o[n][3] *= corr[1];
  }
}
template <int kN, int kDT>
__device__ __forceinline__ void online_softmax(float (&s)[kN][4], float (&o)[kDT][4], float (&m_run)[2],
                                               float (&l_run)[2]) {
  float corr[2];
  softmax_step(s, m_run, l_run, corr);
  rescale_rows(o, corr);
}

// dS from P, dP and the row's delta: P (dP - delta) scale, times (1 - tanh^2) under a softcap
// (tanh recovered from P: x = log2(P) + lse2, tanh = x / (c log2(e))).
__device__ __forceinline__ float score_grad(float prob, float dp, float delta, float lse2,
                                            const AttentionCudaArgs& a) {
  float ds = prob * (dp - delta) * a.scale;
  if (a.cap_log2 != 0.f) {
    const float th = (cuda::fast_log2(prob) + lse2) * a.inv_cap_log2;
    ds = prob > 0.f ? ds * (1.f - th * th) : 0.f;
  }
  return ds;
}

// The backward's P and dS of a warp's 16 x kN block from scores in the log2 domain: by columns
// (the dK/dV passes: columns are queries, their lse2 and delta from shared memory; P stays in s)
// or by rows (the dQ passes: the thread's two rows' lse2 and delta; only dS is kept, in dp).
// By columns in two steps, so that P can be computed while dP is: probs_by_column turns the
// scores into P, score_grads_from_probs dP into dS.
template <int kN>
__device__ __forceinline__ void probs_by_column(float (&s)[kN][4], const float* lse2, int t4) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = cuda::fast_exp2(s[n][e] - lse2[n * 8 + 2 * t4 + (e & 1)]);
  }
}
template <int kN>
__device__ __forceinline__ void score_grads_from_probs(const float (&prob)[kN][4], float (&dp)[kN][4],
                                                       const float* lse2, const float* delta,
                                                       const AttentionCudaArgs& a, int t4) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = n * 8 + 2 * t4 + (e & 1);
      dp[n][e] = score_grad(prob[n][e], dp[n][e], delta[c], lse2[c], a);
    }
  }
}
template <int kN>
__device__ __forceinline__ void score_grads_by_column(float (&s)[kN][4], float (&dp)[kN][4],
                                                      const float* lse2, const float* delta,
                                                      const AttentionCudaArgs& a, int t4) {
  probs_by_column(s, lse2, t4);
  score_grads_from_probs(s, dp, lse2, delta, a, t4);
}
template <int kN>
__device__ __forceinline__ void score_grads_by_row(const float (&s)[kN][4], float (&dp)[kN][4],
                                                   const float (&lse2)[2], const float (&delta)[2],
                                                   const AttentionCudaArgs& a) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const float prob = cuda::fast_exp2(s[n][e] - lse2[r]);
      dp[n][e] = score_grad(prob, dp[n][e], delta[r], lse2[r], a);
    }
  }
}

// The forward's row totals: each row's 1 / sum (0 for a row that saw nothing) into inv, and its
// LSE (natural log; -inf for such a row) written by the quad's first lane. row0: the warp's first
// query row; sq: batch row b's query count; k: softmax_step's.
__device__ __forceinline__ void finish_rows(const float (&m_run)[2], const float (&l_run)[2], float (&inv)[2],
                                            const AttentionParams& p, int64_t sq, int64_t b, int64_t h,
                                            int64_t row0, int lane, float k = 1.f) {
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[r] = l > 0.f ? 1.f / l : 0.f;
    const int64_t i = row0 + g + 8 * r;
    if (t4 == 0 && i < sq) {
      static_cast<float*>(p.lse)[p.lse_at(b, h) + i] =
          l > 0.f ? fmaf(m_run[r], k, log2f(l)) * cuda::kLn2Float : kNegInf;
    }
  }
}

template <typename Kernel>
cudaError_t prepare_kernel(Kernel kernel, int smem_bytes, signed char (&state)[64]) {
  const cudaError_t err = cuda::configure_once(
      kernel, smem_bytes, state, [](const cudaFuncAttributes& f) { return f.ptxVersion >= 80; });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

}  // namespace attention_cuda
}  // namespace opforge
