// attention CUDA: what the launcher (attention_cuda.cpp) hands the kernels' translation units
// (one .cu per pass and head dim), with no torch types.
#pragma once

#include <cstdint>

#include "attention/attention_params.h"

namespace opforge {

// The call as the kernels read it. Operands are 16-bit (float16 / bfloat16), head_dim is the
// kernel's (64, 128 or 256: the launcher zero-pads other head dims), rows of q, k, v, out (and of
// the gradients) start at 16-byte boundaries with unit column stride, and Sq + Sk < 2^31.
struct AttentionCudaArgs {
  AttentionGradParams g;      // g.fwd: the forward's parameters; the rest for the backward only
  float scale = 0.f;
  float scale_log2 = 0.f;     // scale * log2(e)
  float cap_log2 = 0.f;       // softcap * log2(e); 0: no softcap
  float cap_inv_scale = 0.f;  // scale / softcap
  float inv_cap_log2 = 0.f;   // 1 / (softcap * log2(e))
  // Backward scratch, (B, Hq, Sq) each: lse * log2(e) (+inf for rows that see nothing), and
  // rowsum(dO * O) - grad_lse.
  float* lse2 = nullptr;
  float* delta = nullptr;
  int64_t lse2_ld = 0;  // their row length: Sq rounded up to 64 (padding rows: lse2 +inf, delta 0)
};

// Launchers, on `stream`; each returns a cudaError_t (cudaErrorNoKernelImageForDevice where the
// binary has no sm_80+ code for this GPU).
// The forward: the Hopper kernel where it serves (unless use_mma_sync), else the mma.sync one.
int run_attention_fwd_cuda(const AttentionCudaArgs& a, int head_dim, bool use_mma_sync, void* stream);
// The backward: prep, then the Hopper passes where they serve (unless use_mma_sync), else the
// mma.sync ones.
int run_attention_bwd_cuda(const AttentionCudaArgs& a, int head_dim, bool use_mma_sync, void* stream);
// The Hopper forward (sm_90a; TMA needs 16-byte strides): cudaErrorNoKernelImageForDevice without
// its code, cudaErrorInvalidValue where TMA cannot address the operands.
int run_attention_fwd_hopper_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_d256(const AttentionCudaArgs& a, void* stream);
// The Hopper backward passes (head dims 64 and 128), same return values.
int run_attention_bwd_hopper_kv_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_hopper_kv_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_hopper_q_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_hopper_q_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_kv_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_kv_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_kv_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_q_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_q_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_q_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_bwd_prep(const AttentionCudaArgs& a, void* stream);

}  // namespace opforge
