// attention CUDA forward for Hopper, head dim 128, the KV-cache form with a block mask
// (HopperFwdTraitsCacheMaskD128), float16 and bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_cache_mask_d128(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsCacheMaskD128>(a, stream);
}

}  // namespace opforge
