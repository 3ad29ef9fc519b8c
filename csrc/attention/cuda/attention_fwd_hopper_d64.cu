// attention CUDA forward for Hopper, head dim 64 (HopperFwdTraitsD64; with a block mask the form in
// attention_fwd_hopper_mask_d64.cu, where hopper_fwd_persistent says so the persistent form), float16 and
// bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_mask_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_cache_d64(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_cache_mask_d64(const AttentionCudaArgs& a, void* stream);

int run_attention_fwd_hopper_d64(const AttentionCudaArgs& a, void* stream) {
  if (a.g.fwd.pattern.kv_lens != nullptr) {  // (per-sequence key counts, paged caches: the KV-cache form)
    return a.g.fwd.pattern.mask_kinds != nullptr ? run_attention_fwd_hopper_cache_mask_d64(a, stream)
                                                 : run_attention_fwd_hopper_cache_d64(a, stream);
  }
  if (a.g.fwd.pattern.mask_kinds != nullptr) return run_attention_fwd_hopper_mask_d64(a, stream);
  if (hopper_fwd_persistent(a.g.fwd, 64)) return run_attention_fwd_hopper_persistent_d64(a, stream);
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsD64>(a, stream);
}

}  // namespace opforge
