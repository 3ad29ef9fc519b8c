// attention CUDA backward for Hopper, head dim 256 (HopperBwdTraitsD256: 64 x 64 tiles, the consumer
// warpgroups splitting the head dim, two Q / dO stages, dQ added by vector reductions): the one-pass
// kernel and its dQ conversion, float16 and bfloat16. Deterministic mode runs
// HopperBwdTraitsD256Deterministic (attention_bwd_hopper_d256_deterministic.cu).
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_d256_deterministic(const AttentionCudaArgs& a, void* stream);

int run_attention_bwd_hopper_d256(const AttentionCudaArgs& a, void* stream) {
  if (a.dq_semaphore != nullptr) return run_attention_bwd_hopper_d256_deterministic(a, stream);
  return attention_cuda::run_hopper_bwd<attention_cuda::HopperBwdTraitsD256>(a, stream);
}

}  // namespace opforge
