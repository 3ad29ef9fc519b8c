// attention CUDA backward for Hopper, head dim 64, the block-mask form (HopperBwdTraitsMaskD64: partial
// mask tiles' bits staged in shared memory by the producer): the one-pass kernel and its dQ
// conversion, float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_mask_d64(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_bwd<attention_cuda::HopperBwdTraitsMaskD64>(a, stream);
}

}  // namespace opforge
