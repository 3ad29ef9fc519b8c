// attention CUDA: every mask decision of the kernels, one definition each. What a query sees is
// defined once for host and device (AttentionPattern, attention/attention_params.h: band, prefix,
// segments, block mask, per-sequence key counts, varlen bounds); this header applies it to the
// kernels' tiles:
//   a tile's class (empty, full or partial, and which parts of the pattern a partial one must test)
//   and the key / query tile ranges a block may see; a key tile's class for a GQA group's rows
//   (decode);
//   the element visibility of a partial tile, as a bit set per row (band and prefix, then segments,
//   then the block mask, whose bits are read ahead, from global memory or from shared memory where
//   a producer staged them), applied as -inf;
//   the staging of a block mask's bits into shared memory by a Hopper producer warp.

#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/math_constants.h"
#include "common/cuda/ptx.cuh"

namespace opforge {
namespace attention_cuda {

using cuda::kNegInf;

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

// What the key tile [j0, j1) (of kTileKeys keys; fewer: the ragged last tile, partial) holds for
// every query row of a GQA group, heads h0 .. h0 + group - 1 (the decode kernel's rows): the band
// and the segments are the same for all heads; a block mask counts as visible where any head sees
// it.
template <int kTileKeys>
__device__ __forceinline__ BlockKind group_tile_kind(const AttentionPattern& pat, int64_t b, int64_t h0,
                                                     int64_t group, int64_t j0, int64_t j1,
                                                     SegmentRange q_range) {
  BlockKind kind = band_prefix_tile_kind(pat, 0, pat.sq, j0, j1);
  if (kind == BlockKind::kEmpty) return kind;
  if (pat.q_segments) {
    kind = combine(kind, segment_tile_kind(
                             q_range, block_segment_range(pat.kv_seg_blocks, pat.kv_seg_nblocks, b, j0, j1)));
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
  if (kind == BlockKind::kFull && j1 - j0 < kTileKeys) kind = BlockKind::kPartial;  // the ragged last tile
  return kind;
}

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
  static_assert(kW == 1 || kW == 2 || kW == 4, "32, 64 or 128 columns");
  uint32_t w[kW];
  if constexpr (kW == 4) {
    const uint4 v = *reinterpret_cast<const uint4*>(words);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (kW == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(words);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = *words;
  }
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kW; ++i) bits |= quad_bits(w[i], t) << (8 * i);
  return bits;
}
// The staged bits of the thread's two rows of a tile whose rows are queries (rows r and r + 8:
// row_words is row r's first word, rows row_stride words apart).
template <int kCols>
__device__ __forceinline__ void mask_rows_staged(const uint32_t* row_words, int row_stride, int t,
                                                 uint32_t (&bits)[2]) {
  bits[0] = mask_row_bits_staged<kCols>(row_words, t);
  bits[1] = mask_row_bits_staged<kCols>(row_words + 8 * row_stride, t);
}
// The staged bits (kQueries query rows of kKeys / 32 words) of a tile whose rows are keys (the
// Hopper backward's keys layout), or-ed into bits: for the thread's key rows `key` and key + 8 of the
// block, its kQueries / 4 columns (queries) in mask_tile_bits' order.
template <int kQueries, int kKeys>
__device__ __forceinline__ void mask_key_rows_staged(const uint32_t* words, int key, int t,
                                                     uint32_t (&bits)[2]) {
  const uint32_t* col = words + key / 32;
#pragma unroll
  for (int n = 0; n < kQueries / 4; ++n) {
    const uint32_t w = col[((n / 2) * 8 + 2 * t + n % 2) * (kKeys / 32)];
    bits[0] |= ((w >> (key % 32)) & 1u) << n;
    bits[1] |= ((w >> (key % 32 + 8)) & 1u) << n;
  }
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

// Block-mask bits staged by a producer warp: a tile of kRows queries x kCols keys that lies inside
// one mask block (block sizes multiples of the tile's, the bit table 16-byte aligned: mask_stageable)
// gets its bits copied into shared memory, kRows rows of kCols / 32 words, by the warp's lanes
// (cp.async, 16 or 8 bytes a row; the stage's full barrier `bar` then also waits for them). False
// (nothing copied) where the tile's block has no valid row of bits: the consumers read them from
// global memory then (mask_word shows nothing for it).
template <int kRows, int kCols>
__device__ __forceinline__ bool mask_stageable(const AttentionPattern& pat) {
  return pat.mask_kinds != nullptr && pat.block_q % kRows == 0 && pat.block_k % kCols == 0 &&
         reinterpret_cast<uintptr_t>(pat.mask_bits) % 16 == 0;
}
template <int kRows, int kCols>
__device__ __forceinline__ bool stage_mask_bits(const AttentionPattern& pat, int64_t b, int64_t h, int64_t i0,
                                                int64_t j0, uint32_t* dst, uint64_t* bar, int lane) {
  static_assert(kCols == 64 || kCols == 128, "a row's words in one 8- or 16-byte copy");
  const int64_t index = pat.mask_index[pat.mask_block(b, h, i0 / pat.block_q, j0 / pat.block_k)];
  if (index < 0 || index >= pat.mask_partials) return false;
  const int64_t wpr = pat.block_k / 32;  // words a mask row
  const uint32_t* src =
      pat.mask_bits + (index * pat.block_q + i0 % pat.block_q) * wpr + (j0 % pat.block_k) / 32;
#pragma unroll
  for (int r = lane; r < kRows; r += 32) cuda::cp_async<kCols / 8>(dst + r * (kCols / 32), src + r * wpr);
  cuda::cp_async_mbar_arrive(cuda::smem_addr(bar));
  return true;
}

}  // namespace attention_cuda
}  // namespace opforge
