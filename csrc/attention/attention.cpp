// attention: C++ entries (through the dispatcher), the kernel rule and the plan (the input checks:
// attention_checks.cpp).
#include "attention/attention.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "common/checks.h"
#include "opforge.h"

namespace opforge {

namespace {
at::Tensor int64_contiguous(const at::Tensor& t) {
  return t.to(at::kLong).contiguous();
}
}  // namespace

AttentionCall attention_call(const at::Tensor& q, const at::Tensor& k, bool kv_lens, bool backward,
                             bool varlen) {
  AttentionCall call;
  call.cuda = q.is_cuda();
  call.heads = q.size(1), call.kv_heads = k.size(1), call.sq = q.size(2), call.sk = k.size(2);
  call.head_dim = q.size(3);
  call.kv_lens = kv_lens;
  call.backward = backward;
  call.varlen = varlen;
  return call;
}

AttentionKernel choose_attention_kernel(const char* op, const AttentionCall& call, c10::string_view variant) {
  const char* device = call.cuda ? "CUDA" : "the CPU";
  const char* variants = call.backward
                             ? (call.cuda ? "auto, hopper, mma_sync" : "auto, tiled")
                             : (call.cuda ? "auto, decode, hopper, mma_sync" : "auto, tiled, decode");
  const int64_t rows = call.rows(), max_rows = call.decode_max_rows();
  AttentionKernel kernel;
  if (variant == "auto") {
    // (a paged cache the Hopper forward's boxes cannot tile: the mma.sync forward, which addresses
    // each row)
    kernel = call.decodes()                                ? AttentionKernel::kDecode
             : !call.cuda                                  ? AttentionKernel::kTiled
             : call.hopper_missing || !call.hopper_pages() ? AttentionKernel::kMmaSync
                                                           : AttentionKernel::kHopper;
  } else if (variant == "decode" && !call.backward) {
    TORCH_CHECK_VALUE(!call.varlen, op, ": variant 'decode' does not take packed sequences (cu_seqlens); on ",
                      device, " they run on: ", call.cuda ? "auto, hopper, mma_sync" : "auto, tiled");
    TORCH_CHECK_VALUE(rows <= max_rows, op, ": variant 'decode' takes at most ", max_rows,
                      " query rows (Sq x the GQA group) per kv head", call.cuda ? " at head dim " : "",
                      call.cuda ? std::to_string(call.head_dim) : std::string(), ", got ", rows);
    kernel = AttentionKernel::kDecode;
  } else if (variant == "tiled" && !call.cuda) {
    kernel = AttentionKernel::kTiled;
  } else if (variant == "hopper" && call.cuda) {
    TORCH_CHECK_VALUE(!call.hopper_missing, op, ": variant 'hopper' cannot run here: ", call.hopper_missing);
    TORCH_CHECK_VALUE(call.hopper_pages(), op,
                      ": variant 'hopper' reads paged caches whose page size is a multiple of its key tile (",
                      attention_hopper_fwd_block_n(call.hopper_dims()),
                      " rows at this head dim) or divides it (at least 8 rows), got page size ",
                      call.page_size, " (variant 'mma_sync' takes any)");
    kernel = AttentionKernel::kHopper;
  } else if (variant == "mma_sync" && call.cuda) {
    kernel = AttentionKernel::kMmaSync;
  } else {
    const bool known =
        variant == "tiled" || variant == "decode" || variant == "hopper" || variant == "mma_sync";
    TORCH_CHECK_VALUE(false, op, ": variant '", variant, known ? "' has no kernel here" : "' is unknown",
                      "; on ", device, " the ", call.backward ? "backward's " : "",
                      "variants are: ", variants);
  }
  return kernel;
}

#if !OPFORGE_WITH_CUDA
const char* attention_hopper_missing(at::Device) {
  return "this build has no CUDA kernels";
}
#endif

namespace {

// torch.ops.opforge._attention_kernel: the kernel the rule picks for a call of these sizes on `device`
// (opforge.attention asks it whether per-sequence key counts reach the decode kernel).
std::string attention_kernel_op(at::Device device, int64_t heads, int64_t kv_heads, int64_t sq, int64_t sk,
                                int64_t head_dim, bool kv_lens, c10::string_view variant, bool backward) {
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(), kAttentionOp, ": no kernels on ", device);
  TORCH_CHECK_VALUE(
      heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && sq >= 0 && sk >= 0 && head_dim > 0, kAttentionOp,
      ": _attention_kernel needs heads a multiple of kv_heads (both > 0), sizes >= 0, got heads ", heads,
      ", kv_heads ", kv_heads, ", sq ", sq, ", sk ", sk, ", head_dim ", head_dim);
  AttentionCall call;
  call.cuda = device.is_cuda();
  call.heads = heads, call.kv_heads = kv_heads, call.sq = sq, call.sk = sk, call.head_dim = head_dim;
  call.kv_lens = kv_lens;
  call.backward = backward;
  if (call.cuda) call.hopper_missing = attention_hopper_missing(device);
  return attention_kernel_name(
      choose_attention_kernel(backward ? "opforge.attention_backward" : kAttentionOp, call, variant));
}

}  // namespace

at::Tensor empty_attention_like(const at::Tensor& like, bool sequence_major, int64_t head_dim,
                                std::optional<at::ScalarType> dtype) {
  const int64_t d = head_dim < 0 ? like.size(3) : head_dim;
  const at::TensorOptions options = dtype ? like.options().dtype(*dtype) : like.options();
  if (sequence_major || (like.stride(1) < like.stride(2) && like.size(1) > 1 && like.size(2) > 1)) {
    return at::empty({like.size(0), like.size(2), like.size(1), d}, options).transpose(1, 2);
  }
  return at::empty({like.size(0), like.size(1), like.size(2), d}, options);
}

at::Tensor pad_head_dim(const at::Tensor& t, int64_t head_dim) {
  return t.size(3) == head_dim ? t : at::constant_pad_nd(t, {0, head_dim - t.size(3)});
}

AttentionPlan plan_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& out, const at::Tensor& lse, double scale, double softcap,
                             const AttentionPatternArgs& pattern) {
  AttentionPlan plan;
  AttentionParams& p = plan.params;
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.q_bs = q.stride(0), p.q_hs = q.stride(1), p.q_ss = q.stride(2), p.q_ds = q.stride(3);
  p.k_bs = k.stride(0), p.k_hs = k.stride(1), p.k_ss = k.stride(2), p.k_ds = k.stride(3);
  p.v_bs = v.stride(0), p.v_hs = v.stride(1), p.v_ss = v.stride(2), p.v_ds = v.stride(3);
  p.out = out.data_ptr();
  p.o_bs = out.stride(0), p.o_hs = out.stride(1), p.o_ss = out.stride(2);
  p.lse = lse.data_ptr();
  p.batch = q.size(0), p.heads = q.size(1), p.kv_heads = k.size(1), p.head_dim = q.size(3);
  p.head_dim_v = v.size(3);
  if (pattern.varlen()) p.batch = pattern.cu_seqlens_q->size(0) - 1;  // (the sequences)
  p.dtype = to_dtype(q.scalar_type());
  p.scale = scale;
  p.softcap = softcap;
  AttentionPattern& pat = p.pattern;
  pat.sq = q.size(2);
  pat.sk = k.size(2);
  pat.causal = pattern.causal;
  const int64_t reach = pat.sq + pat.sk;  // a side or prefix this long already sees everything
  pat.window_left = std::min(pattern.window_left, reach);
  pat.window_right = std::min(pattern.window_right, reach);
  pat.prefix_len = std::min(pattern.prefix_len, reach);
  if (pattern.q_segments) {
    at::Tensor qs = int64_contiguous(*pattern.q_segments), ks = int64_contiguous(*pattern.kv_segments);
    pat.q_segments = qs.const_data_ptr<int64_t>();
    pat.kv_segments = ks.const_data_ptr<int64_t>();
    pat.q_seg_bs = qs.size(1);
    pat.kv_seg_bs = ks.size(1);
    plan.q_segments = qs;
    plan.kv_segments = ks;
  }
  if (pattern.mask_kinds) {
    at::Tensor kinds = pattern.mask_kinds->contiguous(), index = pattern.mask_index->contiguous();
    at::Tensor bits = pattern.mask_bits->contiguous();
    pat.mask_kinds = kinds.const_data_ptr<uint8_t>();
    pat.mask_index = index.const_data_ptr<int32_t>();
    pat.mask_bits = reinterpret_cast<const uint32_t*>(bits.const_data_ptr<int32_t>());
    pat.mask_b = kinds.size(0), pat.mask_h = kinds.size(1), pat.mask_nq = kinds.size(2),
    pat.mask_nk = kinds.size(3);
    pat.mask_partials = bits.size(0);
    pat.block_q = pattern.block_q;
    pat.block_k = pattern.block_k;
    plan.keep.push_back(kinds);
    plan.keep.push_back(index);
    plan.keep.push_back(bits);
  }
  if (pattern.varlen()) {
    plan.cu_seqlens_q = pattern.cu_seqlens_q->to(at::kInt).contiguous();
    plan.cu_seqlens_k = pattern.cu_seqlens_k->to(at::kInt).contiguous();
    pat.cu_seqlens_q = plan.cu_seqlens_q.const_data_ptr<int32_t>();
    pat.cu_seqlens_k = plan.cu_seqlens_k.const_data_ptr<int32_t>();
    pat.total_q = pat.sq;
    pat.total_k = pat.sk;
  }
  if (pattern.kv_lens) {
    plan.kv_lens = int64_contiguous(*pattern.kv_lens);
    pat.kv_lens = plan.kv_lens.const_data_ptr<int64_t>();
  }
  if (pattern.sinks) {
    plan.sinks = pattern.sinks->to(attention_lse_dtype(q)).contiguous();
    p.sinks = plan.sinks.const_data_ptr();
  }
  return plan;
}

at::Tensor paged_view(const at::Tensor& cache, int64_t batch, int64_t keys) {
  return cache.as_strided({batch, cache.size(2), keys, cache.size(3)},
                          {0, cache.stride(2), 0, cache.stride(3)});
}

at::Tensor int32_block_table(const at::Tensor& block_table, int64_t num_pages) {
  check_defined(kAttentionOp, "block_table", block_table);
  check_dtype_in(kAttentionOp, "block_table", block_table, {at::kInt, at::kLong});
  if (block_table.scalar_type() == at::kInt) return block_table;
  return block_table.clamp(0, std::max<int64_t>(num_pages - 1, 0)).to(at::kInt);
}

std::tuple<at::Tensor, at::Tensor> attention_paged_gathered(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lens,
    const at::Tensor& block_table, double scale, double softcap, bool causal, int64_t window_left,
    int64_t window_right, int64_t prefix_len, c10::string_view variant,
    const std::optional<at::Tensor>& sinks) {
  const int64_t batch = block_table.size(0), max_pages = block_table.size(1);
  const at::Tensor table = block_table.to(at::kLong).clamp(0, k_cache.size(0) - 1).flatten();
  const auto gather = [&](const at::Tensor& cache) {
    return cache.index_select(0, table)
        .view({batch, max_pages * cache.size(1), cache.size(2), cache.size(3)})
        .transpose(1, 2);
  };
  return opforge::attention(q, gather(k_cache), gather(v_cache), scale, softcap, causal, window_left,
                            window_right, prefix_len, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                            std::nullopt, 128, 128, kv_lens, variant, std::nullopt, std::nullopt,
                            std::nullopt, true, sinks);
}

at::Tensor attention_sink_grad(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse,
                               const std::optional<at::Tensor>& grad_lse,
                               const std::optional<at::Tensor>& sinks) {
  if (!sinks) return at::empty({0}, lse.options());
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const at::ScalarType dt = lse.scalar_type();
  at::Tensor term = grad_out.to(dt).mul(out.to(dt)).sum(-1).neg();
  if (grad_lse) term = term.add(grad_lse->to(dt));
  // (exp(sink - lse), 0 on rows whose LSE is -inf; a sink of +inf, whose LSE is +inf, takes weight 1)
  const at::Tensor p_sink = sinks->to(dt)
                                .view({1, -1, 1})
                                .sub(lse.masked_fill(lse.eq(-kInf), kInf))
                                .nan_to_num(0.0, kInf, -kInf)
                                .exp();
  return p_sink.mul(term).sum(at::IntArrayRef{0, 2}).to(sinks->scalar_type());
}

at::Tensor attention_sink_grad_from_prep(const at::Tensor& lse2, const at::Tensor& delta,
                                         const at::Tensor& sinks) {
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const at::Tensor p_sink =
      sinks.to(at::kFloat).view({1, -1, 1}).mul(kLog2e).sub(lse2).nan_to_num(0.0, kInf, -kInf).exp2();
  return p_sink.mul(delta).sum(at::IntArrayRef{0, 2}).neg().to(sinks.scalar_type());
}

void fill_unseen_lse(at::Tensor& lse, const std::optional<at::Tensor>& sinks) {
  if (!sinks) {
    lse.fill_(-std::numeric_limits<double>::infinity());
    return;
  }
  lse.copy_(sinks->to(lse.scalar_type()).view({1, lse.size(1), 1}).expand_as(lse));
}

AttentionPlan plan_paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& kv_lens, const at::Tensor& block_table,
                                   const at::Tensor& out, const at::Tensor& lse, double scale, double softcap,
                                   bool causal, int64_t window_left, int64_t window_right, int64_t prefix_len,
                                   const std::optional<at::Tensor>& sinks) {
  constexpr const char* op = "opforge.attention";
  check_defined(op, "block_table", block_table);
  check_defined(op, "k", k_cache);
  check_defined(op, "v", v_cache);
  TORCH_CHECK(q.dim() == 4, op, ": q must be 4-D (batch, heads, sequence, head_dim), got ", q.dim(), "-D");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4 &&
                  k_cache.sizes().slice(0, 3).equals(v_cache.sizes().slice(0, 3)),
              op,
              ": with block_table, k and v must be paged caches (num_pages, page_size, kv_heads, head_dim) "
              "of one shape but for the head dim, got ",
              k_cache.sizes(), " and ", v_cache.sizes());
  TORCH_CHECK(k_cache.size(0) > 0 && k_cache.size(1) > 0, op, ": the paged caches have no pages, shape ",
              k_cache.sizes());
  TORCH_CHECK(block_table.scalar_type() == at::kInt, op,
              ": block_table must be int32 here (int32_block_table), got ",
              dtype_str(block_table.scalar_type()));
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == q.size(0) && block_table.size(1) > 0, op,
              ": block_table must be (batch, max_pages) = (", q.size(0), ", >= 1), got shape ",
              block_table.sizes());
  check_same_device(op, "block_table", block_table, "q", q);
  const int64_t keys = block_table.size(1) * k_cache.size(1);
  TORCH_CHECK(keys < (int64_t{1} << 31), op, ": a sequence's pages address at most 2^31 - 1 keys, got ",
              block_table.size(1), " pages x page_size ", k_cache.size(1));
  const at::Tensor k = paged_view(k_cache, q.size(0), keys), v = paged_view(v_cache, q.size(0), keys);
  AttentionPatternArgs args =
      attention_pattern_args(causal, window_left, window_right, prefix_len, std::nullopt, std::nullopt,
                             std::nullopt, std::nullopt, std::nullopt, 128, 128);
  args.kv_lens = kv_lens;
  args.sinks = sinks;
  check_attention_inputs(q, k, v, scale, softcap, args);
  AttentionPlan plan = plan_attention(q, k, v, out, lse, scale, softcap, args);
  AttentionParams& p = plan.params;
  p.k_bs = k_cache.stride(0), p.k_ss = k_cache.stride(1);
  p.v_bs = v_cache.stride(0), p.v_ss = v_cache.stride(1);
  const at::Tensor table = block_table.contiguous();
  plan.keep.push_back(table);
  p.block_table = table.const_data_ptr<int32_t>();
  p.table_bs = table.size(1);
  p.page_size = k_cache.size(1);
  p.num_pages = k_cache.size(0);
  return plan;
}

AttentionGradParams attention_grad_params(const AttentionParams& fwd, const at::Tensor& grad_out,
                                          const at::Tensor& grad_lse, const at::Tensor& dq,
                                          const at::Tensor& dk, const at::Tensor& dv) {
  AttentionGradParams g;
  g.fwd = fwd;
  g.grad_out = grad_out.const_data_ptr();
  g.g_bs = grad_out.stride(0), g.g_hs = grad_out.stride(1), g.g_ss = grad_out.stride(2);
  g.grad_lse = grad_lse.defined() ? grad_lse.const_data_ptr() : nullptr;
  g.dq = dq.data_ptr(), g.dk = dk.data_ptr(), g.dv = dv.data_ptr();
  g.dq_bs = dq.stride(0), g.dq_hs = dq.stride(1), g.dq_ss = dq.stride(2);
  g.dk_bs = dk.stride(0), g.dk_hs = dk.stride(1), g.dk_ss = dk.stride(2);
  g.dv_bs = dv.stride(0), g.dv_hs = dv.stride(1), g.dv_ss = dv.stride(2);
  return g;
}

std::tuple<at::Tensor, at::Tensor> attention(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap, bool causal,
    int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, c10::string_view variant, std::optional<bool> deterministic,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    bool check_offsets, const std::optional<at::Tensor>& sinks) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("opforge::attention", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, bool, int64_t, int64_t,
              int64_t, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, int64_t, int64_t, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, c10::string_view, std::optional<bool>, bool)>();
  return op.call(q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, q_segments,
                 kv_segments, mask_kinds, mask_index, mask_bits, block_q, block_k, kv_lens, cu_seqlens_q,
                 cu_seqlens_k, sinks, variant, deterministic, check_offsets);
}

}  // namespace opforge

// The rule's query op (schema in registration.cpp): no tensor argument, so one kernel serves every
// dispatch key.
TORCH_LIBRARY_IMPL(opforge, CompositeExplicitAutograd, m) {
  m.impl("_attention_kernel", &opforge::attention_kernel_op);
}
