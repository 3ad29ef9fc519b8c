// attention CUDA backward for Hopper, the dQ pass for head dim 64 (HopperBwdQTraitsD64), float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_q_d64(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_pass<attention_cuda::HopperBwdQTraitsD64, attention_cuda::LaunchBwdQ>(a, stream);
}

}  // namespace opforge
