// attention CUDA forward for Hopper, head dim 256 (HopperFwdTraitsD256; with a block mask the form in
// attention_fwd_hopper_mask_d256.cu), float16 and bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_mask_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_cache_d256(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_cache_mask_d256(const AttentionCudaArgs& a, void* stream);

int run_attention_fwd_hopper_d256(const AttentionCudaArgs& a, void* stream) {
  if (a.g.fwd.pattern.kv_lens != nullptr) {  // (per-sequence key counts, paged caches: the KV-cache form)
    return a.g.fwd.pattern.mask_kinds != nullptr ? run_attention_fwd_hopper_cache_mask_d256(a, stream)
                                                 : run_attention_fwd_hopper_cache_d256(a, stream);
  }
  if (a.g.fwd.pattern.mask_kinds != nullptr) return run_attention_fwd_hopper_mask_d256(a, stream);
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsD256>(a, stream);
}

}  // namespace opforge
