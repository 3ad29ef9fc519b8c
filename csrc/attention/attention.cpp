// attention: C++ entries (through the dispatcher), input checks and the plan.
#include "attention/attention.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "common/checks.h"
#include "common/cuda/math_constants.h"
#include "opforge.h"

namespace opforge {

namespace {
constexpr const char* kOp = "opforge.attention";

void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_defined(op, "q", q);
  check_defined(op, "k", k);
  check_defined(op, "v", v);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(t->dim() == 4, op, ": ", name, " must be 4-D (batch, heads, sequence, head_dim), got ",
                t->dim(), "-D");
  }
  check_dtype_in(op, "q", q, {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble});
  check_same_dtype(op, "k", k, "q", q);
  check_same_dtype(op, "v", v, "q", q);
  check_same_device(op, "k", k, "q", q);
  check_same_device(op, "v", v, "q", q);
  TORCH_CHECK(k.sizes().equals(v.sizes()), op, ": k and v must have the same shape, got ", k.sizes(), " and ",
              v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0), op, ": q and k must have the same batch size, got ", q.size(0), " and ",
              k.size(0));
  TORCH_CHECK(q.size(3) == k.size(3), op, ": q and k must have the same head_dim, got ", q.size(3), " and ",
              k.size(3));
  TORCH_CHECK(q.size(3) > 0, op, ": head_dim must be at least 1, got 0");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, op,
              ": q's heads must be a multiple of k's and v's heads (grouped-query attention), got ",
              q.size(1), " and ", k.size(1));
}

// A number the float32 kernels hold (those of float16, bfloat16 and float32 inputs: float64 runs in
// double on the CPU): 0 or a normal float32 magnitude. Beyond it a scale or softcap would become
// inf or 0 inside the kernel (zeros and an LSE of -inf, or a softcap silently dropped).
void check_float32_number(const char* op, const char* what, double value) {
  const double a = std::abs(value);
  TORCH_CHECK_VALUE(a == 0.0 || (a >= FLT_MIN && a <= FLT_MAX), op, ": ", what, " = ", value,
                    " is outside the range of the float32 arithmetic the kernels use for ",
                    "float16, bfloat16 and ", "float32 inputs (magnitudes ", FLT_MIN, " to ", FLT_MAX,
                    ", or 0)");
}

// The largest scale magnitude for the float32 kernels without a softcap: scores times scale * log2(e)
// stay finite for |q.k| up to 2^63 with it, where a larger factor turns ordinary scores into inf and
// rows into NaN (a softcap bounds the scores). opforge/ops/attention/checks.py checks the same bound.
constexpr double kMaxScale = 18446744073709551616.0;  // 2^64

void check_pattern(const char* op, const at::Tensor& q, const at::Tensor& k, double scale, double softcap,
                   const AttentionPatternArgs& p) {
  TORCH_CHECK_VALUE(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  TORCH_CHECK_VALUE(std::isfinite(softcap) && softcap >= 0.0, op,
                    ": softcap must be positive (0: none), got ", softcap);
  if (q.scalar_type() != at::kDouble) {
    // The scale and softcap, and the factors the kernels derive from them (the CUDA kernels' exp2
    // arithmetic: scale * log2(e); with a softcap, softcap * log2(e), scale / softcap and its inverse).
    using cuda::kLog2e;
    TORCH_CHECK_VALUE(
        softcap > 0.0 || std::abs(scale) <= kMaxScale, op, ": scale = ", scale,
        " is too large for the float32 arithmetic the kernels use for ", dtype_str(q.scalar_type()),
        " inputs without a softcap (scores times scale * log2(e) would overflow): magnitudes up to ",
        "2^64 (1.8e19) are accepted");
    check_float32_number(op, "scale", scale);
    check_float32_number(op, "scale * log2(e)", scale * kLog2e);
    if (softcap > 0.0) {
      check_float32_number(op, "softcap", softcap);
      check_float32_number(op, "softcap * log2(e)", softcap * kLog2e);
      check_float32_number(op, "1 / (softcap * log2(e))", 1.0 / (softcap * kLog2e));
      check_float32_number(op, "scale / softcap", scale / softcap);
    }
  }
  TORCH_CHECK_VALUE(p.window_left >= -1 && p.window_right >= -1, op,
                    ": window sides must be >= 0 (-1: unbounded), got (", p.window_left, ", ", p.window_right,
                    ")");
  TORCH_CHECK_VALUE(p.prefix_len >= 0, op, ": prefix_len must be >= 0, got ", p.prefix_len);
  // A prefix adds keys to a band; with no band every key is visible already, which a caller asking
  // for a prefix never means (opforge.attention turns a prefix alone into prefix-LM: causal).
  TORCH_CHECK_VALUE(p.prefix_len == 0 || p.causal || p.window_left >= 0 || p.window_right >= 0, op,
                    ": prefix_len (", p.prefix_len, ") without causal or a window would see every key: pass ",
                    "causal=true for prefix-LM (bidirectional over the prefix, causal after it)");
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), Sk = k.size(2);
  TORCH_CHECK_VALUE(p.q_segments.has_value() == p.kv_segments.has_value(), op,
                    ": q_segments and kv_segments go together");
  if (p.q_segments) {
    const struct {
      const char* name;
      const at::Tensor& t;
      int64_t len;
    } segs[] = {{"q_segments", *p.q_segments, Sq}, {"kv_segments", *p.kv_segments, Sk}};
    for (const auto& s : segs) {
      check_defined(op, s.name, s.t);
      check_dtype_in(op, s.name, s.t, {at::kInt, at::kLong});
      check_same_device(op, s.name, s.t, "q", q);
      TORCH_CHECK(s.t.dim() == 2 && s.t.size(0) == B && s.t.size(1) == s.len, op, ": ", s.name,
                  " must be (batch, ", s.len, ") = (", B, ", ", s.len, "), got ", s.t.sizes());
    }
  }
  const int n_mask = p.mask_kinds.has_value() + p.mask_index.has_value() + p.mask_bits.has_value();
  TORCH_CHECK_VALUE(n_mask == 0 || n_mask == 3, op, ": mask_kinds, mask_index and mask_bits go together");
  if (n_mask) {
    TORCH_CHECK_VALUE(p.block_q > 0 && p.block_k > 0 && p.block_q % 64 == 0 && p.block_k % 64 == 0, op,
                      ": the block mask's block sizes must be multiples of 64, got (", p.block_q, ", ",
                      p.block_k, ")");
    const at::Tensor &kinds = *p.mask_kinds, &index = *p.mask_index, &bits = *p.mask_bits;
    check_defined(op, "mask_kinds", kinds);
    check_defined(op, "mask_index", index);
    check_defined(op, "mask_bits", bits);
    check_dtype_in(op, "mask_kinds", kinds, {at::kByte});
    check_dtype_in(op, "mask_index", index, {at::kInt});
    check_dtype_in(op, "mask_bits", bits, {at::kInt});
    check_same_device(op, "mask_kinds", kinds, "q", q);
    check_same_device(op, "mask_index", index, "q", q);
    check_same_device(op, "mask_bits", bits, "q", q);
    const int64_t nq = (Sq + p.block_q - 1) / p.block_q, nk = (Sk + p.block_k - 1) / p.block_k;
    TORCH_CHECK(kinds.dim() == 4 && (kinds.size(0) == 1 || kinds.size(0) == B) &&
                    (kinds.size(1) == 1 || kinds.size(1) == H) && kinds.size(2) == nq && kinds.size(3) == nk,
                op, ": the mask was made for other sizes: its blocks are ", kinds.sizes(),
                ", this call needs (1 or ", B, ", 1 or ", H, ", ", nq, ", ", nk, ") (batch, heads, ", Sq,
                " queries and ", Sk, " keys in blocks of (", p.block_q, ", ", p.block_k, "))");
    TORCH_CHECK(index.sizes().equals(kinds.sizes()), op, ": mask_index must have mask_kinds' shape ",
                kinds.sizes(), ", got ", index.sizes());
    TORCH_CHECK(bits.dim() == 3 && bits.size(1) == p.block_q && bits.size(2) == p.block_k / 32, op,
                ": mask_bits must be (partial blocks, ", p.block_q, ", ", p.block_k / 32, "), got ",
                bits.sizes());
  }
  TORCH_CHECK_VALUE(p.cu_seqlens_q.has_value() == p.cu_seqlens_k.has_value(), op,
                    ": cu_seqlens_q and cu_seqlens_k go together");
  if (p.varlen()) {
    TORCH_CHECK(B == 1, op,
                ": with cu_seqlens, q, k and v hold the packed sequences in a batch of one, got a ",
                "batch of ", B);
    TORCH_CHECK_VALUE(
        !p.q_segments && !p.mask_kinds && !p.kv_lens && p.prefix_len == 0, op,
        ": cu_seqlens (packed sequences) combine with causal, a window and softcap only, not with ",
        p.q_segments   ? "segment ids"
        : p.mask_kinds ? "a block mask"
        : p.kv_lens    ? "kv_lens"
                       : "a prefix");
    for (auto [name, t, total] :
         {std::tuple<const char*, const at::Tensor*, int64_t>{"cu_seqlens_q", &*p.cu_seqlens_q, Sq},
          {"cu_seqlens_k", &*p.cu_seqlens_k, Sk}}) {
      check_defined(op, name, *t);
      check_dtype_in(op, name, *t, {at::kInt, at::kLong});
      check_same_device(op, name, *t, "q", q);
      TORCH_CHECK(t->dim() == 1 && t->size(0) >= 1, op, ": ", name,
                  " must be 1-D (number of sequences + 1,), got ", t->sizes());
      TORCH_CHECK(total < (int64_t{1} << 31), op, ": with cu_seqlens the packed sequences may hold at most ",
                  "2^31 - 1 rows (int32 offsets), got ", total);
    }
    TORCH_CHECK(p.cu_seqlens_q->size(0) == p.cu_seqlens_k->size(0), op,
                ": cu_seqlens_q and cu_seqlens_k must have the same length (sequences + 1), got ",
                p.cu_seqlens_q->size(0), " and ", p.cu_seqlens_k->size(0));
  }
  if (p.kv_lens) {
    const at::Tensor& n = *p.kv_lens;
    check_defined(op, "kv_lens", n);
    check_dtype_in(op, "kv_lens", n, {at::kInt, at::kLong});
    check_same_device(op, "kv_lens", n, "q", q);
    TORCH_CHECK(n.dim() == 1 && n.size(0) == B, op, ": kv_lens must be (batch,) = (", B, ",), got ",
                n.sizes());
  }
}

at::Tensor int64_contiguous(const at::Tensor& t) {
  return t.to(at::kLong).contiguous();
}

// n offsets v (host memory) that start at 0, end at `total` and never decrease.
void check_offsets(const char* op, const char* name, const int64_t* v, int64_t n, int64_t total) {
  TORCH_CHECK_VALUE(v[0] == 0, op, ": ", name, " must start at 0, got ", v[0]);
  for (int64_t i = 1; i < n; ++i) {
    TORCH_CHECK_VALUE(v[i] >= v[i - 1], op, ": ", name, " must not decrease, got ", v[i - 1], " then ", v[i],
                      " at index ", i);
  }
  TORCH_CHECK_VALUE(v[n - 1] <= total, op, ": ", name, " must end at most at the packed length ", total,
                    " (rows past its last offset belong to no sequence), got ", v[n - 1]);
}

}  // namespace

AttentionPatternArgs attention_pattern_args(bool causal, int64_t window_left, int64_t window_right,
                                            int64_t prefix_len, const std::optional<at::Tensor>& q_segments,
                                            const std::optional<at::Tensor>& kv_segments,
                                            const std::optional<at::Tensor>& mask_kinds,
                                            const std::optional<at::Tensor>& mask_index,
                                            const std::optional<at::Tensor>& mask_bits, int64_t block_q,
                                            int64_t block_k) {
  return {causal,     window_left, window_right, prefix_len, q_segments, kv_segments,
          mask_kinds, mask_index,  mask_bits,    block_q,    block_k};
}

void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            double softcap, const AttentionPatternArgs& pattern) {
  check_qkv(kOp, q, k, v);
  check_pattern(kOp, q, k, scale, softcap, pattern);
}

AttentionPatternArgs checked_attention_args(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap, bool causal,
    int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k) {
  AttentionPatternArgs args =
      attention_pattern_args(causal, window_left, window_right, prefix_len, q_segments, kv_segments,
                             mask_kinds, mask_index, mask_bits, block_q, block_k);
  args.kv_lens = kv_lens;
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  check_attention_inputs(q, k, v, scale, softcap, args);
  return args;
}

void check_attention_backward_inputs(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                     const std::optional<at::Tensor>& grad_lse, double scale, double softcap,
                                     const AttentionPatternArgs& pattern) {
  constexpr const char* op = "opforge.attention_backward";
  check_qkv(op, q, k, v);
  check_pattern(op, q, k, scale, softcap, pattern);
  check_defined(op, "grad_out", grad_out);
  check_defined(op, "out", out);
  check_defined(op, "lse", lse);
  check_same_shape(op, "grad_out", grad_out, "q", q);
  check_same_shape(op, "out", out, "q", q);
  check_same_dtype(op, "grad_out", grad_out, "q", q);
  check_same_dtype(op, "out", out, "q", q);
  check_same_device(op, "grad_out", grad_out, "q", q);
  check_same_device(op, "out", out, "q", q);
  check_same_device(op, "lse", lse, "q", q);
  const at::ScalarType lse_type = attention_lse_dtype(q);
  TORCH_CHECK(lse.scalar_type() == lse_type && lse.dim() == 3 && lse.size(0) == q.size(0) &&
                  lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              op, ": lse must be ", dtype_str(lse_type), " (batch, heads, queries) = ", q.sizes().slice(0, 3),
              ", got ", dtype_str(lse.scalar_type()), " ", lse.sizes());
  if (grad_lse) {
    check_defined(op, "grad_lse", *grad_lse);
    check_same_shape(op, "grad_lse", *grad_lse, "lse", lse);
    check_same_dtype(op, "grad_lse", *grad_lse, "lse", lse);
    check_same_device(op, "grad_lse", *grad_lse, "q", q);
  }
}

std::pair<int64_t, int64_t> check_varlen_offsets(const char* op, const AttentionPatternArgs& pattern,
                                                 int64_t total_q, int64_t total_k) {
  if (!pattern.varlen()) return {total_q, total_k};
  // Both in one copy to the host (on CUDA one synchronization, not two).
  const at::Tensor& cq = *pattern.cu_seqlens_q;
  const at::Tensor h =
      at::cat({cq.to(at::kLong), pattern.cu_seqlens_k->to(at::kLong)}).to(at::kCPU).contiguous();
  const int64_t* v = h.const_data_ptr<int64_t>();
  check_offsets(op, "cu_seqlens_q", v, cq.numel(), total_q);
  check_offsets(op, "cu_seqlens_k", v + cq.numel(), h.numel() - cq.numel(), total_k);
  return {v[cq.numel() - 1], v[h.numel() - 1]};
}

void fill_rows_past_offsets(const at::Tensor& t, std::optional<int64_t> rows, const at::Tensor& cu_seqlens,
                            double value) {
  const int64_t total = t.size(2);
  if (rows) {
    if (*rows < total) t.narrow(2, *rows, total - *rows).fill_(value);
    return;
  }
  if (total == 0) return;
  const at::Tensor end = cu_seqlens.select(0, cu_seqlens.size(0) - 1).to(at::kLong);
  const at::Tensor past = at::arange(total, cu_seqlens.options().dtype(at::kLong)).ge(end);
  std::vector<int64_t> shape(t.dim(), 1);
  shape[2] = total;
  t.masked_fill_(past.view(shape), value);
}

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
                      attention_hopper_fwd_block_n(attention_cuda_head_dim(call.head_dim)),
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
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(), kOp, ": no kernels on ", device);
  TORCH_CHECK_VALUE(
      heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && sq >= 0 && sk >= 0 && head_dim > 0, kOp,
      ": _attention_kernel needs heads a multiple of kv_heads (both > 0), sizes >= 0, got heads ", heads,
      ", kv_heads ", kv_heads, ", sq ", sq, ", sk ", sk, ", head_dim ", head_dim);
  AttentionCall call;
  call.cuda = device.is_cuda();
  call.heads = heads, call.kv_heads = kv_heads, call.sq = sq, call.sk = sk, call.head_dim = head_dim;
  call.kv_lens = kv_lens;
  call.backward = backward;
  if (call.cuda) call.hopper_missing = attention_hopper_missing(device);
  return attention_kernel_name(
      choose_attention_kernel(backward ? "opforge.attention_backward" : kOp, call, variant));
}

}  // namespace

at::Tensor empty_attention_like(const at::Tensor& like, bool sequence_major) {
  if (sequence_major || (like.stride(1) < like.stride(2) && like.size(1) > 1 && like.size(2) > 1)) {
    return at::empty({like.size(0), like.size(2), like.size(1), like.size(3)}, like.options())
        .transpose(1, 2);
  }
  return at::empty(like.sizes(), like.options());
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
  return plan;
}

at::Tensor paged_view(const at::Tensor& cache, int64_t batch, int64_t keys) {
  return cache.as_strided({batch, cache.size(2), keys, cache.size(3)},
                          {0, cache.stride(2), 0, cache.stride(3)});
}

at::Tensor int32_block_table(const at::Tensor& block_table, int64_t num_pages) {
  check_defined(kOp, "block_table", block_table);
  check_dtype_in(kOp, "block_table", block_table, {at::kInt, at::kLong});
  if (block_table.scalar_type() == at::kInt) return block_table;
  return block_table.clamp(0, std::max<int64_t>(num_pages - 1, 0)).to(at::kInt);
}

std::tuple<at::Tensor, at::Tensor> attention_paged_gathered(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& kv_lens,
    const at::Tensor& block_table, double scale, double softcap, bool causal, int64_t window_left,
    int64_t window_right, int64_t prefix_len, c10::string_view variant) {
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
                            std::nullopt);
}

AttentionPlan plan_paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& kv_lens, const at::Tensor& block_table,
                                   const at::Tensor& out, const at::Tensor& lse, double scale, double softcap,
                                   bool causal, int64_t window_left, int64_t window_right,
                                   int64_t prefix_len) {
  constexpr const char* op = "opforge.attention";
  check_defined(op, "block_table", block_table);
  check_defined(op, "k", k_cache);
  check_defined(op, "v", v_cache);
  TORCH_CHECK(q.dim() == 4, op, ": q must be 4-D (batch, heads, sequence, head_dim), got ", q.dim(), "-D");
  TORCH_CHECK(
      k_cache.dim() == 4 && v_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), op,
      ": with block_table, k and v must be paged caches (num_pages, page_size, kv_heads, head_dim) of "
      "one shape, got ",
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
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::attention", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, bool,
                           int64_t, int64_t, int64_t, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t,
                           int64_t, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, c10::string_view, std::optional<bool>)>();
  return op.call(q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, q_segments,
                 kv_segments, mask_kinds, mask_index, mask_bits, block_q, block_k, kv_lens, cu_seqlens_q,
                 cu_seqlens_k, variant, deterministic);
}

}  // namespace opforge

namespace opforge {
namespace {

// opforge::_attention_check (registration.cpp): the backends' checks that read no data (the varlen
// offsets' values are the one check left to the op); the variant against the kernels of the tensors'
// device, or on meta tensors (no device to run on) against the names alone.
void attention_check_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                        double softcap, bool causal, int64_t window_left, int64_t window_right,
                        int64_t prefix_len, const std::optional<at::Tensor>& q_segments,
                        const std::optional<at::Tensor>& kv_segments,
                        const std::optional<at::Tensor>& mask_kinds,
                        const std::optional<at::Tensor>& mask_index,
                        const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
                        const std::optional<at::Tensor>& kv_lens,
                        const std::optional<at::Tensor>& cu_seqlens_q,
                        const std::optional<at::Tensor>& cu_seqlens_k, c10::string_view variant,
                        std::optional<bool> /*deterministic*/) {
  const AttentionPatternArgs args = checked_attention_args(
      q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, q_segments, kv_segments,
      mask_kinds, mask_index, mask_bits, block_q, block_k, kv_lens, cu_seqlens_q, cu_seqlens_k);
  const char* op = attention_op_name(args);
  if (!q.is_meta()) {
    choose_attention_kernel(op, attention_call(q, k, kv_lens.has_value(), false, args.varlen()), variant);
  } else {
    TORCH_CHECK_VALUE(variant == "auto" || variant == "tiled" || variant == "decode" || variant == "hopper" ||
                          variant == "mma_sync",
                      op, ": variant '", variant, "' is unknown; variants are: auto, tiled, decode, hopper, ",
                      "mma_sync");
  }
}

}  // namespace
}  // namespace opforge

// The rule's query op (schema in registration.cpp): no tensor argument, so one kernel serves every
// dispatch key.
TORCH_LIBRARY_IMPL(opforge, CompositeExplicitAutograd, m) {
  m.impl("_attention_kernel", &opforge::attention_kernel_op);
}
// The checks run on any tensors, fake ones included (a composite kernel: no fake kernel needed).
TORCH_LIBRARY_IMPL(opforge, CompositeImplicitAutograd, m) {
  m.impl("_attention_check", &opforge::attention_check_op);
}

namespace opforge {}  // namespace opforge
