// attention: which kernel serves a call. One rule for the CPU and CUDA backends and for Python
// (opforge.attention asks it through the _attention_kernel op), and the named variants a caller
// may force with `variant=` (no torch types; the choice itself is in attention.cpp).
#pragma once

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

// The head dim the CUDA kernels run at: 64, 128 or 256 (the launcher zero-pads up to it).
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

// The Hopper forward's key tile at a kernel head dim (HopperFwdTraits: 64 rows at 256, else 128),
// and whether it reads a paged cache of this page size in place: a tile's rows in whole pages or a
// page's rows in whole tiles (its TMA boxes never cross a page), boxes of at least 8 rows (the 128-byte
// swizzle's 1024-byte pattern).
constexpr int64_t attention_hopper_fwd_block_n(int64_t kernel_head_dim) {
  return kernel_head_dim == 256 ? 64 : 128;
}
constexpr bool attention_hopper_fwd_pages(int64_t page_size, int64_t kernel_head_dim) {
  const int64_t bn = attention_hopper_fwd_block_n(kernel_head_dim);
  return page_size > 0 && (page_size % bn == 0 || (bn % page_size == 0 && page_size % 8 == 0));
}

// A call as the rule sees it.
struct AttentionCall {
  bool cuda = false;
  int64_t heads = 1, kv_heads = 1, sq = 0, sk = 0, head_dim = 0;
  bool kv_lens = false;   // per-sequence key counts (every forward kernel takes them)
  int64_t page_size = 0;  // a paged cache's (0: not paged)
  bool backward = false;  // the backward's kernels (no decode kernel there)
  bool varlen = false;    // packed variable-length sequences: the tiled, Hopper and mma.sync kernels
  // CUDA: why the Hopper kernels cannot serve this call (no sm_90a code for this GPU in the build,
  // no Hopper kernel at this head dim), or null when they can.
  const char* hopper_missing = nullptr;

  int64_t rows() const { return sq * (kv_heads > 0 ? heads / kv_heads : 0); }
  int64_t decode_max_rows() const {
    return cuda ? attention_cuda_decode_max_rows(attention_cuda_head_dim(head_dim))
                : kAttentionCpuDecodeMaxRows;
  }
  // Whether the Hopper forward reads this call's K / V: not paged, or pages its boxes tile.
  bool hopper_pages() const {
    return page_size == 0 || attention_hopper_fwd_pages(page_size, attention_cuda_head_dim(head_dim));
  }
  // "auto"'s decode rule: few enough rows, and per-sequence counts or enough keys to split.
  bool decodes() const {
    return !backward && !varlen && rows() <= decode_max_rows() &&
           (kv_lens || sk >= (cuda ? kAttentionCudaDecodeMinKeys : kAttentionCpuDecodeMinKeys));
  }
};

}  // namespace opforge
