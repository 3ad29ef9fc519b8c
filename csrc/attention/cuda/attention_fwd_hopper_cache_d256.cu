// attention CUDA forward for Hopper, head dim 256, the KV-cache form (HopperFwdTraitsCacheD256: calls
// with per-sequence key counts, kv_lens, and paged caches), float16 and bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_cache_d256(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsCacheD256>(a, stream);
}

}  // namespace opforge
