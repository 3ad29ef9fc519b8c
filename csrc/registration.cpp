// Every opforge schema, in one place. Kernels register themselves in their backend files
// (TORCH_LIBRARY_IMPL(opforge, CPU|CUDA, m)); Python adds fake kernels and autograd.
#include <torch/library.h>

TORCH_LIBRARY(opforge, m) {
  m.def("vector_add(Tensor a, Tensor b) -> Tensor");
  m.def("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
  m.def("batched_nms(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor");
  m.def(
      "nms_padded(Tensor boxes, Tensor scores, float iou_threshold, Tensor? idxs=None) -> (Tensor, Tensor)");
  m.def("matmul(Tensor a, Tensor b, *, str variant=\"auto\") -> Tensor");
  // Frames (N, H, W, C) uint8 -> (N, 3, size[0], size[1]) normalized; the resized frame fills
  // region = (top, left, height, width) of the output, the pad value the rest. The Python wrapper
  // (opforge.preprocess_frames) turns size/letterbox into the region.
  m.def(
      "preprocess_frames(Tensor frames, int[2] size, int[4] region, float scale, float[] mean, float[] std, "
      "float pad_value, int[3] channels, ScalarType out_dtype) -> Tensor");
  // Stream-ordered copies: dst <- src on the current CUDA stream, no host synchronization.
  m.def("copy_async(Tensor(a!) dst, Tensor src) -> ()");
  m.def("to_device_async(Tensor src, Device device) -> Tensor");
  // Attention over (B, H, S, D) q and (B, Hkv, S, D) k, v with a pattern (attention/attention_params.h
  // defines it): causal, a window (-1: unbounded side), a prefix, segment ids, a block mask (kinds,
  // partial index, bits), per-sequence key counts (the forward only). Returns the output and the log-sum-exp
  // of each query's scores. cu_seqlens_q / cu_seqlens_k (B + 1,) offsets: packed variable-length sequences
  // (varlen) in a batch of one (q (1, Hq, total_q, D), k and v (1, Hkv, total_k, D)), each its own sequence.
  // sinks (Hq,): one more logit a query head's every row takes in its softmax, with no value (attention
  // sinks, gpt-oss): the output is scaled by exp(lse - lse'), the LSE is lse' = logaddexp(lse, sink).
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, float scale, float softcap, bool causal, int window_left, "
      "int window_right, int prefix_len, Tensor? q_segments, Tensor? kv_segments, Tensor? mask_kinds, "
      "Tensor? mask_index, Tensor? mask_bits, int block_q, int block_k, Tensor? kv_lens=None, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? sinks=None, *, str variant=\"auto\", "
      "bool? deterministic=None, bool check_offsets=True) -> "
      "(Tensor, Tensor)");
  // FP8 attention (CUDA, Hopper): q, k, v float8_e4m3fn, their true values the stored ones times the
  // descale factors (float32 (batch, kv_heads); None: 1), the output bfloat16, the LSE float32;
  // forward only; the pattern arguments as attention's (no block mask, no kv_lens). opforge.attention
  // and attention_varlen call it for FP8 inputs on CUDA (the CPU dequantizes in Python).
  m.def(
      "attention_fp8(Tensor q, Tensor k, Tensor v, Tensor? q_descale, Tensor? k_descale, Tensor? v_descale, "
      "float scale, float softcap, bool causal, int window_left, int window_right, int prefix_len, Tensor? "
      "q_segments, Tensor? kv_segments, Tensor? mask_kinds, Tensor? mask_index, Tensor? mask_bits, int "
      "block_q, int block_k, Tensor? kv_lens=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
      "Tensor? sinks=None, *, str variant=\"auto\", bool check_offsets=True) -> (Tensor, Tensor)");
  // opforge::attention's checks of its arguments' sizes, dtypes, devices and values (nothing read
  // from a tensor's data): what the fake kernel runs (torch.compile, meta tensors), so that a
  // condition raises the same error there as in the op.
  m.def(
      "_attention_check(Tensor q, Tensor k, Tensor v, float scale, float softcap, bool causal, int "
      "window_left, int window_right, int prefix_len, Tensor? q_segments, Tensor? kv_segments, Tensor? "
      "mask_kinds, Tensor? mask_index, Tensor? mask_bits, int block_q, int block_k, Tensor? kv_lens=None, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? sinks=None, *, str variant=\"auto\", "
      "bool? deterministic=None) -> ()");
  // Attention against paged K/V caches (num_pages, page_size, Hkv, D): key j of sequence b is row
  // j % page_size of page block_table[b, j / page_size], for j < kv_lens[b]; the decode kernels (few
  // query rows a kv head) and on CUDA the mma.sync forward (chunks of new queries), the forward
  // only. variant: as opforge.attention's (the kernel rule's choice for "auto"). opforge.attention(...,
  // block_table=) calls it.
  m.def(
      "attention_paged(Tensor q, Tensor k_cache, Tensor v_cache, Tensor kv_lens, Tensor block_table, float "
      "scale, "
      "float softcap, bool causal, int window_left, int window_right, int prefix_len, str variant=\"auto\", "
      "Tensor? sinks=None) -> "
      "(Tensor, Tensor)");
  // New tokens k, v (B, Hkv, S_new, D) written into paged caches (num_pages, page_size, Hkv, D) in place:
  // sequence b's token i at position kv_lens[b] + i through block_table (B, max_pages).
  m.def(
      "paged_kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor block_table, "
      "Tensor kv_lens) -> ()");
  // The backward: (dq, dk, dv, d sinks) from the forward's out and lse (with its sinks, if it had
  // any: dq, dk, dv need nothing more), d sinks (Hq,) in the sinks' dtype (empty without sinks).
  m.def(
      "attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? "
      "grad_lse, "
      "float scale, float softcap, bool causal, int window_left, int window_right, int prefix_len, "
      "Tensor? q_segments, Tensor? kv_segments, Tensor? mask_kinds, Tensor? mask_index, Tensor? mask_bits, "
      "int block_q, int block_k, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? sinks=None, "
      "*, str variant=\"auto\", bool? deterministic=None) -> (Tensor, Tensor, Tensor, Tensor)");
  // The attention kernel a call of these sizes gets on `device` under `variant` (the one rule the
  // CPU and CUDA backends follow: attention/attention_heuristics.h); a ValueError where a named
  // variant cannot serve it.
  m.def(
      "_attention_kernel(Device device, int heads, int kv_heads, int sq, int sk, int head_dim, bool "
      "kv_lens=False, "
      "str variant=\"auto\", bool backward=False) -> str");
  // The kernel and, on the Hopper kernels, the form (attention/attention_heuristics.h: HopperFwdForm,
  // HopperBwdForm, e.g. "hopper/cache_mask") a call of these sizes and this pattern gets on `device`
  // under `variant`: sq, sk the packed totals under varlen (batch: the sequences); page_size a paged
  // cache's; deterministic the backward's mode (None: as torch.use_deterministic_algorithms says).
  m.def(
      "_attention_form(Device device, int heads, int kv_heads, int sq, int sk, int head_dim, bool "
      "kv_lens=False, str variant=\"auto\", bool backward=False, *, int batch=1, int page_size=0, bool "
      "causal=False, int window_left=-1, int window_right=-1, int prefix_len=0, bool segments=False, bool "
      "block_mask=False, bool varlen=False, bool? deterministic=None) -> str");
  // Which CPU variant of the kernels runs here ("avx2" or "default"), for tests and benchmark
  // reports (common/cpu_isa.cpp).
  m.def("_cpu_isa() -> str");
}
