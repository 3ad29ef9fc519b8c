// attention CUDA forward for Hopper, head dim 64, the block-mask form (HopperFwdTraitsMaskD64: partial
// mask tiles' bits staged in shared memory by the producer), float16 and bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_mask_d64(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsMaskD64>(a, stream);
}

}  // namespace opforge
