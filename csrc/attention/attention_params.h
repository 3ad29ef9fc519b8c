// attention: the plain parameters the CPU and CUDA kernels share (no torch types), and the mask
// pattern every kernel evaluates, one definition for the tile classification and the elements.
//
// Query i of a sequence of Sq sees key j of Sk when all of these hold (queries aligned to the end
// of the keys, as FlashAttention does: query i sits at key position i + Sk - Sq):
//   - segments:  q_segments[b][i] == kv_segments[b][j] (packed documents), when given;
//   - prefix:    j < prefix_len, or else
//   - causal:    j <= pos(i);  window: pos(i) - left <= j <= pos(i) + right (either side unbounded
//                when negative);
//   - block mask: the (b, h) mask's block (i / block_q, j / block_k) is full, or partial with bit
//                (i % block_q, j % block_k) set.
// With per-sequence key counts (kv_lens, the forward kernels), sequence b has keys [0, kv_lens[b])
// and its queries sit at the end of those: `at(b)` is the pattern of batch row b.
// Packed variable-length sequences (varlen, FlashAttention's cu_seqlens): the tensors hold one batch
// row whose sequence dims pack `batch` sequences one after another; sequence b is the kernels'
// batch row b, with queries [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and keys [cu_seqlens_k[b],
// cu_seqlens_k[b + 1]) of the packed dims, and the pattern applies to each sequence on its own
// (`at(b)`: its lengths; the `*_start(b)` rows where it begins).
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

#if defined(__CUDACC__)
#define OPFORGE_HD __host__ __device__ __forceinline__
#else
#define OPFORGE_HD inline
#endif

namespace opforge {

// Block mask kinds (opforge.block_mask's `kinds` tensor).
enum class BlockKind : uint8_t { kEmpty = 0, kFull = 1, kPartial = 2 };

struct AttentionPattern {
  int64_t sq = 0, sk = 0;
  bool causal = false;
  // Negative: unbounded. The plan clamps both sides and the prefix to Sq + Sk (the same pattern),
  // so that positions plus a side never overflow.
  int64_t window_left = -1, window_right = -1;
  int64_t prefix_len = 0;  // keys [0, prefix_len) visible to every query
  // Segment ids (int64, (B, Sq) and (B, Sk), row strides in elements), or null.
  const int64_t* q_segments = nullptr;
  const int64_t* kv_segments = nullptr;
  int64_t q_seg_bs = 0, kv_seg_bs = 0;
  // (CUDA) The ids summarised per 32 rows: (B, ceil(S / 32), 2) int64 min and max, or null.
  const int64_t* q_seg_blocks = nullptr;
  const int64_t* kv_seg_blocks = nullptr;
  int64_t q_seg_nblocks = 0, kv_seg_nblocks = 0;
  // Block mask, or null: kinds (Bm, Hm, nQ, nK) uint8 and index (same shape, int32: the partial
  // block's row of bits, or -1), bits (P, block_q, block_k / 32) int32; Bm and Hm are 1 or B, H.
  const uint8_t* mask_kinds = nullptr;
  const int32_t* mask_index = nullptr;
  const uint32_t* mask_bits = nullptr;
  int64_t mask_b = 1, mask_h = 1, mask_nq = 0, mask_nk = 0;
  int64_t mask_partials = 0;  // mask_bits' first dimension
  int64_t block_q = 128, block_k = 128;
  // Per-sequence key counts (B,) int64 (clamped to [0, sk]), or null: every sequence has sk keys.
  const int64_t* kv_lens = nullptr;
  // Varlen: (B + 1,) int32 row offsets into the packed query and key dims of total_q and total_k
  // rows, or null. Offsets are clamped into [0, total] and each sequence's length to at least 0, so
  // that no value reaches outside the tensors (the entries check them where they can). sq and sk
  // are the packed dims' lengths in the plan's pattern, a sequence's own in at(b)'s.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0, total_k = 0;

  OPFORGE_HD bool varlen() const { return cu_seqlens_q != nullptr; }
  // Sequence b's first query / key row in the packed dims (0 without varlen).
  OPFORGE_HD int64_t q_start(int64_t b) const {
    return cu_seqlens_q ? clamp_row(cu_seqlens_q[b], total_q) : 0;
  }
  OPFORGE_HD int64_t k_start(int64_t b) const {
    return cu_seqlens_k ? clamp_row(cu_seqlens_k[b], total_k) : 0;
  }
  // The batch row of the tensors that holds sequence b (0 under varlen).
  OPFORGE_HD int64_t tensor_batch(int64_t b) const { return cu_seqlens_q ? 0 : b; }
  OPFORGE_HD static int64_t clamp_row(int64_t r, int64_t n) { return r < 0 ? 0 : (r > n ? n : r); }

  // The pattern of batch row b: its own key count (and so its queries' positions).
  OPFORGE_HD AttentionPattern at(int64_t b) const {
    AttentionPattern p = *this;
    if (cu_seqlens_q) {
      const int64_t q0 = q_start(b), k0 = k_start(b);
      const int64_t q1 = clamp_row(cu_seqlens_q[b + 1], total_q),
                    k1 = clamp_row(cu_seqlens_k[b + 1], total_k);
      p.sq = q1 > q0 ? q1 - q0 : 0;
      p.sk = k1 > k0 ? k1 - k0 : 0;
    }
    if (kv_lens) p.sk = kv_len(b);
    return p;
  }
  // at(b) for a call without packed sequences (the decode kernel's: no varlen branch to hold
  // registers for).
  OPFORGE_HD AttentionPattern at_unpacked(int64_t b) const {
    AttentionPattern p = *this;
    if (kv_lens) p.sk = kv_len(b);
    return p;
  }
  // Sequence b's key count from kv_lens, clamped to [0, sk].
  OPFORGE_HD int64_t kv_len(int64_t b) const {
    const int64_t n = kv_lens[b];
    return n < 0 ? 0 : (n > sk ? sk : n);
  }
  // The position of query i among the keys.
  OPFORGE_HD int64_t pos(int64_t i) const { return i + sk - sq; }
  // Does the causal / window part have any constraint? Its right reach (causal: 0; negative:
  // unbounded).
  OPFORGE_HD bool has_band() const { return causal || window_left >= 0 || window_right >= 0; }
  OPFORGE_HD int64_t band_right() const { return causal ? 0 : window_right; }
  OPFORGE_HD int64_t mask_block(int64_t b, int64_t h, int64_t qb, int64_t kb) const {
    return (((mask_b == 1 ? 0 : b) * mask_h + (mask_h == 1 ? 0 : h)) * mask_nq + qb) * mask_nk + kb;
  }

  // Key j inside the band of query i (causal, window), ignoring the prefix.
  OPFORGE_HD bool in_band(int64_t i, int64_t j) const {
    const int64_t p = pos(i), right = band_right();
    if (right >= 0 && j > p + right) return false;
    if (window_left >= 0 && j < p - window_left) return false;
    return true;
  }

  OPFORGE_HD bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (q_segments && q_segments[b * q_seg_bs + i] != kv_segments[b * kv_seg_bs + j]) return false;
    if (!(j < prefix_len || in_band(i, j))) return false;
    if (mask_kinds) {
      const int64_t m = mask_block(b, h, i / block_q, j / block_k);
      const auto kind = static_cast<BlockKind>(mask_kinds[m]);
      if (kind == BlockKind::kPartial) {
        // (An index outside mask_bits, or a kind other than the three, shows nothing.)
        const int64_t index = mask_index[m];
        if (index < 0 || index >= mask_partials) return false;
        const int64_t r = i % block_q, c = j % block_k;
        const uint32_t word = mask_bits[(index * block_q + r) * (block_k / 32) + c / 32];
        if (!((word >> (c % 32)) & 1u)) return false;
      } else if (kind != BlockKind::kFull) {
        return false;
      }
    }
    return true;
  }
};

// The keys [lo, hi) that queries [i0, i1) may see: the band's reach, every key from 0 under a
// prefix (hi <= lo: none).
OPFORGE_HD void band_key_range(const AttentionPattern& p, int64_t i0, int64_t i1, int64_t& lo, int64_t& hi) {
  lo = 0, hi = p.sk;
  if (p.window_left >= 0 && p.prefix_len == 0)
    lo = p.pos(i0) - p.window_left > 0 ? p.pos(i0) - p.window_left : 0;
  const int64_t right = p.band_right();
  if (right >= 0) {
    const int64_t reach = p.pos(i1 - 1) + right + 1 > p.prefix_len ? p.pos(i1 - 1) + right + 1 : p.prefix_len;
    hi = reach < p.sk ? reach : p.sk;
  }
}

// What a tile [i0, i1) x [j0, j1) of one (b, h) holds: nothing visible (skipped), everything
// visible (no mask arithmetic), or some of it. Segment ids are summarized by their min and max
// over the tile's rows and columns (ranges that do not meet share no id).
struct SegmentRange {
  int64_t lo = 0, hi = -1;  // empty when lo > hi
};

OPFORGE_HD BlockKind band_tile_kind(const AttentionPattern& p, int64_t i0, int64_t i1, int64_t j0,
                                    int64_t j1) {
  // The band of a query row is an interval; over consecutive rows its ends move right by one per
  // row, so the tile's corners decide.
  if (!p.has_band()) return BlockKind::kFull;
  const int64_t first = i0, last = i1 - 1, right = p.band_right();
  // Any visible element? The highest row reaches furthest right, the lowest row furthest left.
  const bool some = (right < 0 || j0 <= p.pos(last) + right) &&
                    (p.window_left < 0 || j1 - 1 >= p.pos(first) - p.window_left);
  if (!some) return BlockKind::kEmpty;
  const bool all = (right < 0 || j1 - 1 <= p.pos(first) + right) &&
                   (p.window_left < 0 || j0 >= p.pos(last) - p.window_left);
  return all ? BlockKind::kFull : BlockKind::kPartial;
}

OPFORGE_HD BlockKind combine(BlockKind a, BlockKind b) {
  if (a == BlockKind::kEmpty || b == BlockKind::kEmpty) return BlockKind::kEmpty;
  return a == BlockKind::kFull && b == BlockKind::kFull ? BlockKind::kFull : BlockKind::kPartial;
}

// The band and prefix part of a tile's kind.
OPFORGE_HD BlockKind band_prefix_tile_kind(const AttentionPattern& p, int64_t i0, int64_t i1, int64_t j0,
                                           int64_t j1) {
  BlockKind kind = band_tile_kind(p, i0, i1, j0, j1);
  if (p.prefix_len > 0 && j0 < p.prefix_len) {
    // Keys below the prefix are visible to every row: the tile is at least partly visible.
    kind = j1 <= p.prefix_len ? BlockKind::kFull : (kind == BlockKind::kFull ? kind : BlockKind::kPartial);
  }
  return kind;
}

// The segment part: q_range / kv_range are the tile's segment ids.
OPFORGE_HD BlockKind segment_tile_kind(SegmentRange q_range, SegmentRange kv_range) {
  if (q_range.hi < kv_range.lo || kv_range.hi < q_range.lo) return BlockKind::kEmpty;
  const bool one = q_range.lo == q_range.hi && kv_range.lo == kv_range.hi;  // one id on both sides
  return one ? BlockKind::kFull : BlockKind::kPartial;
}

// The block-mask part, over every mask block the tile covers (a kind other than empty, full or
// partial counts as empty).
OPFORGE_HD BlockKind mask_tile_kind(const AttentionPattern& p, int64_t b, int64_t h, int64_t i0, int64_t i1,
                                    int64_t j0, int64_t j1) {
  bool any = false, all = true;
  for (int64_t bi = i0 / p.block_q; bi <= (i1 - 1) / p.block_q; ++bi) {
    for (int64_t bj = j0 / p.block_k; bj <= (j1 - 1) / p.block_k; ++bj) {
      const auto kind = static_cast<BlockKind>(p.mask_kinds[p.mask_block(b, h, bi, bj)]);
      const bool seen = kind == BlockKind::kFull || kind == BlockKind::kPartial;
      any = any || seen;
      all = all && kind == BlockKind::kFull;
    }
  }
  return !any ? BlockKind::kEmpty : all ? BlockKind::kFull : BlockKind::kPartial;
}

// The tile's kind. q_range / kv_range: the tile's segment ids (ignored without segments).
OPFORGE_HD BlockKind tile_kind(const AttentionPattern& p, int64_t b, int64_t h, int64_t i0, int64_t i1,
                               int64_t j0, int64_t j1, SegmentRange q_range, SegmentRange kv_range) {
  BlockKind kind = band_prefix_tile_kind(p, i0, i1, j0, j1);
  if (kind == BlockKind::kEmpty) return kind;
  if (p.q_segments) kind = combine(kind, segment_tile_kind(q_range, kv_range));
  if (p.mask_kinds && kind != BlockKind::kEmpty)
    kind = combine(kind, mask_tile_kind(p, b, h, i0, i1, j0, j1));
  return kind;
}

struct AttentionParams {
  // q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D): strides in elements, any layout.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_bs = 0, q_hs = 0, q_ss = 0, q_ds = 1;
  int64_t k_bs = 0, k_hs = 0, k_ss = 0, k_ds = 1;
  int64_t v_bs = 0, v_hs = 0, v_ss = 0, v_ds = 1;
  // out like q (strides given), lse (B, Hq, Sq) contiguous (float32; float64 for float64 inputs).
  void* out = nullptr;
  int64_t o_bs = 0, o_hs = 0, o_ss = 0;
  void* lse = nullptr;
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // v's (and the output's) head dim. The CUDA launcher hands the Hopper kernels operands narrower
  // than their head dims (multiples of 8 columns): their TMA reads the columns past these as zeros.
  int64_t head_dim_v = 0;
  DType dtype = DType::kFloat32;
  double scale = 1.0;    // the kernels round it to their accumulation type
  double softcap = 0.0;  // 0: none
  // Attention sinks: (heads,) logits in the accumulation type (float; double for float64 inputs), one a
  // query head, that every row of the head takes in its softmax's denominator (null: none). The
  // forward kernels add it when they finish a row: out * exp(m - m') / (l exp(m - m') + exp(sink - m'))
  // with m' = max(m, sink); the backward reads the output and LSE that include it.
  const void* sinks = nullptr;
  // FP8 inputs (dtype kFloat8E4M3; the Hopper FP8 forward): each operand's true values are the stored
  // ones times its descale factor of (batch row, kv head), float32 (batch, kv_heads) contiguous
  // (null: 1; varlen: a sequence's).
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  AttentionPattern pattern;
  // Paged K/V (the forward kernels; opforge.attention's block_table): key j of batch row b is row
  // j % page_size of page block_table[b * table_bs + j / page_size] (an entry outside [0, num_pages)
  // is read as the nearest page), and k_bs / v_bs are the page strides. Null: k and v as above.
  const int32_t* block_table = nullptr;
  int64_t table_bs = 0, page_size = 0, num_pages = 0;

  // Element offsets of batch row b's (sequence b's under varlen) head h: of its first query row in
  // q and out, its first key row in k and v, and of its first LSE value.
  OPFORGE_HD int64_t q_at(int64_t b, int64_t h) const {
    return pattern.tensor_batch(b) * q_bs + h * q_hs + pattern.q_start(b) * q_ss;
  }
  OPFORGE_HD int64_t o_at(int64_t b, int64_t h) const {
    return pattern.tensor_batch(b) * o_bs + h * o_hs + pattern.q_start(b) * o_ss;
  }
  OPFORGE_HD int64_t k_at(int64_t b, int64_t hk) const {
    return pattern.tensor_batch(b) * k_bs + hk * k_hs + pattern.k_start(b) * k_ss;
  }
  OPFORGE_HD int64_t v_at(int64_t b, int64_t hk) const {
    return pattern.tensor_batch(b) * v_bs + hk * v_hs + pattern.k_start(b) * v_ss;
  }
  // Element offset of key j's row of batch row b in k (bs, ss = k_bs, k_ss) or v (v_bs, v_ss), its
  // kv head's offset not included: paged or not (no varlen).
  OPFORGE_HD int64_t kv_row(int64_t b, int64_t j, int64_t bs, int64_t ss) const {
    int64_t slot;
    const int64_t page = kv_page(b, j, slot);  // (sets slot first: the operands of + are unsequenced)
    return page * bs + slot * ss;
  }
  // Key j's (batch row or page, row in it): (b, j) unpaged. (32-bit arithmetic: keys < 2^31.)
  OPFORGE_HD int64_t kv_page(int64_t b, int64_t j, int64_t& slot) const {
    if (!block_table) return slot = j, b;
    const int32_t ps = static_cast<int32_t>(page_size), lp = static_cast<int32_t>(j) / ps;
    const int64_t page = block_table[b * table_bs + lp];
    slot = static_cast<int32_t>(j) - lp * ps;
    return page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page);
  }
  OPFORGE_HD int64_t lse_at(int64_t b, int64_t h) const {
    return pattern.varlen() ? h * pattern.total_q + pattern.q_start(b) : (b * heads + h) * pattern.sq;
  }
};

// The backward's extra inputs and outputs (strides in elements; dq, dk, dv like q, k, v).
struct AttentionGradParams {
  AttentionParams fwd;  // q, k, v, out (read), lse (read)
  const void* grad_out = nullptr;
  int64_t g_bs = 0, g_hs = 0, g_ss = 0;
  const void* grad_lse = nullptr;  // (B, Hq, Sq) contiguous like lse, or null
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t dq_bs = 0, dq_hs = 0, dq_ss = 0;
  int64_t dk_bs = 0, dk_hs = 0, dk_ss = 0;
  int64_t dv_bs = 0, dv_hs = 0, dv_ss = 0;

  // As AttentionParams' offsets, for grad_out, dq, dk and dv.
  OPFORGE_HD int64_t g_at(int64_t b, int64_t h) const {
    return fwd.pattern.tensor_batch(b) * g_bs + h * g_hs + fwd.pattern.q_start(b) * g_ss;
  }
  OPFORGE_HD int64_t dq_at(int64_t b, int64_t h) const {
    return fwd.pattern.tensor_batch(b) * dq_bs + h * dq_hs + fwd.pattern.q_start(b) * dq_ss;
  }
  OPFORGE_HD int64_t dk_at(int64_t b, int64_t hk) const {
    return fwd.pattern.tensor_batch(b) * dk_bs + hk * dk_hs + fwd.pattern.k_start(b) * dk_ss;
  }
  OPFORGE_HD int64_t dv_at(int64_t b, int64_t hk) const {
    return fwd.pattern.tensor_batch(b) * dv_bs + hk * dv_hs + fwd.pattern.k_start(b) * dv_ss;
  }
};

// Varlen on the GPU: each sequence's rows padded to whole tiles of `rows` in a layout where
// sequence b starts at row padded_start(b) = (cu[b] + rows b) rounded down to a multiple of rows
// (FlashAttention's): its tiles never overlap the next sequence's, and the layout has at most
// padded_rows(total, batch) rows. Kernels launch one block per padded tile and find their
// sequence by a binary search (padded_tile).
OPFORGE_HD int64_t padded_rows(int64_t total, int64_t batch, int64_t rows) {
  return (total + rows * batch + rows - 1) / rows * rows;
}
OPFORGE_HD int64_t padded_start(const int32_t* cu, int64_t total, int64_t b, int64_t rows) {
  return (AttentionPattern::clamp_row(cu[b], total) + rows * b) / rows * rows;
}
// The sequence (of `batch`, offsets cu into a packed dim of `total` rows, clamped as the pattern
// clamps them) whose padded rows hold padded tile `tile` (of `rows` rows), and the tile's index in
// that sequence; false where the tile is padding (past the sequence's last row).
OPFORGE_HD bool padded_tile(const int32_t* cu, int64_t total, int64_t batch, int64_t rows, int64_t tile,
                            int64_t& b, int64_t& local) {
  const int64_t row = tile * rows;
  int64_t lo = 0, hi = batch - 1;  // the last sequence starting at or before `row`
  if (batch <= 0 || padded_start(cu, total, 0, rows) > row) return false;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (padded_start(cu, total, mid, rows) <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  b = lo;
  local = (row - padded_start(cu, total, lo, rows)) / rows;
  const int64_t q0 = AttentionPattern::clamp_row(cu[lo], total),
                q1 = AttentionPattern::clamp_row(cu[lo + 1], total);
  return local * rows < q1 - q0;
}

}  // namespace opforge
