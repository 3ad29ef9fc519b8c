// attention: what the CPU and CUDA entries share (checks, output allocation, parameters).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "attention/attention_heuristics.h"
#include "attention/attention_params.h"

namespace opforge {

// The pattern arguments of the schema, as the ops take them.
struct AttentionPatternArgs {
  bool causal = false;
  int64_t window_left = -1, window_right = -1, prefix_len = 0;
  std::optional<at::Tensor> q_segments, kv_segments;
  std::optional<at::Tensor> mask_kinds, mask_index, mask_bits;
  int64_t block_q = 128, block_k = 128;
  std::optional<at::Tensor> kv_lens;  // (B,) per-sequence key counts (the forward's)
  // (B + 1,) offsets of packed variable-length sequences (varlen) along q's and k's sequence dims,
  // in a batch of one; int32 or int64 (the plan makes int32 copies).
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k;
  // (Hq,) attention sinks: a logit each query head's rows take in their softmax, with no value.
  std::optional<at::Tensor> sinks;
  bool varlen() const { return cu_seqlens_q.has_value(); }
};

// The schema's pattern arguments gathered (every backend's entry takes them one by one).
AttentionPatternArgs attention_pattern_args(bool causal, int64_t window_left, int64_t window_right,
                                            int64_t prefix_len, const std::optional<at::Tensor>& q_segments,
                                            const std::optional<at::Tensor>& kv_segments,
                                            const std::optional<at::Tensor>& mask_kinds,
                                            const std::optional<at::Tensor>& mask_index,
                                            const std::optional<at::Tensor>& mask_bits, int64_t block_q,
                                            int64_t block_k);

// The LSE's dtype: float32, float64 for float64 inputs.
inline at::ScalarType attention_lse_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Raise an error naming opforge.attention and the argument on bad input (fp8: q, k, v in
// float8_e4m3fn, opforge::attention_fp8's).
void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            double softcap, const AttentionPatternArgs& pattern, bool fp8 = false);
void check_attention_backward_inputs(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                     const std::optional<at::Tensor>& grad_lse, double scale, double softcap,
                                     const AttentionPatternArgs& pattern);

// Varlen: the offsets' values read on the host (a copy from the GPU, so a synchronization; the CUDA
// entries skip it while a CUDA graph is being captured, where the kernels' clamping keeps every
// access inside the tensors): a ValueError naming `op` unless each starts at 0, never decreases and
// ends at most at its packed dim's length (rows past the last offset belong to no sequence: the
// padding of a padded batch, as FlashAttention allows).
// Returns the last offsets (the rows in sequences), or (total_q, total_k) without varlen.
std::pair<int64_t, int64_t> check_varlen_offsets(const char* op, const AttentionPatternArgs& pattern,
                                                 int64_t total_q, int64_t total_k);

// Varlen: t's rows (dim 2 of a (1, H, total, ...) tensor) past the last offset, which belong to no
// sequence and no kernel writes, set to `value` (outputs and gradients 0, the LSE -inf): `rows` the
// last offset as check_varlen_offsets read it (only the rows past it are written, none when there are
// none), or, where the offsets were not read (a CUDA graph's capture), nullopt: then every row is
// compared with cu_seqlens[-1] on t's device.
void fill_rows_past_offsets(const at::Tensor& t, std::optional<int64_t> rows, const at::Tensor& cu_seqlens,
                            double value);

// The kernel that serves `call` under `variant` ("auto": the rule of attention_heuristics.h; a named
// kernel that cannot serve the call raises a ValueError naming `op` and saying why).
AttentionKernel choose_attention_kernel(const char* op, const AttentionCall& call, c10::string_view variant);
// The call as the rule sees it (hopper_missing left for the CUDA launcher to fill in).
AttentionCall attention_call(const at::Tensor& q, const at::Tensor& k, bool kv_lens, bool backward,
                             bool varlen = false);
// CUDA builds: why the Hopper kernels cannot serve a call on `device` (the current one when it has
// no index), or null when they can.
const char* attention_hopper_missing(at::Device device);

// The op a user called, for messages: packed sequences come from opforge.attention_varlen.
inline constexpr const char* kAttentionOp = "opforge.attention";
inline const char* attention_op_name(const AttentionPatternArgs& args) {
  return args.varlen() ? "opforge.attention_varlen" : kAttentionOp;
}

// A tensor of `like`'s shape whose memory follows like's order of the (S, H) dims: (B, S, H, D)
// underneath when like is such a transposed view (as transformers passes q, k, v) or when
// `sequence_major` says so (packed sequences: attention_varlen's (total, H, D) output contiguous),
// else contiguous (B, H, S, D).
// head_dim: the new tensor's last dim (-1: like's; the output takes v's).
// (dtype: the output's, where it is not like's: the FP8 forward's bfloat16)
at::Tensor empty_attention_like(const at::Tensor& like, bool sequence_major = false, int64_t head_dim = -1,
                                std::optional<at::ScalarType> dtype = std::nullopt);

// v's head dim differing from q's and k's (DeepSeek's MLA: 192 and 128): the CPU kernels take one head
// dim, so the CPU entries zero-pad the narrower side to the wider (zero columns of q and k add nothing
// to the scores; zero columns of v give zero columns of the output and of dv) and cut the results back
// (the CUDA launcher pads each operand to its kernel's head dim itself).
at::Tensor pad_head_dim(const at::Tensor& t, int64_t head_dim);

// A backend's entry at one head dim when v's differs (pad_head_dim): `run` (the entry itself) on the
// padded tensors, the results cut back into tensors laid out as the entry lays out its own.
template <typename F>
std::tuple<at::Tensor, at::Tensor> attention_at_one_head_dim(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, bool varlen, F&& run) {
  const int64_t d = std::max(q.size(3), v.size(3));
  const auto [o, lse] = run(pad_head_dim(q, d), pad_head_dim(k, d), pad_head_dim(v, d));
  at::Tensor out = empty_attention_like(q, varlen, v.size(3));
  out.copy_(o.narrow(3, 0, v.size(3)));
  return {out, lse};
}
template <typename F>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_at_one_head_dim(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, F&& run) {
  const int64_t d = std::max(q.size(3), v.size(3));
  const auto [gq, gk, gv, gs] = run(pad_head_dim(grad_out, d), pad_head_dim(q, d), pad_head_dim(k, d),
                                    pad_head_dim(v, d), pad_head_dim(out, d));
  at::Tensor dq = empty_attention_like(q), dk = empty_attention_like(k), dv = empty_attention_like(v);
  dq.copy_(gq.narrow(3, 0, q.size(3)));
  dk.copy_(gk.narrow(3, 0, k.size(3)));
  dv.copy_(gv.narrow(3, 0, v.size(3)));
  return {dq, dk, dv, gs};
}

// The kernels' view of the call. The segment ids (as int64) and the mask tensors are kept alive
// (contiguous copies where needed) by `keep`.
struct AttentionPlan {
  AttentionParams params;
  at::Tensor q_segments, kv_segments;     // the int64 ids the pattern points to (undefined: none)
  at::Tensor kv_lens;                     // the int64 counts it points to (undefined: none)
  at::Tensor cu_seqlens_q, cu_seqlens_k;  // varlen: the int32 offsets it points to (undefined: none)
  at::Tensor sinks;                       // the sinks in the accumulation type (undefined: none)
  std::vector<at::Tensor> keep;
};
// opforge::attention's pattern arguments, key counts and packed-sequence offsets as the pattern the
// backends read, checked with q, k, v, the scale and the softcap (check_attention_inputs): the first
// step of the op's entries and of its check op.
AttentionPatternArgs checked_attention_args(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap, bool causal,
    int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& sinks = std::nullopt,
    bool fp8 = false);
AttentionPlan plan_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& out, const at::Tensor& lse, double scale, double softcap,
                             const AttentionPatternArgs& pattern);

// opforge::attention_paged's inputs checked (q (B, Hq, Sq, D); caches (num_pages, page_size, Hkv, D);
// kv_lens (B,); block_table (B, max_pages) int32), and the plan the decode kernels read: k and v as
// (B, Hkv, max_pages x page_size, D) that the page table addresses (AttentionParams::block_table).
AttentionPlan plan_paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& kv_lens, const at::Tensor& block_table,
                                   const at::Tensor& out, const at::Tensor& lse, double scale, double softcap,
                                   bool causal, int64_t window_left, int64_t window_right, int64_t prefix_len,
                                   const std::optional<at::Tensor>& sinks);
// The logical (B, Hkv, max_pages x page_size, D) shape of a paged call's k as a view with no extent
// (batch and key strides 0), for the checks and the rule that read sizes.
at::Tensor paged_view(const at::Tensor& cache, int64_t batch, int64_t keys);
// The page table as the kernels read it: int32 (int64 entries clamped into [0, num_pages) first, as
// the kernels clamp the entries they read).
at::Tensor int32_block_table(const at::Tensor& block_table, int64_t num_pages);
// A paged call whose kernel does not read the pages in place (the backends decide): each sequence's
// pages gathered into one (B, Hkv, max_pages x page_size, D) copy (one more read and write of them),
// then opforge::attention with the key counts.
std::tuple<at::Tensor, at::Tensor> attention_paged_gathered(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lens,
    const at::Tensor& block_table, double scale, double softcap, bool causal, int64_t window_left,
    int64_t window_right, int64_t prefix_len, c10::string_view variant,
    const std::optional<at::Tensor>& sinks);

// d loss / d sinks (Hq,) in the sinks' dtype, from the backward's cotangents and the forward's out
// and lse (which include the sinks): the sum over rows of exp(sink - lse) (grad_lse - rowsum(dO out)),
// rows whose LSE is -inf (padding rows, or a sink of -inf) adding 0. Without sinks an empty tensor.
at::Tensor attention_sink_grad(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse,
                               const std::optional<at::Tensor>& grad_lse,
                               const std::optional<at::Tensor>& sinks);
// The same from the backward prep's per-row scratch (B, H, rows): lse2 = lse log2(e) (+inf: a row
// that sees nothing) and delta = rowsum(dO out) - grad_lse (0 on padding rows).
at::Tensor attention_sink_grad_from_prep(const at::Tensor& lse2, const at::Tensor& delta,
                                         const at::Tensor& sinks);

// The LSE of rows that see no key: -inf, or with sinks each head's sink (the rows' softmax holds the
// sink alone: their output stays 0).
void fill_unseen_lse(at::Tensor& lse, const std::optional<at::Tensor>& sinks);

// The backward's parameters: the plan's, grad_out's, the LSE gradient's (undefined: none) and the
// outputs dq, dk, dv's.
AttentionGradParams attention_grad_params(const AttentionParams& fwd, const at::Tensor& grad_out,
                                          const at::Tensor& grad_lse, const at::Tensor& dq,
                                          const at::Tensor& dk, const at::Tensor& dv);

}  // namespace opforge
