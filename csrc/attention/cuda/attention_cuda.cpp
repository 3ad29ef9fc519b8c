// attention CUDA launcher: checks -> device guard -> the kernel the rule picks (attention_heuristics.h:
// `variant`, or "auto"'s rule; never a fallback after a failed launch) -> operands in a form it reads
// (each operand zero-padded to the kernel's head dim: 64 / 128 / 256, and 192 in the Hopper kernels,
// v's own in the Hopper forward; a contiguous copy only of rows it cannot read) -> one launcher a pass
// (forward, backward, decode): the Hopper kernels' form
// (attention_heuristics.h), the workspace it needs, and its instantiation (the generated
// instantiations/attention_instantiations.h), on the current stream.
#include "attention/cuda/attention_cuda.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "attention/attention.h"
#include "attention/cuda/attention_cuda_host.h"
#include "attention/cuda/instantiations/attention_instantiations.h"
#include "common/checks.h"
#include "common/cuda/math_constants.h"

namespace opforge {

const char* attention_hopper_missing(at::Device device) {  // (every head dim has both Hopper kernels)
  const c10::cuda::OptionalCUDAGuard guard(device.has_index() ? std::optional<at::Device>(device)
                                                              : std::nullopt);
  const int err = attention_hopper_status();
  if (err == cudaErrorNoKernelImageForDevice) {
    (void)cudaGetLastError();
    return "this build has no sm_90a code for this GPU (the Hopper kernels run on sm_90 GPUs such as the "
           "H100 "
           "and H200, from a build whose arch list holds 9.0a)";
  }
  TORCH_CHECK(err == cudaSuccess, "opforge.attention: CUDA error while asking for the Hopper kernels: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
  return nullptr;
}

// The host helpers the CUDA entries share (this file's and attention_fp8_cuda.cpp's:
// attention_cuda_host.h declares those the FP8 entry uses).
namespace attention_host {

constexpr int64_t kMaxHeadDim = 256;

int64_t kernel_head_dim(int64_t d) {
  return attention_cuda_head_dim(d);
}

void check_cuda_call(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, op,
              ": on CUDA q, k and v must be float16 or bfloat16, got ", dtype_str(q.scalar_type()),
              " (float32 and float64 run on the CPU)");
  TORCH_CHECK(q.size(3) <= kMaxHeadDim, op, ": head_dim up to ", kMaxHeadDim, " on CUDA, got ", q.size(3));
  TORCH_CHECK(v.size(3) <= kMaxHeadDim, op, ": v's head_dim up to ", kMaxHeadDim, " on CUDA, got ",
              v.size(3));
  constexpr int64_t kMaxLen = (int64_t{1} << 30);
  TORCH_CHECK(q.size(2) < kMaxLen && k.size(2) < kMaxLen, op, ": sequences shorter than ", kMaxLen,
              " on CUDA, got ", q.size(2), " queries and ", k.size(2), " keys");
  TORCH_CHECK(q.size(0) <= 65535 && q.size(1) <= 65535, op, ": at most 65535 batches and heads on CUDA, got ",
              q.size(0), " and ", q.size(1));
}

// Rows the kernels read with 16-byte copies: unit column stride, strides of 8 elements, a
// 16-byte aligned base.
bool rows_readable(const at::Tensor& t) {
  if (t.stride(3) != 1) return false;
  for (int d = 0; d < 3; ++d) {
    if (t.size(d) > 1 && t.stride(d) % 8 != 0) return false;
  }
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// Rows TMA can address too (the Hopper kernels): positive strides below 2^40 bytes.
bool tma_addressable(const at::Tensor& t) {
  if (!rows_readable(t)) return false;
  for (int d = 0; d < 3; ++d) {
    if (t.size(d) > 1 && (t.stride(d) <= 0 || t.stride(d) >= (int64_t{1} << 39))) return false;
  }
  return true;
}

// t with the kernel's head dim in rows the kernel can read: t itself, a zero-padded copy or a
// contiguous one.
at::Tensor kernel_operand(const at::Tensor& t, int64_t kd, AttentionKernel kernel) {
  if (t.size(3) != kd) return at::constant_pad_nd(t, {0, kd - t.size(3)});
  const bool readable = kernel == AttentionKernel::kHopper ? tma_addressable(t) : rows_readable(t);
  return readable ? t : t.contiguous();
}

// The operands sharing one head dim in a kernel (q and k; v, out and grad_out) as the Hopper kernels
// read them at head dim kd: as they are where all are narrower than kd by whole 16-byte chunks and TMA
// addresses them (the maps read the columns past their width as zeros: make_attention_maps, which takes
// the width from the plan), else kernel_operand's (zero-padded or contiguous copies).
std::vector<at::Tensor> hopper_operands(std::initializer_list<at::Tensor> ts, int64_t kd) {
  bool narrow = true;
  for (const at::Tensor& t : ts)
    narrow = narrow && t.size(3) < kd && t.size(3) % 8 == 0 && tma_addressable(t);
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(narrow ? t : kernel_operand(t, kd, AttentionKernel::kHopper));
  return out;
}

// Varlen offsets checked on the host (check_varlen_offsets), except while the current stream is
// being captured into a CUDA graph: a copy to the host cannot be captured.
// Returns the rows in sequences (the last offsets; (total_q, total_k) without varlen), or nullopt
// while capturing (not read).
std::optional<std::pair<int64_t, int64_t>> check_varlen_offsets_unless_capturing(
    const char* op, const AttentionPatternArgs& args, int64_t total_q, int64_t total_k) {
  if (args.varlen() && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None)
    return std::nullopt;
  return check_varlen_offsets(op, args, total_q, total_k);
}

// The call as the rule sees it on q's device.
AttentionCall cuda_call(const at::Tensor& q, const at::Tensor& k, bool kv_lens, bool backward, bool varlen,
                        int64_t page_size = 0) {
  AttentionCall call = attention_call(q, k, kv_lens, backward, varlen);
  call.hopper_missing = attention_hopper_missing(q.device());
  call.page_size = page_size;
  return call;
}

// The call's pattern as the Hopper forms read it (AttentionCall's pattern fields), from the plan.
void add_pattern(AttentionCall& call, const AttentionParams& p) {
  const AttentionPattern& pat = p.pattern;
  call.varlen = pat.varlen();
  call.batch = p.batch;
  call.sq = pat.varlen() ? pat.total_q : pat.sq;
  call.sk = pat.varlen() ? pat.total_k : pat.sk;
  call.window_left = pat.window_left;
  call.band_right = pat.band_right();
  call.prefix_len = pat.prefix_len;
  call.kv_lens = pat.kv_lens != nullptr;
  call.segments = pat.q_segments != nullptr;
  call.block_mask = pat.mask_kinds != nullptr;
}

// Segment ids (B, S) int64 summarised per 32 rows: (B, ceil(S / 32), 2) min and max (the last
// block padded with the last id).
at::Tensor segment_blocks(const at::Tensor& ids) {
  const int64_t B = ids.size(0), S = ids.size(1), n = (S + 31) / 32, pad = n * 32 - S;
  const at::Tensor padded = pad ? at::cat({ids, ids.narrow(1, S - 1, 1).expand({B, pad})}, 1) : ids;
  const at::Tensor v = padded.view({B, n, 32});
  return at::stack({std::get<0>(v.min(2)), std::get<0>(v.max(2))}, 2).contiguous();
}

// The kernels' per-32-row segment summaries (their tile walks classify 32 tiles at a time from
// them), held by `keep`.
void add_segment_blocks(AttentionPlan& plan) {
  if (!plan.q_segments.defined()) return;
  AttentionPattern& pat = plan.params.pattern;
  at::Tensor qb = segment_blocks(plan.q_segments), kb = segment_blocks(plan.kv_segments);
  pat.q_seg_blocks = qb.const_data_ptr<int64_t>();
  pat.kv_seg_blocks = kb.const_data_ptr<int64_t>();
  pat.q_seg_nblocks = qb.size(1);
  pat.kv_seg_nblocks = kb.size(1);
  plan.keep.push_back(qb);
  plan.keep.push_back(kb);
}

AttentionCudaArgs cuda_args(const AttentionParams& p) {
  AttentionCudaArgs a;
  a.g.fwd = p;
  set_scale_args(a, p.scale, p.softcap);
  a.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return a;
}

// Resident decode blocks of `rows` query rows an SM holds, asked once per (head dim, rows, paged).
int decode_blocks_per_sm(int head_dim, int rows, bool paged) {
  // (64, 128, 256) x (contiguous, paged) x rows; 0: not asked yet (a benign race: same value)
  static int cache[3][2][65] = {};
  const int which = head_dim == 64 ? 0 : head_dim == 128 ? 1 : 2;
  if (rows < 1 || rows > 64) return 1;
  int& n = cache[which][paged ? 1 : 0][rows];
  if (n == 0) n = std::max(attention_decode_blocks_per_sm_at(head_dim, rows, paged), 1);
  return n;
}

void check_launch(const char* op, int err) {
  TORCH_CHECK(
      err != cudaErrorNoKernelImageForDevice, op,
      ": this build has no kernel for this GPU (the CUDA kernels need compute capability 8.0 or newer "
      "and a build for it)");
  TORCH_CHECK(err == cudaSuccess, op,
              ": CUDA kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace attention_host

using namespace attention_host;

namespace {

// The decode pass (few query rows against many keys): the split-KV decode kernel and its merge, with
// their workspace of partial states.
void run_decode_plan(const char* op, AttentionPlan& plan, int64_t kd, const at::TensorOptions& options,
                     cudaStream_t stream) {
  add_segment_blocks(plan);
  const AttentionParams& p = plan.params;
  const int rows = static_cast<int>((p.heads / p.kv_heads) * p.pattern.sq);
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  const int64_t slots =
      int64_t{props->multiProcessorCount} *
      std::max(1, decode_blocks_per_sm(static_cast<int>(kd), rows, p.block_table != nullptr));
  DecodeSplit s = decode_split(p, slots);
  at::Tensor part =
      at::empty({p.batch * p.kv_heads * s.chunks * s.rows * decode_part_stride(static_cast<int>(kd))},
                options.dtype(at::kFloat));
  s.part = part.data_ptr<float>();
  at::Tensor counts;
  if (s.blocks) {
    counts = at::empty({p.batch}, options.dtype(at::kInt));
    s.counts = counts.data_ptr<int32_t>();
  }
  check_launch(op, run_attention_decode_at(static_cast<int>(kd), cuda_args(p), s, stream));
}

// The forward pass on the tiled kernels: kMmaSync's at the head dim, or kHopper's form
// (hopper_fwd_form) with what it needs: the persistent forms' work counter, the segment-runs form's
// workspace (the runs its first kernel finds).
void run_forward_plan(const char* op, AttentionPlan& plan, AttentionCall call, int64_t kd,
                      AttentionKernel kernel, const at::TensorOptions& options, cudaStream_t stream) {
  add_segment_blocks(plan);
  AttentionCudaArgs a = cuda_args(plan.params);
  if (kernel != AttentionKernel::kHopper) {
    check_launch(op, run_attention_mma_fwd_at(static_cast<int>(kd), a, stream));
    return;
  }
  add_pattern(call, plan.params);
  const HopperFwdForm form = hopper_fwd_form(call);
  at::Tensor counter, runs;
  if (form.persistent) {
    counter = at::zeros({1}, options.dtype(at::kInt));
    a.fwd_counter = counter.data_ptr<int>();
  }
  if (form.segment_runs) {
    runs = at::empty({plan.params.batch * plan.params.pattern.sq + 3}, options.dtype(at::kInt));
    a.seg_runs = runs.data_ptr<int32_t>();
  }
  check_launch(op, run_attention_hopper_fwd_form(form, a, stream));
}

// The forward kernels on q, k, v (their varlen offsets checked, or not read while a CUDA graph is
// captured: `captured`), writing out (empty_attention_like's layout, or a view of rows of it) and lse
// (contiguous (B, H, Sq)).
void attention_forward_into(const char* op, const AttentionPatternArgs& args, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, double scale, double softcap,
                            bool kv_lens, c10::string_view variant, bool captured, at::Tensor& out,
                            at::Tensor& lse) {
  AttentionCall call = cuda_call(q, k, kv_lens, false, args.varlen());
  // (the wider of q's and v's head dims: the kernels with one head dim run at it, decode's row limit
  // with them; the Hopper forward's own pairs from both: hopper_fwd_dims)
  call.head_dim = std::max(q.size(3), v.size(3));
  call.head_dim_v = v.size(3);
  call.block_mask = args.mask_kinds.has_value();
  const AttentionKernel kernel = choose_attention_kernel(op, call, variant);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (out.numel() == 0 || k.size(2) == 0) {  // (no key anywhere: out 0, the LSE -inf or the sinks)
    out.zero_();
    fill_unseen_lse(lse, args.sinks);
    if (args.varlen() && captured) {  // (rows past the last offset: no sequence, no sink)
      fill_rows_past_offsets(lse, std::nullopt, *args.cu_seqlens_q, -kInf);
    }
    return;
  }
  // The kernel's head dims: q / k and v (the Hopper forward's own (192, 128) and (192, 192)), else one
  // for all three: each operand zero-padded up to its own.
  const int64_t dv = v.size(3);
  const int64_t kd = kernel_head_dim(call.head_dim);  // (the other kernels': the wider head dim's)
  const HopperFwdDims dims = kernel == AttentionKernel::kHopper ? call.hopper_dims() : HopperFwdDims{kd, kd};
  // (the Hopper forward reads narrower q, k, v in place: hopper_operands)
  const bool hopper = kernel == AttentionKernel::kHopper;
  const std::vector<at::Tensor> qks = hopper ? hopper_operands({q, k}, dims.qk)
                                             : std::vector<at::Tensor>{kernel_operand(q, dims.qk, kernel),
                                                                       kernel_operand(k, dims.qk, kernel)};
  const at::Tensor &qk = qks[0], &kk = qks[1];
  const at::Tensor vk = hopper ? hopper_operands({v}, dims.v)[0] : kernel_operand(v, dims.v, kernel);
  at::Tensor out_k = dims.v == dv ? out : empty_attention_like(q, args.varlen(), dims.v);
  AttentionPlan plan = plan_attention(qk, kk, vk, out_k, lse, scale, softcap, args);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  if (kernel == AttentionKernel::kDecode) {
    run_decode_plan(op, plan, dims.qk, q.options(), stream);
  } else {
    run_forward_plan(op, plan, call, dims.qk, kernel, q.options(), stream);
  }
  if (dims.v != dv) out.copy_(out_k.narrow(3, 0, dv));
  if (args.varlen() && captured) {  // (rows past the last offset, unknown here, on the device)
    fill_rows_past_offsets(out, std::nullopt, *args.cu_seqlens_q, 0.0);
    fill_rows_past_offsets(lse, std::nullopt, *args.cu_seqlens_q, -kInf);
  }
}

std::tuple<at::Tensor, at::Tensor> attention_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap, bool causal,
    int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& sinks,
    c10::string_view variant, std::optional<bool> deterministic, bool check_offsets) {
  const AttentionPatternArgs args = checked_attention_args(
      q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, q_segments, kv_segments,
      mask_kinds, mask_index, mask_bits, block_q, block_k, kv_lens, cu_seqlens_q, cu_seqlens_k, sinks);
  const char* op = attention_op_name(args);
  check_cuda_call(op, q, k, v);
  const c10::cuda::CUDAGuard guard(q.device());
  // (v's head dim may differ from q's and k's: attention_forward_into runs each at its kernel's)
  // (check_offsets false: the caller vouches for the offsets, which are then not read on the host,
  // as while a CUDA graph is captured: the kernels clamp them, and rows past the last are zeroed on
  // the device)
  const auto rows =
      check_offsets ? check_varlen_offsets_unless_capturing(op, args, q.size(2), k.size(2)) : std::nullopt;
  at::Tensor out = empty_attention_like(q, args.varlen(), v.size(3));
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  if (rows && (rows->first < q.size(2) || rows->second < k.size(2))) {
    const auto [rows_q, rows_k] = *rows;
    // Rows past the last offsets (a padded batch), with the offsets read: the kernels run on the rows
    // in sequences only, so that the padding's values (whatever they are) are never loaded as keys of
    // the last sequence; they write those rows of the output in place (the LSE through a contiguous
    // one of those rows, its layout), the other rows are zeros, their LSE -inf. (While a CUDA graph is
    // captured the offsets are not read: the kernels take the whole tensors, and keys past the last
    // sequence's end in its last tile are masked.)
    const at::Tensor qn = q.narrow(2, 0, rows_q), kn = k.narrow(2, 0, rows_k), vn = v.narrow(2, 0, rows_k);
    const AttentionPatternArgs args_n = checked_attention_args(
        qn, kn, vn, scale, softcap, causal, window_left, window_right, prefix_len, q_segments, kv_segments,
        mask_kinds, mask_index, mask_bits, block_q, block_k, kv_lens, cu_seqlens_q, cu_seqlens_k, sinks);
    at::Tensor out_n = out.narrow(2, 0, rows_q);
    at::Tensor lse_n = at::empty({q.size(0), q.size(1), rows_q}, lse.options());
    attention_forward_into(op, args_n, qn, kn, vn, scale, softcap, kv_lens.has_value(), variant, false, out_n,
                           lse_n);
    out.narrow(2, rows_q, q.size(2) - rows_q).zero_();
    lse.narrow(2, 0, rows_q).copy_(lse_n);
    lse.narrow(2, rows_q, q.size(2) - rows_q).fill_(-std::numeric_limits<double>::infinity());
    return {out, lse};
  }
  attention_forward_into(op, args, q, k, v, scale, softcap, kv_lens.has_value(), variant, !rows.has_value(),
                         out, lse);
  return {out, lse};
}

// The backward kernels on q, k, v (their varlen offsets checked, or not read while captured:
// `captured`), writing dq, dk, dv (empty_attention_like's layouts, or views of rows of them); lse and
// grad_lse are read as contiguous (B, H, Sq). Returns d sinks (args.sinks: from the prep pass's
// per-row lse2 and delta; empty without sinks).
at::Tensor attention_backward_into(const char* op, const AttentionPatternArgs& args,
                                   const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                   const std::optional<at::Tensor>& grad_lse, double scale, double softcap,
                                   c10::string_view variant, std::optional<bool> deterministic, bool captured,
                                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  // (the kernels' head dims, q / k and v: the Hopper backward's (hopper_bwd_dims: 64, 128, 192, 256,
  // and (192, 128)), the mma.sync's one of 64 / 128 / 256 for the wider of q's and v's; each operand
  // zero-padded up to its own, or read narrower in place: hopper_operands)
  const int64_t d = q.size(3), dvh = v.size(3);
  AttentionCall call = cuda_call(q, k, false, true, args.varlen());
  call.head_dim = d, call.head_dim_v = dvh;
  const AttentionKernel kernel = choose_attention_kernel(op, call, variant);
  const HopperFwdDims dims =
      kernel == AttentionKernel::kHopper
          ? hopper_bwd_dims(d, dvh)
          : HopperFwdDims{kernel_head_dim(std::max(d, dvh)), kernel_head_dim(std::max(d, dvh))};
  const int64_t kd = dims.qk, kdv = dims.v;
  if (q.numel() == 0 || k.numel() == 0) {
    dq.zero_(), dk.zero_(), dv.zero_();
    return attention_sink_grad(grad_out, out, lse, grad_lse, args.sinks);
  }
  // (the Hopper backward reads narrower q, k and v, out, dO in place: hopper_operands; the prep pass
  // skips the columns past out's and dO's width)
  const bool hopper = kernel == AttentionKernel::kHopper;
  const std::vector<at::Tensor> qks =
      hopper ? hopper_operands({q, k}, kd)
             : std::vector<at::Tensor>{kernel_operand(q, kd, kernel), kernel_operand(k, kd, kernel)};
  const std::vector<at::Tensor> vs =
      hopper ? hopper_operands({v, out, grad_out}, kdv)
             : std::vector<at::Tensor>{kernel_operand(v, kdv, kernel), kernel_operand(out, kdv, kernel),
                                       kernel_operand(grad_out, kdv, kernel)};
  const at::Tensor &qk = qks[0], &kk = qks[1], &vk = vs[0], &ok = vs[1], &gk = vs[2];
  const at::Tensor lse_c = lse.contiguous();
  const at::Tensor grad_lse_c = grad_lse ? grad_lse->contiguous() : at::Tensor();
  // (the kernels write kd columns)
  at::Tensor dq_k = kd == d ? dq : empty_attention_like(q, false, kd);
  at::Tensor dk_k = kd == d ? dk : empty_attention_like(k, false, kd);
  at::Tensor dv_k = kdv == dvh ? dv : empty_attention_like(v, false, kdv);
  AttentionPlan plan = plan_attention(qk, kk, vk, ok, lse_c, scale, softcap, args);
  add_segment_blocks(plan);
  AttentionCudaArgs a = cuda_args(plan.params);
  a.g = attention_grad_params(plan.params, gk, grad_lse_c, dq_k, dk_k, dv_k);
  // Varlen: one row of scratch a head, each sequence at its padded start (padded_start).
  a.lse2_ld = args.varlen() ? padded_rows(q.size(2), plan.params.batch, 128) : (q.size(2) + 127) / 128 * 128;
  at::Tensor scratch = at::empty({2, q.size(0), q.size(1), a.lse2_ld}, q.options().dtype(at::kFloat));
  a.lse2 = scratch[0].data_ptr<float>();
  a.delta = scratch[1].data_ptr<float>();
  at::Tensor dq_accum;  // (zeroed by the prep kernel)
  if (kernel == AttentionKernel::kHopper) {
    dq_accum = at::empty({q.size(0), q.size(1), a.lse2_ld, kd}, q.options().dtype(at::kFloat));
    a.dq_accum = dq_accum.data_ptr<float>();
  }
  // The Hopper kernel adds dQ in any order unless asked (None: as torch.use_deterministic_algorithms
  // says); the mma.sync passes are deterministic by construction.
  add_pattern(call, plan.params);
  call.deterministic = deterministic.value_or(at::globalContext().deterministicAlgorithms());
  at::Tensor dq_semaphore;
  if (kernel == AttentionKernel::kHopper && call.deterministic) {
    // (one int more: the flag of invalid varlen offsets, AttentionCudaArgs::offsets_invalid)
    const int64_t counters = q.size(0) * q.size(1) * (a.lse2_ld / 64);
    dq_semaphore = at::zeros({counters + 1}, q.options().dtype(at::kInt));
    a.dq_semaphore = dq_semaphore.data_ptr<int>();
    if (args.varlen()) a.offsets_invalid = a.dq_semaphore + counters;
  }
  // The backward pass: the prep, then kHopper's form (hopper_bwd_form: its one-pass kernel and dQ
  // conversion) or kMmaSync's dK/dV and dQ passes.
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  check_launch(op, run_attention_bwd_prep_at(static_cast<int>(kd), a, stream));
  if (kernel == AttentionKernel::kHopper) {
    check_launch(op, run_attention_hopper_bwd_form(hopper_bwd_form(call), a, stream));
  } else {
    check_launch(op, run_attention_mma_bwd_kv_at(static_cast<int>(kd), a, stream));
    check_launch(op, run_attention_mma_bwd_q_at(static_cast<int>(kd), a, stream));
  }
  if (kd != d) {
    dq.copy_(dq_k.narrow(3, 0, d));
    dk.copy_(dk_k.narrow(3, 0, d));
  }
  if (kdv != dvh) dv.copy_(dv_k.narrow(3, 0, dvh));
  if (args.varlen() && captured) {  // (as the forward)
    fill_rows_past_offsets(dq, std::nullopt, *args.cu_seqlens_q, 0.0);
    fill_rows_past_offsets(dk, std::nullopt, *args.cu_seqlens_k, 0.0);
    fill_rows_past_offsets(dv, std::nullopt, *args.cu_seqlens_k, 0.0);
  }
  return args.sinks ? attention_sink_grad_from_prep(scratch[0], scratch[1], *args.sinks)
                    : at::empty({0}, lse.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& grad_lse, double scale,
    double softcap, bool causal, int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    const std::optional<at::Tensor>& sinks, c10::string_view variant, std::optional<bool> deterministic) {
  constexpr const char* op = "opforge.attention_backward";
  AttentionPatternArgs args =
      attention_pattern_args(causal, window_left, window_right, prefix_len, q_segments, kv_segments,
                             mask_kinds, mask_index, mask_bits, block_q, block_k);
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  args.sinks = sinks;
  check_attention_backward_inputs(grad_out, q, k, v, out, lse, grad_lse, scale, softcap, args);
  check_cuda_call(op, q, k, v);
  const c10::cuda::CUDAGuard guard(q.device());
  // (v's head dim may differ from q's and k's: attention_backward_into runs all at one kernel head dim)
  const auto rows = check_varlen_offsets_unless_capturing(op, args, q.size(2), k.size(2));
  at::Tensor dq = empty_attention_like(q), dk = empty_attention_like(k), dv = empty_attention_like(v);
  if (rows && (rows->first < q.size(2) || rows->second < k.size(2))) {  // (as the forward)
    const auto [rows_q, rows_k] = *rows;
    const auto nq = [&](const at::Tensor& t) { return t.narrow(2, 0, rows_q); };
    const auto nk = [&](const at::Tensor& t) { return t.narrow(2, 0, rows_k); };
    const std::optional<at::Tensor> gl =
        grad_lse ? std::optional<at::Tensor>(nq(*grad_lse).contiguous()) : std::nullopt;
    const at::Tensor lse_n = nq(lse).contiguous();
    at::Tensor dq_n = nq(dq), dk_n = nk(dk), dv_n = nk(dv);
    at::Tensor d_sinks =
        attention_backward_into(op, args, nq(grad_out), nq(q), nk(k), nk(v), nq(out), lse_n, gl, scale,
                                softcap, variant, deterministic, false, dq_n, dk_n, dv_n);
    dq.narrow(2, rows_q, q.size(2) - rows_q).zero_();
    dk.narrow(2, rows_k, k.size(2) - rows_k).zero_();
    dv.narrow(2, rows_k, v.size(2) - rows_k).zero_();
    return {dq, dk, dv, d_sinks};
  }
  at::Tensor d_sinks =
      attention_backward_into(op, args, grad_out, q, k, v, out, lse, grad_lse, scale, softcap, variant,
                              deterministic, !rows.has_value(), dq, dk, dv);
  return {dq, dk, dv, d_sinks};
}
}  // namespace

// Paged caches: the decode kernels, or for more query rows (chunked prefill) the Hopper forward (its
// TMA boxes a page run at a time, page sizes attention_hopper_fwd_pages_at takes) or the mma.sync
// forward, with their K / V rows addressed through the page table. The caller (opforge.attention)
// sends calls with head dims 64 / 128 / 256 and caches whose rows start at 16-byte boundaries;
// others are refused here.
std::tuple<at::Tensor, at::Tensor> attention_paged_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                                                        const at::Tensor& v_cache, const at::Tensor& kv_lens,
                                                        const at::Tensor& block_table, double scale,
                                                        double softcap, bool causal, int64_t window_left,
                                                        int64_t window_right, int64_t prefix_len,
                                                        c10::string_view variant,
                                                        const std::optional<at::Tensor>& sinks) {
  constexpr const char* op = "opforge.attention";
  TORCH_CHECK(q.defined() && q.dim() == 4, op, ": q must be a 4-D tensor (batch, heads, sequence, head_dim)");
  check_cuda_call(op, q, k_cache, v_cache);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = empty_attention_like(q, false, v_cache.size(3));
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  AttentionPlan plan =
      plan_paged_attention(q, k_cache, v_cache, kv_lens, int32_block_table(block_table, k_cache.size(0)), out,
                           lse, scale, softcap, causal, window_left, window_right, prefix_len, sinks);
  if (out.numel() == 0) {
    fill_unseen_lse(lse, sinks);
    return {out, lse};
  }
  const int64_t d = q.size(3);
  // Every kernel here reads pages in place at the head dims it runs (no zero padding of a page; 64 / 128
  // / 256, one for k and v) and from rows its 16-byte copies can address (no stride-0 dimension); other
  // caches are gathered (and the kernel chosen for the gathered call: its page size does not count).
  bool in_place = kernel_head_dim(d) == d && v_cache.size(3) == d;
  for (const at::Tensor* t : {&k_cache, &v_cache}) {
    in_place = in_place && t->stride(3) == 1 && reinterpret_cast<uintptr_t>(t->const_data_ptr()) % 16 == 0;
    for (int dim = 0; dim < 3; ++dim) {
      in_place = in_place && t->stride(dim) % 8 == 0 && (t->stride(dim) != 0 || t->size(dim) == 1);
    }
  }
  if (!in_place) {
    return attention_paged_gathered(q, k_cache, v_cache, kv_lens, block_table, scale, softcap, causal,
                                    window_left, window_right, prefix_len, variant, sinks);
  }
  const AttentionCall call = cuda_call(q, paged_view(k_cache, q.size(0), plan.params.pattern.sk), true, false,
                                       false, k_cache.size(1));
  const AttentionKernel kernel = choose_attention_kernel(op, call, variant);
  const at::Tensor qk = kernel_operand(q, d, kernel);
  plan.params.q = qk.const_data_ptr();
  plan.params.q_bs = qk.stride(0), plan.params.q_hs = qk.stride(1), plan.params.q_ss = qk.stride(2);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  if (kernel == AttentionKernel::kDecode) {
    run_decode_plan(op, plan, d, q.options(), stream);
  } else {
    run_forward_plan(op, plan, call, d, kernel, q.options(), stream);
  }
  return {out, lse};
}

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("attention_paged", &attention_paged_cuda);
  m.impl("attention", &attention_cuda);
  m.impl("attention_backward", &attention_backward_cuda);
}

}  // namespace opforge
