// attention CPU: forward and backward, tiled with an online softmax (no Sq x Sk matrix in memory).
//
// Forward: a task is one (batch, head, tile of 96 queries (64 or 128 inside a block mask's blocks)); it walks
// the key tiles the pattern leaves visible (tile_kind: empty tiles are skipped, full tiles take no mask
// arithmetic), computing S = Q K^T and P V with the CPU GEMM that matmul shares (common/cpu/gemm.h; AVX2
// where the CPU has it). Backward: dK and dV by key tiles (a task owns its tile's rows for the whole GQA
// group: the reduction over the group's query heads happens inside the task), then dQ by query tiles; every
// sum runs in a fixed order, so gradients are deterministic. Accumulation in float (double for
// float64 inputs); 16-bit inputs round P and dS to their type for the P V and dS K products, as
// GPU flash attention does.
// Packed variable-length sequences (cu_seqlens): every loop runs over sequences in place of batch
// rows, each with its own lengths (pattern.at(b)) and tile counts (TileTasks), and finds its rows by
// the params' offsets (q_at, k_at, ...); the offsets are host memory here.
// The kernels: attention_cpu_forward.cpp, attention_cpu_decode.cpp and attention_cpu_backward.cpp
// (entries in attention_cpu.h, shared helpers in attention_cpu_common.h); here the ops' entries.
#include "attention/cpu/attention_cpu.h"

#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "attention/attention.h"
#include "common/checks.h"

namespace opforge {
namespace {

// A block mask's data comes from opforge.block_mask, but the tensors are plain arguments:
// every kind and partial index is checked before a kernel reads through them.
void check_mask_values(const AttentionPattern& pat, int64_t partials) {
  if (!pat.mask_kinds) return;
  const int64_t n = pat.mask_b * pat.mask_h * pat.mask_nq * pat.mask_nk;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t kind = pat.mask_kinds[i];
    TORCH_CHECK_VALUE(kind <= 2, "opforge.attention: mask_kinds holds ", int{kind},
                      ": block kinds are 0 (empty), 1 (full) and 2 (partial)");
    if (kind == 2) {
      TORCH_CHECK_VALUE(pat.mask_index[i] >= 0 && pat.mask_index[i] < partials,
                        "opforge.attention: mask_index ", pat.mask_index[i],
                        " of a partial block is outside mask_bits' ", partials, " blocks");
    }
  }
}

std::tuple<at::Tensor, at::Tensor> attention_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap, bool causal,
    int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& sinks,
    c10::string_view variant, std::optional<bool> deterministic,
    bool check_offsets /*the CPU reads them in place, always*/) {
  const AttentionPatternArgs args = checked_attention_args(
      q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, q_segments, kv_segments,
      mask_kinds, mask_index, mask_bits, block_q, block_k, kv_lens, cu_seqlens_q, cu_seqlens_k, sinks);
  if (v.size(3) != q.size(3)) {  // (one head dim for the kernels: pad_head_dim)
    return attention_at_one_head_dim(
        q, k, v, args.varlen(), [&](const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp) {
          return attention_cpu(qp, kp, vp, scale, softcap, causal, window_left, window_right, prefix_len,
                               q_segments, kv_segments, mask_kinds, mask_index, mask_bits, block_q, block_k,
                               kv_lens, cu_seqlens_q, cu_seqlens_k, sinks, variant, deterministic,
                               check_offsets);
        });
  }
  const char* op = attention_op_name(args);
  const int64_t rows_q = check_varlen_offsets(op, args, q.size(2), k.size(2)).first;
  const AttentionCall call = attention_call(q, k, kv_lens.has_value(), false, args.varlen());
  const AttentionKernel kernel = choose_attention_kernel(op, call, variant);
  at::Tensor out = empty_attention_like(q, args.varlen());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(attention_lse_dtype(q)));
  if (out.numel() == 0) {
    fill_unseen_lse(lse, sinks);
    return {out, lse};
  }
  const AttentionPlan plan = plan_attention(q, k, v, out, lse, scale, softcap, args);
  check_mask_values(plan.params.pattern, mask_bits ? mask_bits->size(0) : 0);
  // (Named in profiler traces: "opforge.attention.tiled" / ".decode".)
  RECORD_FUNCTION(kernel == AttentionKernel::kDecode ? "opforge.attention.decode" : "opforge.attention.tiled",
                  std::vector<c10::IValue>());
  if (kernel == AttentionKernel::kDecode) {
    attention_cpu_decode(plan.params);
  } else {
    attention_cpu_forward(plan.params);
  }
  if (args.varlen()) {  // (rows past the last offset: the padding of a padded batch)
    fill_rows_past_offsets(out, rows_q, *args.cu_seqlens_q, 0.0);
    fill_rows_past_offsets(lse, rows_q, *args.cu_seqlens_q, -std::numeric_limits<double>::infinity());
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& grad_lse, double scale,
    double softcap, bool causal, int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    const std::optional<at::Tensor>& sinks, c10::string_view variant,
    std::optional<bool> deterministic /*the CPU's: always*/) {
  AttentionPatternArgs args =
      attention_pattern_args(causal, window_left, window_right, prefix_len, q_segments, kv_segments,
                             mask_kinds, mask_index, mask_bits, block_q, block_k);
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  args.sinks = sinks;
  check_attention_backward_inputs(grad_out, q, k, v, out, lse, grad_lse, scale, softcap, args);
  if (v.size(3) != q.size(3)) {  // (one head dim for the kernels: pad_head_dim)
    return attention_backward_at_one_head_dim(
        grad_out, q, k, v, out,
        [&](const at::Tensor& g, const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp,
            const at::Tensor& o) {
          return attention_backward_cpu(g, qp, kp, vp, o, lse, grad_lse, scale, softcap, causal, window_left,
                                        window_right, prefix_len, q_segments, kv_segments, mask_kinds,
                                        mask_index, mask_bits, block_q, block_k, cu_seqlens_q, cu_seqlens_k,
                                        sinks, variant, deterministic);
        });
  }
  // (d sinks on the CPU from dO and out: one pass over them, next to the backward's O(Sq Sk D))
  const at::Tensor d_sinks = attention_sink_grad(grad_out, out, lse, grad_lse, sinks);
  const auto [rows_q, rows_k] =
      check_varlen_offsets("opforge.attention_backward", args, q.size(2), k.size(2));
  choose_attention_kernel("opforge.attention_backward", attention_call(q, k, false, true, args.varlen()),
                          variant);  // (tiled)
  RECORD_FUNCTION("opforge.attention_backward.tiled", std::vector<c10::IValue>());
  at::Tensor dq = empty_attention_like(q), dk = empty_attention_like(k), dv = empty_attention_like(v);
  if (q.numel() == 0 || k.numel() == 0) {  // nothing visible anywhere: every gradient is 0
    return {dq.zero_(), dk.zero_(), dv.zero_(), d_sinks};
  }
  // The kernels read rows of grad_out and out with unit stride.
  const at::Tensor go = grad_out.stride(3) == 1 ? grad_out : grad_out.contiguous();
  const at::Tensor o = out.stride(3) == 1 ? out : out.contiguous();
  const at::Tensor lse_c = lse.contiguous();
  const at::Tensor grad_lse_c = grad_lse ? grad_lse->contiguous() : at::Tensor();
  AttentionPlan plan = plan_attention(q, k, v, o, lse_c, scale, softcap, args);
  check_mask_values(plan.params.pattern, mask_bits ? mask_bits->size(0) : 0);
  const AttentionGradParams g = attention_grad_params(plan.params, go, grad_lse_c, dq, dk, dv);
  attention_cpu_backward(g);
  if (args.varlen()) {
    fill_rows_past_offsets(dq, rows_q, *args.cu_seqlens_q, 0.0);
    fill_rows_past_offsets(dk, rows_k, *args.cu_seqlens_k, 0.0);
    fill_rows_past_offsets(dv, rows_k, *args.cu_seqlens_k, 0.0);
  }
  return {dq, dk, dv, d_sinks};
}

// On the CPU every table entry a sequence needs is checked (a ValueError naming it; the device
// kernels, which cannot check without a synchronisation, clamp entries into range instead): the
// first kv_lens[b] / page_size (rounded up) entries of row b, kv_lens clamped to the table's reach.
void check_cpu_block_table(const char* op, const at::Tensor& kv_lens, const at::Tensor& block_table,
                           int64_t pages, int64_t page_size) {
  const at::Tensor lens = kv_lens.to(at::kLong).contiguous();
  const at::Tensor table = block_table.to(at::kLong).contiguous();
  const int64_t batch = table.size(0), max_pages = table.size(1);
  const int64_t* n = lens.data_ptr<int64_t>();
  const int64_t* t = table.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t count = std::min(std::max<int64_t>(n[b], 0), max_pages * page_size);
    for (int64_t j = 0; j * page_size < count; ++j) {
      const int64_t e = t[b * max_pages + j];
      TORCH_CHECK_VALUE(e >= 0 && e < pages, op, ": block_table[", b, ", ", j, "] = ", e,
                        " is not a page of the caches (0 to ", pages - 1, "), and sequence ", b,
                        " needs it (kv_lens ", count, ")");
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_paged_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                                                       const at::Tensor& v_cache, const at::Tensor& kv_lens,
                                                       const at::Tensor& block_table, double scale,
                                                       double softcap, bool causal, int64_t window_left,
                                                       int64_t window_right, int64_t prefix_len,
                                                       c10::string_view variant,
                                                       const std::optional<at::Tensor>& sinks) {
  constexpr const char* op = "opforge.attention";
  TORCH_CHECK(q.defined() && q.dim() == 4, op, ": q must be a 4-D tensor (batch, heads, sequence, head_dim)");
  TORCH_CHECK(v_cache.defined() && v_cache.dim() == 4, op,
              ": with block_table, v must be a paged cache (num_pages, page_size, kv_heads, head_dim)");
  at::Tensor out = empty_attention_like(q, false, v_cache.size(3));
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(attention_lse_dtype(q)));
  const AttentionPlan plan =
      plan_paged_attention(q, k_cache, v_cache, kv_lens, int32_block_table(block_table, k_cache.size(0)), out,
                           lse, scale, softcap, causal, window_left, window_right, prefix_len, sinks);
  check_cpu_block_table(op, kv_lens, block_table, k_cache.size(0), k_cache.size(1));
  const AttentionKernel kernel = choose_attention_kernel(
      op, attention_call(q, paged_view(k_cache, q.size(0), plan.params.pattern.sk), true, false, false),
      variant);
  if (kernel != AttentionKernel::kDecode || v_cache.size(3) != k_cache.size(3)) {
    // (the CPU's tiled kernel reads one contiguous cache; head dims that differ are padded to one)
    return attention_paged_gathered(q, k_cache, v_cache, kv_lens, block_table, scale, softcap, causal,
                                    window_left, window_right, prefix_len, variant, sinks);
  }
  if (out.numel() == 0) {
    fill_unseen_lse(lse, sinks);
    return {out, lse};
  }
  RECORD_FUNCTION("opforge.attention.decode", std::vector<c10::IValue>());
  attention_cpu_decode(plan.params);
  return {out, lse};
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("attention_paged", &attention_paged_cpu);
  m.impl("attention", &attention_cpu);
  m.impl("attention_backward", &attention_backward_cpu);
}

}  // namespace opforge
