// attention CUDA: what the launcher (attention_cuda.cpp) hands the kernels' translation units
// (one .cu per pass and head dim), with no torch types.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/attention_heuristics.h"
#include "attention/attention_params.h"

namespace opforge {

// The call as the kernels read it. Operands are 16-bit (float16 / bfloat16), head_dim is the
// kernel's (64, 128 or 256: the launcher zero-pads other head dims), rows of q, k, v, out (and of
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
  // (the persistent forward, hopper_fwd_runs) segment ids as documents, written on the device by
  // run_attention_segment_runs: valid flag, run count, offsets; else null
  const int32_t* seg_runs = nullptr;
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
  // valid partition (start 0, never decreasing, ending at the packed length), which only a CUDA-graph
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
// tiles its queries may see over `chunks` blocks (a block finds its own tiles: with per-sequence key
// counts only the device knows where they are). The rows run on tensor cores as one, two or four
// m16 tiles (kDecodeMmaRows rows each), the block's four warps sharing each tile's keys four, two
// or one ways (combined in the block). part: each block's partial states, (B, Hkv, chunks, rows) x
// decode_part_stride(head_dim) floats (output, max, sum).
constexpr int kDecodeTile = 64, kDecodeMmaRows = 16;
struct DecodeSplit {
  float* part = nullptr;
  int chunks = 1, rows = 0;
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

// The split for `slots` resident decode blocks on the GPU: enough chunks to fill them once, each of
// at least two tiles.
inline DecodeSplit decode_split(const AttentionParams& p, int64_t slots) {
  DecodeSplit s;
  const AttentionPattern& pat = p.pattern;
  int64_t lo, hi;
  band_key_range(pat, 0, pat.sq, lo, hi);
  // (With per-sequence counts a band's keys sit elsewhere: its width is the same, one tile more.)
  int64_t tiles = hi <= lo ? 0 : (hi + kDecodeTile - 1) / kDecodeTile - lo / kDecodeTile;
  if (pat.kv_lens) tiles = std::min<int64_t>(tiles + 1, (pat.sk + kDecodeTile - 1) / kDecodeTile);
  const int64_t pairs = p.batch * p.kv_heads;
  s.chunks = static_cast<int>(std::max<int64_t>(1, std::min(slots / std::max<int64_t>(pairs, 1), tiles / 2)));
  s.rows = static_cast<int>((p.heads / p.kv_heads) * pat.sq);
  return s;
}

// The keys a query row of `pat` sees on average (band and prefix; segments and block masks not
// counted), with sq queries against sk keys (varlen: a sequence's mean lengths), from 16 sampled rows.
inline double attention_mean_visible_keys(const AttentionPattern& pat, double sq, double sk) {
  if (sq <= 0 || sk <= 0) return 0;
  const double prefix = std::min<double>(static_cast<double>(pat.prefix_len), sk), right = pat.band_right();
  double sum = 0;
  for (int r = 0; r < 16; ++r) {
    const double pos = (r + 0.5) / 16 * sq + sk - sq;  // a query's position among the keys
    const double lo = std::max(0.0, pat.window_left >= 0 ? pos - pat.window_left : 0.0);
    const double hi = std::min(sk - 1, right >= 0 ? pos + right : sk - 1);
    // the band [lo, hi] and the prefix [0, prefix): the prefix below the band, the band, above it
    sum +=
        std::max(0.0, hi - lo + 1) + std::min(prefix, lo) + std::max(0.0, prefix - 1 - std::max(hi, lo - 1));
  }
  return sum / 16;
}

// The Hopper forward's schedule (one rule, for the launcher that gives the persistent kernel its
// counter and for the kernels' translation units): the persistent kernel (a block a multiprocessor,
// walking the work items) where an item has few key tiles, else a block an item. A block's start
// and end cost about 7 K cycles (the forward's timeline, benchmarks/tuning/LOG.md), which the
// persistent kernel overlaps with the previous item's last tiles; on long items its consumers' 208
// registers (232 a block an item) cost more than that (measured: causal S 4096, ~17 tiles an item,
// 3% slower; sliding window 512, ~5 tiles, 10% faster; 16 packed causal documents, ~5 tiles, 5%
// faster). Head dims 64 and 128 without a block mask; segment ids (packed documents, whose lengths
// the host does not know) count as short.
constexpr double kHopperFwdPersistentMaxTiles = 8;
inline bool hopper_fwd_persistent(const AttentionParams& p, int head_dim) {
  const AttentionPattern& pat = p.pattern;
  if (head_dim > 128 || pat.mask_kinds != nullptr) return false;
  if (pat.q_segments != nullptr) return true;
  const double n = static_cast<double>(std::max<int64_t>(p.batch, 1));
  const double sq = pat.varlen() ? static_cast<double>(pat.total_q) / n : static_cast<double>(pat.sq);
  const double sk = pat.varlen() ? static_cast<double>(pat.total_k) / n : static_cast<double>(pat.sk);
  // (a tile of 128 query rows spans its band's keys and 128 more)
  return (attention_mean_visible_keys(pat, sq, sk) + 128) / 128 <= kHopperFwdPersistentMaxTiles;
}

// The most items the runs of p's segment ids make (a run a row: heads x padded tiles of B x S rows
// in B x S runs).
inline int64_t hopper_fwd_run_items(const AttentionParams& p) {
  const int64_t n = p.batch * p.pattern.sq;
  return p.heads * (n + n / 128 + 2);
}
// Segment ids the persistent forward may take as documents (its items then the runs of equal ids,
// as varlen sequences, instead of query blocks whose tiles straddle them): Sq = Sk, no prefix;
// whether they are runs (q's ids equal to kv's, never decreasing along a row) the device finds
// (run_attention_segment_runs), the kernel reading it (otherwise it attends by segment as before).
// Its items and the B x S rows' offsets fit int32.
inline bool hopper_fwd_runs(const AttentionParams& p, int head_dim) {
  const AttentionPattern& pat = p.pattern;
  return hopper_fwd_persistent(p, head_dim) && pat.q_segments != nullptr && !pat.varlen() &&
         pat.sq == pat.sk && pat.prefix_len == 0 && pat.kv_lens == nullptr &&
         hopper_fwd_run_items(p) < (int64_t{1} << 31) - (int64_t{1} << 20);  // (items, offsets in int32)
}

// Launchers, on `stream`; each returns a cudaError_t (cudaErrorNoKernelImageForDevice where the
// binary has no sm_80+ code for this GPU).
// The forward on `kernel` (kHopper or kMmaSync, as the rule chose).
int run_attention_fwd_cuda(const AttentionCudaArgs& a, int head_dim, AttentionKernel kernel, void* stream);
// The backward: prep, then on `kernel` the one-pass kernel and its dQ conversion (kHopper: head
// dims 64 and 128), or the dK/dV and dQ passes (kMmaSync).
int run_attention_bwd_cuda(const AttentionCudaArgs& a, int head_dim, AttentionKernel kernel, void* stream);
// cudaSuccess where this binary runs the Hopper kernels on the current GPU (sm_90a code on an sm_90
// GPU), cudaErrorNoKernelImageForDevice where it does not.
int attention_hopper_status();
// The Hopper forward (sm_90a; TMA needs positive 16-byte strides, which the launcher gives it):
// cudaErrorNoKernelImageForDevice without its code.
int run_attention_fwd_hopper_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_d256(const AttentionCudaArgs& a, void* stream);
// Its persistent form (hopper_fwd_persistent; needs a.fwd_counter and a.num_sms).
int run_attention_fwd_hopper_persistent_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_persistent_d128(const AttentionCudaArgs& a, void* stream);
// The Hopper backward (needs a.dq_accum), same return values.
int run_attention_bwd_hopper_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_hopper_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_hopper_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_kv_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_kv_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_kv_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_q_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_q_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_q_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_prep(const AttentionCudaArgs& a, void* stream);
// Segment ids' runs into ws (p.batch * p.pattern.sq + 3 int32s; attention_segment_runs.cu).
int run_attention_segment_runs(const AttentionParams& p, int32_t* ws, void* stream);
// The decode path (sm_80+): split-KV kernel, then the chunks' merge; and how many decode blocks of
// `rows` query rows an SM holds at once (0 where the binary has no kernel for this GPU).
int run_attention_decode_d64(const AttentionCudaArgs& a, const DecodeSplit& s, void* stream);
int run_attention_decode_d128(const AttentionCudaArgs& a, const DecodeSplit& s, void* stream);
int run_attention_decode_d256(const AttentionCudaArgs& a, const DecodeSplit& s, void* stream);
int attention_decode_blocks_per_sm_d64(int rows);
int attention_decode_blocks_per_sm_d128(int rows);
int attention_decode_blocks_per_sm_d256(int rows);

}  // namespace opforge
