// attention CUDA backward for Hopper, head dim 256, deterministic mode (HopperBwdTraitsD256Deterministic:
// one Q / dO stage, dQ staged for warp 1's ordered bulk reductions): float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_d256_deterministic(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_bwd<attention_cuda::HopperBwdTraitsD256Deterministic>(a, stream);
}

}  // namespace opforge
