// attention CUDA backward for Hopper, head dim 128, the block-mask form (HopperBwdTraitsMaskD128: partial
// mask tiles' bits staged in shared memory by the producer): the one-pass kernel and its dQ
// conversion, float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_mask_d128(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_bwd<attention_cuda::HopperBwdTraitsMaskD128>(a, stream);
}

}  // namespace opforge
