// attention CUDA backward for Hopper, head dim 256 (HopperBwdTraitsD256: 64 x 64 tiles, the consumer
// warpgroups splitting the head dim): the one-pass kernel and its dQ conversion, float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_d256(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_bwd<attention_cuda::HopperBwdTraitsD256>(a, stream);
}

}  // namespace opforge
