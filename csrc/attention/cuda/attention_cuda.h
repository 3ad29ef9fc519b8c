// attention CUDA: what the launcher (attention_cuda.cpp) hands the kernels' translation units (one
// generated .cu per instantiation: instantiations/attention_instantiations.h declares them), with no
// torch types.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/attention_heuristics.h"
#include "attention/attention_params.h"
#include "common/cuda/math_constants.h"

namespace opforge {

// The call as the kernels read it. Operands are 16-bit (float16 / bfloat16), head_dim is the
// kernel's (64, 128, 192 or 256, and the Hopper forward's v its own: the launcher zero-pads other
// head dims), rows of q, k, v, out (and of
// the gradients) start at 16-byte boundaries with unit column stride, and Sq + Sk < 2^31.
struct AttentionCudaArgs {
  AttentionGradParams g;  // g.fwd: the forward's parameters; the rest for the backward only
  float scale = 0.f;
  float scale_log2 = 0.f;      // scale * log2(e)
  float cap_log2 = 0.f;        // softcap * log2(e); 0: no softcap
  float cap_inv_scale = 0.f;   // scale / softcap
  float inv_cap_log2 = 0.f;    // 1 / (softcap * log2(e))
  int num_sms = 0;             // the GPU's multiprocessors (the persistent forward's grid)
  int* fwd_counter = nullptr;  // a zeroed int: the persistent forward's work counter (else unused)
  // (the persistent forward's segment-runs form, HopperFwdForm::segment_runs) p.batch * p.pattern.sq + 3
  // int32s: segment ids as documents, written on the device by its first kernel (valid flag, run count,
  // offsets; attention_segment_runs.cuh) and read by the attention kernel; else null
  int32_t* seg_runs = nullptr;
  // Backward scratch, (B, Hq, lse2_ld) each: lse * log2(e) (+inf for rows that see nothing), and
  // rowsum(dO * O) - grad_lse. Varlen: (1, Hq, lse2_ld), each sequence's rows at its padded start
  // (padded_start, in tiles of 128).
  float* lse2 = nullptr;
  float* delta = nullptr;
  // Their row length: Sq rounded up to 128; varlen: padded_rows(total_q, B, 128). Padding rows:
  // lse2 +inf, delta 0.
  int64_t lse2_ld = 0;
  // The Hopper backward's dQ workspace, (B, Hq, lse2_ld, head_dim) float32 (the prep kernel zeroes
  // it), or null for the mma.sync passes.
  float* dq_accum = nullptr;
  // Deterministic mode of the Hopper backward: (B, Hq, lse2_ld / its query tile) zeroed counters
  // that order the dQ additions; null: additions in any order (fast).
  int* dq_semaphore = nullptr;
  // Deterministic mode with varlen: a zeroed int the prep kernel sets when the offsets are not a
  // valid partition (start 0, never decreasing, none past the packed length: a padded batch's
  // last offsets may end before it), which only a CUDA-graph
  // replay can bring (the host checks them otherwise). The backward then adds dQ in any order: with
  // such offsets sequences' tiles may share a counter or have no block, and ordered additions would
  // wait forever.
  int* offsets_invalid = nullptr;

  // The scratch row of batch row b's (sequence b's) query 0 of head h (in lse2, delta; times the head
  // dim in dq_accum).
  OPFORGE_HD int64_t ws_row(int64_t b, int64_t h) const {
    const AttentionPattern& pat = g.fwd.pattern;
    return pat.varlen() ? h * lse2_ld + padded_start(pat.cu_seqlens_q, pat.total_q, b, 128)
                        : (b * g.fwd.heads + h) * lse2_ld;
  }
};

// The scale and softcap in the forms the kernels read (a.scale, a.scale_log2, and with a softcap
// cap_log2, cap_inv_scale, inv_cap_log2): one place sets them, for the launchers and the tuning
// harnesses alike.
inline void set_scale_args(AttentionCudaArgs& a, double scale, double softcap) {
  using cuda::kLog2e;
  a.scale = static_cast<float>(scale);
  a.scale_log2 = static_cast<float>(scale * kLog2e);
  a.cap_log2 = a.cap_inv_scale = a.inv_cap_log2 = 0.f;
  if (softcap > 0.0) {
    a.cap_log2 = static_cast<float>(softcap * kLog2e);
    a.cap_inv_scale = static_cast<float>(scale / softcap);
    a.inv_cap_log2 = static_cast<float>(1.0 / (softcap * kLog2e));
  }
}

// The (batch row, tile) of a block in a grid over tiles of `rows` queries (keys: keys) and batch
// rows: without varlen the grid's x is the tile and z the batch row; with it, x runs over the padded
// tiles of the packed dim (padded_tile) and z is 1. False: a padding block (nothing to do).
OPFORGE_HD bool block_tile(const AttentionParams& p, bool keys, int64_t rows, int64_t x, int64_t z,
                           int64_t& b, int64_t& tile) {
  const AttentionPattern& pat = p.pattern;
  if (!pat.varlen()) {
    b = z, tile = x;
    return true;
  }
  return keys ? padded_tile(pat.cu_seqlens_k, pat.total_k, p.batch, rows, x, b, tile)
              : padded_tile(pat.cu_seqlens_q, pat.total_q, p.batch, rows, x, b, tile);
}
// The grid's x and z for block_tile.
inline void tile_grid(const AttentionParams& p, bool keys, int64_t rows, int64_t& x, int64_t& z) {
  const AttentionPattern& pat = p.pattern;
  if (pat.varlen()) {
    x = padded_rows(keys ? pat.total_k : pat.total_q, p.batch, rows) / rows, z = 1;
  } else {
    x = ((keys ? pat.sk : pat.sq) + rows - 1) / rows, z = p.batch;
  }
}

// The decode path's split (attention_decode_kernel.cuh). Each (batch, kv head) spreads the 64-key
// tiles its queries may see over chunks, one block each. The rows run on tensor cores as one, two or
// four m16 tiles (kDecodeMmaRows rows each), the block's four warps sharing each tile's keys four,
// two or one ways (combined in the block). Two forms:
//   - uniform (no per-sequence key counts): every (batch, kv head) takes `chunks` chunks, the grid
//     (chunks, kv heads, batch);
//   - by the tokens present (kv_lens, which only the device reads): `blocks` blocks in a flat grid,
//     each finding its (sequence, kv head, chunk) from a prefix sum of the sequences' chunk counts
//     over kv_lens (every block computes the same sums), with chunks of about the same number of
//     tiles however long each sequence is: the visible tiles of all sequences over `target` blocks, at
//     least `min_tiles` a chunk, at least one chunk a sequence. `chunks` is then the most a sequence
//     can take (the workspace's stride), and sequence b's count goes to counts[b] for the merge.
// part: each block's partial states, (B, Hkv, chunks, rows) x decode_part_stride(head_dim) floats
// (output, max, sum).
constexpr int kDecodeTile = 64, kDecodeMmaRows = 16;
// The fewest tiles a chunk takes, and the waves of resident blocks the tokens-present split aims at
// (more, smaller chunks even out the blocks' ends; each costs its staging's fill and a partial state).
// Four, measured on the H200 (decode_variants.py, one run): the ragged B16 x U(100, 16k) row 158 us
// against 171 at two and 187 at one; equal lengths through kv_lens 311 us at B8 x 32k (346 at two; the
// uniform split without kv_lens, one round of 86 tiles, 300) and 178 at B64 x 2k (181 at two). A cost
// over whole rounds that also finds the uniform split's choice is next (LOG.md "Serving (issue 47),
// session 2").
constexpr int kDecodeMinTiles = 2, kDecodeWaves = 4;
struct DecodeSplit {
  float* part = nullptr;
  int chunks = 1, rows = 0;
  int64_t blocks = 0;  // the tokens-present form's grid; 0: the uniform form
  int64_t target = 0;  // its blocks aimed at
  int min_tiles = kDecodeMinTiles;
  int32_t* counts = nullptr;  // its (B,) chunk counts (written by the decode kernel, read by the merge)
};

// Floats a partial state takes in the workspace: the output, max, sum and two of padding (rows
// 16-byte aligned for the merge's vector loads).
constexpr int decode_part_stride(int head_dim) {
  return head_dim + 4;
}

// The most query rows (the GQA group x Sq) a decode block takes (attention_heuristics.h).
constexpr int decode_max_rows(int head_dim) {
  return static_cast<int>(attention_cuda_decode_max_rows(head_dim));
}

// The split for `slots` resident decode blocks on the GPU. Uniform: the chunk count (each of at
// least min_tiles tiles) whose waves of blocks x (tiles a block + one for its fill and merge state)
// is least, so that the last wave is not mostly idle (B64 x 2k keys, 512 (batch, kv head) pairs on
// 396 slots: 3 chunks of 11 tiles in 4 waves, not 1 chunk of 32 tiles in 2). Tokens present: `waves`
// waves of blocks, and a grid that holds every block the device can ask for (the sum over sequences of
// ceil(tiles / a chunk's) <= target / Hkv + B).
inline DecodeSplit decode_split(const AttentionParams& p, int64_t slots, int waves = kDecodeWaves) {
  DecodeSplit s;
  const AttentionPattern& pat = p.pattern;
  int64_t lo, hi;
  band_key_range(pat, 0, pat.sq, lo, hi);
  // (With per-sequence counts a band's keys sit elsewhere: its width is the same, one tile more.)
  int64_t tiles = hi <= lo ? 0 : (hi + kDecodeTile - 1) / kDecodeTile - lo / kDecodeTile;
  if (pat.kv_lens) tiles = std::min<int64_t>(tiles + 1, (pat.sk + kDecodeTile - 1) / kDecodeTile);
  const int64_t pairs = std::max<int64_t>(p.batch * p.kv_heads, 1);
  slots = std::max<int64_t>(slots, 1);
  s.rows = static_cast<int>((p.heads / p.kv_heads) * pat.sq);
  const int64_t most = std::max<int64_t>(1, tiles / s.min_tiles);
  if (pat.kv_lens) {
    s.target = slots * std::max(waves, 1);
    const int64_t chunks = std::min<int64_t>((tiles + s.min_tiles - 1) / s.min_tiles,
                                             (s.target + p.kv_heads - 1) / std::max<int64_t>(p.kv_heads, 1));
    s.chunks = static_cast<int>(std::max<int64_t>(1, chunks));
    s.blocks = std::min<int64_t>(s.target + pairs, pairs * s.chunks);
    return s;
  }
  int64_t best = 1, best_cost = -1;
  for (int64_t c = 1; c <= std::min<int64_t>(most, 4 * slots / pairs + 1); ++c) {
    const int64_t cost = (pairs * c + slots - 1) / slots * ((tiles + c - 1) / c + 1);
    if (best_cost < 0 || cost < best_cost) best = c, best_cost = cost;
  }
  s.chunks = static_cast<int>(best);
  return s;
}

}  // namespace opforge
