// attention: the input checks the CPU and CUDA entries share (shapes, dtypes, devices, the pattern, the
// scale and softcap, varlen offsets), and the _attention_check op that runs them on any tensors.
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <torch/library.h>

#include <cfloat>
#include <cmath>

#include "attention/attention.h"
#include "common/checks.h"
#include "common/cuda/math_constants.h"

namespace opforge {

namespace {

// fp8: opforge::attention_fp8's operands (float8_e4m3fn), else the float types'.
void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               bool fp8 = false) {
  check_defined(op, "q", q);
  check_defined(op, "k", k);
  check_defined(op, "v", v);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(t->dim() == 4, op, ": ", name, " must be 4-D (batch, heads, sequence, head_dim), got ",
                t->dim(), "-D");
  }
  if (fp8) {
    check_dtype_in(op, "q", q, {at::kFloat8_e4m3fn});
  } else {
    check_dtype_in(op, "q", q, {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble});
  }
  check_same_dtype(op, "k", k, "q", q);
  check_same_dtype(op, "v", v, "q", q);
  check_same_device(op, "k", k, "q", q);
  check_same_device(op, "v", v, "q", q);
  // (v's head dim may differ from q's and k's: DeepSeek's MLA attends with 192 and reads values of 128)
  TORCH_CHECK(k.sizes().slice(0, 3).equals(v.sizes().slice(0, 3)), op,
              ": k and v must have the same shape but for the head dim, got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0), op, ": q and k must have the same batch size, got ", q.size(0), " and ",
              k.size(0));
  TORCH_CHECK(q.size(3) == k.size(3), op, ": q and k must have the same head_dim, got ", q.size(3), " and ",
              k.size(3));
  TORCH_CHECK(q.size(3) > 0 && v.size(3) > 0, op, ": head_dim must be at least 1, got q's ", q.size(3),
              " and v's ", v.size(3));
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
  if (p.sinks) {
    const at::Tensor& s = *p.sinks;
    check_defined(op, "sinks", s);
    check_dtype_in(op, "sinks", s, {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble});
    check_same_device(op, "sinks", s, "q", q);
    TORCH_CHECK(s.dim() == 1 && s.size(0) == H, op, ": sinks must be (heads,) = (", H,
                ",), one logit a query head, got ", s.sizes());
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
                            double softcap, const AttentionPatternArgs& pattern, bool fp8) {
  check_qkv(kAttentionOp, q, k, v, fp8);
  check_pattern(kAttentionOp, q, k, scale, softcap, pattern);
}

AttentionPatternArgs checked_attention_args(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap, bool causal,
    int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& sinks, bool fp8) {
  AttentionPatternArgs args =
      attention_pattern_args(causal, window_left, window_right, prefix_len, q_segments, kv_segments,
                             mask_kinds, mask_index, mask_bits, block_q, block_k);
  args.kv_lens = kv_lens;
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  args.sinks = sinks;
  check_attention_inputs(q, k, v, scale, softcap, args, fp8);
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
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"grad_out", &grad_out}, {"out", &out}}) {
    TORCH_CHECK(
        t->dim() == 4 && t->sizes().slice(0, 3).equals(q.sizes().slice(0, 3)) && t->size(3) == v.size(3), op,
        ": ", name, " must be (batch, heads, queries) as q and v's head_dim: (", q.size(0), ", ", q.size(1),
        ", ", q.size(2), ", ", v.size(3), "), got ", t->sizes());
  }
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
                        const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& sinks,
                        c10::string_view variant, std::optional<bool> /*deterministic*/) {
  const AttentionPatternArgs args = checked_attention_args(
      q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, q_segments, kv_segments,
      mask_kinds, mask_index, mask_bits, block_q, block_k, kv_lens, cu_seqlens_q, cu_seqlens_k, sinks);
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

// The checks run on any tensors, fake ones included (a composite kernel: no fake kernel needed).
TORCH_LIBRARY_IMPL(opforge, CompositeImplicitAutograd, m) {
  m.impl("_attention_check", &opforge::attention_check_op);
}
