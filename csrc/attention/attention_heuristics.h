// attention: which kernel serves a call. One rule for the CPU and CUDA backends and for Python
// (opforge.attention asks it through the _attention_kernel op), and the named variants a caller
// may force with `variant=` (no torch types; the choice itself is in attention.cpp); and which form
// of the Hopper kernels serves it (HopperFwdForm, HopperBwdForm: each form one generated
// instantiation, csrc/attention/cuda/instantiations/; asked through _attention_form).
#pragma once

#include <algorithm>
#include <cstdint>

namespace opforge {

// The kernels, by what they are:
//   kTiled    the CPU's tiled kernel (query tiles x key tiles, online softmax);
//   kDecode   split-KV decode: few query rows (Sq x the GQA group) against many keys, the keys
//             spread over chunks whose partial softmax states merge in order (CPU and CUDA);
//   kHopper   CUDA, Hopper (sm_90a builds on sm_90 GPUs): TMA loads, wgmma, warp specialisation;
//   kMmaSync  CUDA, sm_80+: cp.async loads, mma.sync.
enum class AttentionKernel { kTiled, kDecode, kHopper, kMmaSync };

inline const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kTiled:
      return "tiled";
    case AttentionKernel::kDecode:
      return "decode";
    case AttentionKernel::kHopper:
      return "hopper";
    case AttentionKernel::kMmaSync:
      return "mma_sync";
  }
  return "?";
}

// The head dim the CUDA kernels run at: 64, 128 or 256 (the launcher zero-pads up to it; the Hopper
// kernels also run at 192: hopper_fwd_dims, attention_hopper_bwd_head_dim).
constexpr int64_t attention_cuda_head_dim(int64_t d) {
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

// The most query rows (Sq x the GQA group) a decode kernel takes per kv head. CUDA: 64 (four m16
// tiles on tensor cores) at head dims 64 and 128, 32 at 256 (a warp's 16 x 256 float outputs and
// four m tiles' scores would spill); CPU: 32.
constexpr int64_t attention_cuda_decode_max_rows(int64_t kernel_head_dim) {
  return kernel_head_dim == 256 ? 32 : 64;
}
constexpr int64_t kAttentionCpuDecodeMaxRows = 32;
// Below these many keys "auto" keeps a decoding-sized call on the tiled kernels (one chunk of keys
// gains nothing from the split and its merge): CUDA 512, CPU 257 (more than two 128-key blocks).
constexpr int64_t kAttentionCudaDecodeMinKeys = 512, kAttentionCpuDecodeMinKeys = 257;

// The head dims (q / k, v) the Hopper forward runs a call at. Its own (192, 128) and (192, 192)
// (FlashAttention-3's hdim 192 and hdim_v: DeepSeek's MLA) for q / k head dims 129-192 with v's up to
// 192, except with a block mask (not instantiated there), and (96, 96) for both in 65-96; else
// attention_cuda_head_dim of the wider of the two for both. The launcher zero-pads each operand up
// to its kernel's head dim.
struct HopperFwdDims {
  int64_t qk = 128, v = 128;
};
constexpr HopperFwdDims hopper_fwd_dims(int64_t head_dim, int64_t head_dim_v, bool block_mask) {
  if (head_dim > 128 && head_dim <= 192 && head_dim_v <= 192 && !block_mask) {
    return {192, head_dim_v <= 128 ? 128 : 192};
  }
  if (head_dim > 64 && head_dim <= 96 && head_dim_v > 64 && head_dim_v <= 96) return {96, 96};
  const int64_t d = attention_cuda_head_dim(std::max(head_dim, head_dim_v));
  return {d, d};
}

// The Hopper forward's key tile at its head dims (HopperFwdTraits: 64 rows at 256, 96 at (192, 192),
// else 128), and whether it reads a paged cache of this page size in place: a tile's rows in whole
// pages or a page's rows in whole tiles (its TMA boxes never cross a page), boxes of at least 8 rows
// (the 128-byte swizzle's 1024-byte pattern).
constexpr int64_t attention_hopper_fwd_block_n(HopperFwdDims dims) {
  return dims.qk == 256 ? 64 : dims.v == 192 ? 96 : 128;
}
constexpr bool attention_hopper_fwd_pages_at(int64_t page_size, int64_t block_n) {
  return page_size > 0 && (page_size % block_n == 0 || (block_n % page_size == 0 && page_size % 8 == 0));
}

// A call as the rule sees it.
struct AttentionCall {
  bool cuda = false;
  int64_t heads = 1, kv_heads = 1, sq = 0, sk = 0, head_dim = 0;
  int64_t head_dim_v = 0;  // v's (0: head_dim's)
  bool kv_lens = false;    // per-sequence key counts (every forward kernel takes them)
  int64_t page_size = 0;   // a paged cache's (0: not paged)
  bool backward = false;   // the backward's kernels (no decode kernel there)
  bool varlen = false;     // packed variable-length sequences: the tiled, Hopper and mma.sync kernels
  // CUDA: why the Hopper kernels cannot serve this call (no sm_90a code for this GPU in the build,
  // no Hopper kernel at this head dim), or null when they can.
  const char* hopper_missing = nullptr;
  // The pattern, as the Hopper forms see it (hopper_fwd_form, hopper_bwd_form; the kernel rule does
  // not read it): batch rows (varlen: sequences, sq and sk then their packed totals), the band's
  // reach (window_left, band_right: causal is 0; -1 unbounded), the prefix, whether segment ids and
  // a block mask come, and the backward's deterministic mode.
  int64_t batch = 1, window_left = -1, band_right = -1, prefix_len = 0;
  bool segments = false, block_mask = false, deterministic = false;

  int64_t rows() const { return sq * (kv_heads > 0 ? heads / kv_heads : 0); }
  int64_t decode_max_rows() const {
    return cuda ? attention_cuda_decode_max_rows(attention_cuda_head_dim(head_dim))
                : kAttentionCpuDecodeMaxRows;
  }
  // The Hopper forward's head dims for this call (hopper_fwd_dims).
  HopperFwdDims hopper_dims() const {
    return hopper_fwd_dims(head_dim, head_dim_v > 0 ? head_dim_v : head_dim, block_mask);
  }
  // Whether the Hopper forward reads this call's K / V: not paged, or pages its boxes tile.
  bool hopper_pages() const {
    return page_size == 0 ||
           attention_hopper_fwd_pages_at(page_size, attention_hopper_fwd_block_n(hopper_dims()));
  }
  // "auto"'s decode rule: few enough rows, and per-sequence counts or enough keys to split.
  bool decodes() const {
    return !backward && !varlen && rows() <= decode_max_rows() &&
           (kv_lens || sk >= (cuda ? kAttentionCudaDecodeMinKeys : kAttentionCpuDecodeMinKeys));
  }
};

// The keys a query row sees on average under a band (window_left, band_right: -1 unbounded) and a
// prefix (segments and block masks not counted), with sq queries against sk keys (varlen: a
// sequence's mean lengths), from 16 sampled rows.
inline double attention_mean_visible_keys(double sq, double sk, int64_t window_left, int64_t band_right,
                                          int64_t prefix_len) {
  if (sq <= 0 || sk <= 0) return 0;
  const double prefix = std::min<double>(static_cast<double>(prefix_len), sk), right = band_right;
  double sum = 0;
  for (int r = 0; r < 16; ++r) {
    const double pos = (r + 0.5) / 16 * sq + sk - sq;  // a query's position among the keys
    const double lo = std::max(0.0, window_left >= 0 ? pos - window_left : 0.0);
    const double hi = std::min(sk - 1, right >= 0 ? pos + right : sk - 1);
    // the band [lo, hi] and the prefix [0, prefix): the prefix below the band, the band, above it
    sum +=
        std::max(0.0, hi - lo + 1) + std::min(prefix, lo) + std::max(0.0, prefix - 1 - std::max(hi, lo - 1));
  }
  return sum / 16;
}

// The Hopper forward's schedule: the persistent kernel (a block a multiprocessor, walking the work
// items) where an item has few key tiles, else a block an item. A block's start and end cost about
// 7 K cycles (the forward's timeline, benchmarks/tuning/LOG.md), which the persistent kernel
// overlaps with the previous item's last tiles; on long items its consumers' 208 registers (232 a
// block an item) cost more than that (measured: causal S 4096, ~17 tiles an item, 3% slower; sliding
// window 512, ~5 tiles, 10% faster; 16 packed causal documents, ~5 tiles, 5% faster). Head dims 64
// and 128 without a block mask; segment ids (packed documents, whose lengths the host does not know)
// count as short.
constexpr double kHopperFwdPersistentMaxTiles = 8;
inline bool hopper_fwd_persistent(const AttentionCall& call) {
  if (call.hopper_dims().qk > 128 || call.hopper_dims().qk == 96 || call.block_mask) return false;
  if (call.segments) return true;
  const double n = static_cast<double>(std::max<int64_t>(call.batch, 1));
  const double sq = call.varlen ? static_cast<double>(call.sq) / n : static_cast<double>(call.sq);
  const double sk = call.varlen ? static_cast<double>(call.sk) / n : static_cast<double>(call.sk);
  // (a tile of 128 query rows spans its band's keys and 128 more)
  const double keys = attention_mean_visible_keys(sq, sk, call.window_left, call.band_right, call.prefix_len);
  return (keys + 128) / 128 <= kHopperFwdPersistentMaxTiles;
}

// The most items the runs of segment ids make (a run a row: heads x padded tiles of batch x sq rows
// in batch x sq runs).
constexpr int64_t hopper_fwd_run_items(int64_t batch, int64_t sq, int64_t heads) {
  return heads * (batch * sq + batch * sq / 128 + 2);
}
// Segment ids the persistent forward may take as documents (its items then the runs of equal ids,
// as varlen sequences, instead of query blocks whose tiles straddle them): Sq = Sk, no prefix;
// whether they are runs (q's ids equal to kv's, never decreasing along a row) the device finds
// (attention_segment_runs.cuh), the kernel reading it (otherwise it attends by segment as before).
// Its items and the batch x sq rows' offsets fit int32.
inline bool hopper_fwd_runs(const AttentionCall& call) {
  return hopper_fwd_persistent(call) && call.segments && !call.varlen && call.sq == call.sk &&
         call.prefix_len == 0 && !call.kv_lens &&
         hopper_fwd_run_items(call.batch, call.sq, call.heads) <
             (int64_t{1} << 31) - (int64_t{1} << 20);  // (items, offsets in int32)
}

// The Hopper forward's form: which of its instantiations serves a call (each a traits struct of
// attention_fwd_hopper_kernel.cuh).
struct HopperFwdForm {
  int head_dim = 128;    // the kernel's q / k head dim: 64, 128, 192 or 256
  int head_dim_v = 128;  // v's (hopper_fwd_dims)
  // Per-sequence key counts (kv_lens) or a paged cache: K / V tiles a page run at a time, the rows
  // past a sequence's count zeroed in V (the one-item kernel).
  bool kv_cache = false;
  bool block_mask = false;    // a partial block-mask tile's bits staged by the producer
  bool persistent = false;    // a block a multiprocessor walking the work items (hopper_fwd_persistent)
  bool segment_runs = false;  // (persistent) segment ids as documents where they are runs (hopper_fwd_runs)

  // The fields packed in one int (the instantiations' switch: run_attention_hopper_fwd_form).
  constexpr int key() const {
    return ((((head_dim * 512 + head_dim_v) * 2 + kv_cache) * 2 + block_mask) * 2 + persistent) * 2 +
           segment_runs;
  }
  const char* name() const {
    if (persistent) return segment_runs ? "hopper/persistent_runs" : "hopper/persistent";
    if (kv_cache) return block_mask ? "hopper/cache_mask" : "hopper/cache";
    return block_mask ? "hopper/mask" : "hopper";
  }
};
inline HopperFwdForm hopper_fwd_form(const AttentionCall& call) {
  HopperFwdForm f;
  const HopperFwdDims dims = call.hopper_dims();
  f.head_dim = static_cast<int>(dims.qk), f.head_dim_v = static_cast<int>(dims.v);
  f.kv_cache = call.kv_lens || call.page_size > 0;
  f.block_mask = call.block_mask;
  f.persistent = !f.kv_cache && !f.block_mask && hopper_fwd_persistent(call);
  f.segment_runs = f.persistent && hopper_fwd_runs(call);
  return f;
}

// The head dim the Hopper backward runs at: 64, 128, 192 (its head-dim layout's thirds) or 256, the
// operands zero-padded up to it (the mma.sync backward: attention_cuda_head_dim's).
constexpr int64_t attention_hopper_bwd_head_dim(int64_t d) {
  return d <= 128 ? attention_cuda_head_dim(d) : d <= 192 ? 192 : 256;
}

// The head dims (q / k, v) the Hopper backward runs a call at: its own (192, 128) for q / k head dims
// 129-192 with v's up to 128 (DeepSeek's MLA), else attention_hopper_bwd_head_dim of the wider for
// both (operands zero-padded up to them).
constexpr HopperFwdDims hopper_bwd_dims(int64_t head_dim, int64_t head_dim_v) {
  if (head_dim > 128 && head_dim <= 192 && head_dim_v <= 128) return {192, 128};
  const int64_t d = attention_hopper_bwd_head_dim(std::max(head_dim, head_dim_v));
  return {d, d};
}

// The Hopper backward's form.
struct HopperBwdForm {
  int head_dim = 128;
  int head_dim_v = 128;  // (hopper_bwd_dims)
  // (head dims 64, 128) a partial block-mask tile's bits staged by the producer; at 192 and 256 the
  // plain form reads them from global memory (its two Q / dO stages leave no room).
  bool block_mask = false;
  // (head dims 192, 256) the deterministic mode's own kernel: one Q / dO stage, dQ staged for warp
  // 1's ordered reductions (the plain one adds dQ from registers); at 64 and 128 the plain kernels
  // order their additions themselves, given the counters.
  bool deterministic = false;

  // The fields packed in one int (the instantiations' switch: run_attention_hopper_bwd_form).
  constexpr int key() const { return ((head_dim * 512 + head_dim_v) * 2 + block_mask) * 2 + deterministic; }
  const char* name() const {
    return deterministic ? "hopper/deterministic" : block_mask ? "hopper/mask" : "hopper";
  }
};
inline HopperBwdForm hopper_bwd_form(const AttentionCall& call) {
  HopperBwdForm f;
  const HopperFwdDims dims =
      hopper_bwd_dims(call.head_dim, call.head_dim_v > 0 ? call.head_dim_v : call.head_dim);
  f.head_dim = static_cast<int>(dims.qk), f.head_dim_v = static_cast<int>(dims.v);
  f.block_mask = call.block_mask && f.head_dim <= 128;
  f.deterministic = call.deterministic && f.head_dim >= 192;
  return f;
}

}  // namespace opforge
