// attention CUDA, FP8: opforge::attention_fp8's CUDA entry. q, k, v in float8_e4m3fn with
// FlashAttention-3's descale factors ((batch, kv_heads) float32; a varlen call's batch is its
// sequences), the output bfloat16 and the LSE float32, forward only, on the Hopper FP8 kernel
// (attention_fwd_hopper_fp8.cuh): its plain form, every pattern without a block mask or per-sequence
// key counts, head dims up to 128 (zero-padded to 128: the padded columns add nothing to q . k or
// to the output's dropped columns). Other calls raise: a NotImplementedError for what opforge has
// no FP8 kernel for (another GPU, a block mask, kv_lens, head dims above 128), errors naming the
// argument for bad input.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <limits>
#include <string>

#include "attention/attention.h"
#include "attention/cuda/attention_cuda_host.h"
#include "attention/cuda/instantiations/attention_instantiations.h"
#include "common/checks.h"

namespace opforge {

namespace {

constexpr const char* kOp = "opforge.attention (FP8)";
constexpr int64_t kFp8HeadDim = 128;  // (the kernel's: HopperFwdTraitsFp8D128)

// An operand's bytes as the FP8 kernel reads them: its head dim zero-padded to the kernel's, in rows
// TMA can address (unit column stride, 16-byte strides and base, positive strides below 2^39), else
// a contiguous copy. (Through a uint8 view: padding and copies of bytes, whatever float8 ops the
// installed torch has.)
at::Tensor fp8_operand(const at::Tensor& t) {
  at::Tensor b = t.view(at::kByte);
  if (b.size(3) != kFp8HeadDim)
    return at::constant_pad_nd(b, {0, kFp8HeadDim - b.size(3)}).view(t.scalar_type());
  bool ok = b.stride(3) == 1 && reinterpret_cast<uintptr_t>(b.const_data_ptr()) % 16 == 0;
  for (int d = 0; d < 3; ++d) {
    if (b.size(d) > 1 && (b.stride(d) % 16 != 0 || b.stride(d) <= 0 || b.stride(d) >= (int64_t{1} << 39)))
      ok = false;
  }
  return ok ? t : b.contiguous().view(t.scalar_type());
}

// A descale factor: None, or float32 (batch, kv_heads) on q's device (made contiguous).
std::optional<at::Tensor> checked_descale(const char* name, const std::optional<at::Tensor>& d, int64_t batch,
                                          int64_t kv_heads, const at::Tensor& q) {
  if (!d) return std::nullopt;
  check_defined(kOp, name, *d);
  TORCH_CHECK(
      d->scalar_type() == at::kFloat && d->dim() == 2 && d->size(0) == batch && d->size(1) == kv_heads, kOp,
      ": ", name, " must be float32 (batch, kv_heads) = (", batch, ", ", kv_heads, "), got ",
      dtype_str(d->scalar_type()), " ", d->sizes());
  check_same_device(kOp, name, *d, "q", q);
  return d->contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_fp8_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& q_descale,
    const std::optional<at::Tensor>& k_descale, const std::optional<at::Tensor>& v_descale, double scale,
    double softcap, bool causal, int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& sinks,
    c10::string_view variant, bool check_offsets) {
  using namespace attention_host;
  const AttentionPatternArgs args =
      checked_attention_args(q, k, v, scale, softcap, causal, window_left, window_right, prefix_len,
                             q_segments, kv_segments, mask_kinds, mask_index, mask_bits, block_q, block_k,
                             kv_lens, cu_seqlens_q, cu_seqlens_k, sinks, /*fp8=*/true);
  TORCH_CHECK_VALUE(variant == "auto" || variant == "hopper", kOp, ": variant '", variant,
                    "' is not an FP8 kernel; FP8 attention runs the Hopper kernel ('auto' or 'hopper')");
  TORCH_CHECK_NOT_IMPLEMENTED(!args.mask_kinds.has_value() && !kv_lens.has_value(), kOp,
                              ": FP8 attention on CUDA takes no block mask (mask=) and no kv_lens / "
                              "block_table yet (the CPU computes those)");
  TORCH_CHECK_NOT_IMPLEMENTED(q.size(3) <= kFp8HeadDim && v.size(3) <= kFp8HeadDim, kOp,
                              ": FP8 attention on CUDA takes head dims up to ", kFp8HeadDim, ", got q's ",
                              q.size(3), " and v's ", v.size(3), " (the CPU computes larger ones)");
  TORCH_CHECK(q.size(2) < (int64_t{1} << 30) && k.size(2) < (int64_t{1} << 30), kOp,
              ": sequences shorter than 2^30 on CUDA, got ", q.size(2), " queries and ", k.size(2), " keys");
  TORCH_CHECK(q.size(0) <= 65535 && q.size(1) <= 65535, kOp,
              ": at most 65535 batches and heads on CUDA, got ", q.size(0), " and ", q.size(1));
  const c10::cuda::CUDAGuard guard(q.device());
  const char* missing = attention_hopper_missing(q.device());
  TORCH_CHECK_NOT_IMPLEMENTED(missing == nullptr, kOp, ": FP8 attention on CUDA runs on the Hopper kernel: ",
                              missing == nullptr ? "" : missing);
  const int64_t batch = args.varlen() ? cu_seqlens_q->size(0) - 1 : q.size(0);
  const auto dq = checked_descale("q_descale", q_descale, batch, k.size(1), q);
  const auto dk = checked_descale("k_descale", k_descale, batch, k.size(1), q);
  const auto dv = checked_descale("v_descale", v_descale, batch, k.size(1), q);

  at::Tensor out = empty_attention_like(q, args.varlen(), v.size(3), at::kBFloat16);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const auto rows =
      check_offsets ? check_varlen_offsets_unless_capturing(kOp, args, q.size(2), k.size(2)) : std::nullopt;
  const bool captured = args.varlen() && !rows.has_value();
  // (rows past the last offsets, where they are read: not run, zeros and an LSE of -inf)
  const int64_t rows_q = rows ? rows->first : q.size(2), rows_k = rows ? rows->second : k.size(2);
  if (rows_q < q.size(2)) {
    out.narrow(2, rows_q, q.size(2) - rows_q).zero_();
    lse.narrow(2, rows_q, q.size(2) - rows_q).fill_(-kInf);
  }
  at::Tensor out_n = out.narrow(2, 0, rows_q), lse_n = lse.narrow(2, 0, rows_q);
  if (out_n.numel() == 0 || rows_k == 0) {  // (no key anywhere: out 0, the LSE -inf or the sinks)
    out_n.zero_();
    fill_unseen_lse(lse_n, args.sinks);
    if (captured) fill_rows_past_offsets(lse, std::nullopt, *cu_seqlens_q, -kInf);  // (no sequence, no sink)
    return {out, lse};
  }
  const at::Tensor qn = q.narrow(2, 0, rows_q), kn = k.narrow(2, 0, rows_k), vn = v.narrow(2, 0, rows_k);
  const AttentionPatternArgs args_n =
      rows_q < q.size(2) || rows_k < k.size(2)
          ? checked_attention_args(qn, kn, vn, scale, softcap, causal, window_left, window_right, prefix_len,
                                   q_segments, kv_segments, mask_kinds, mask_index, mask_bits, block_q,
                                   block_k, kv_lens, cu_seqlens_q, cu_seqlens_k, sinks, true)
          : args;
  const at::Tensor qk = fp8_operand(qn), kk = fp8_operand(kn), vk = fp8_operand(vn);
  // (the kernel writes kFp8HeadDim columns: a narrower v's output through a copy; the LSE contiguous)
  at::Tensor out_k = v.size(3) == kFp8HeadDim && rows_q == q.size(2)
                         ? out
                         : empty_attention_like(qn, args.varlen(), kFp8HeadDim, at::kBFloat16);
  at::Tensor lse_k = rows_q == q.size(2) ? lse : at::empty_like(lse_n, at::MemoryFormat::Contiguous);
  AttentionPlan plan = plan_attention(qk, kk, vk, out_k, lse_k, scale, softcap, args_n);
  add_segment_blocks(plan);
  plan.params.q_descale = dq ? dq->const_data_ptr<float>() : nullptr;
  plan.params.k_descale = dk ? dk->const_data_ptr<float>() : nullptr;
  plan.params.v_descale = dv ? dv->const_data_ptr<float>() : nullptr;
  const AttentionCudaArgs a = cuda_args(plan.params);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  check_launch(kOp, run_attention_hopper_fwd_fp8_at(static_cast<int>(kFp8HeadDim), a, stream));
  if (!out_k.is_same(out)) out_n.copy_(out_k.narrow(3, 0, v.size(3)));
  if (!lse_k.is_same(lse)) lse_n.copy_(lse_k);
  if (captured) {  // (rows past the last offset, unknown here, on the device)
    fill_rows_past_offsets(out, std::nullopt, *cu_seqlens_q, 0.0);
    fill_rows_past_offsets(lse, std::nullopt, *cu_seqlens_q, -kInf);
  }
  return {out, lse};
}

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("attention_fp8", &attention_fp8_cuda);
}

}  // namespace opforge
