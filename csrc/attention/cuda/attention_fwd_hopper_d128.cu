// attention CUDA forward for Hopper, head dim 128 (HopperFwdTraitsD128; with a block mask the form in
// attention_fwd_hopper_mask_d128.cu, with kv_lens or a paged cache the KV-cache forms, where
// hopper_fwd_persistent says so the persistent form), float16 and bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_mask_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_cache_d128(const AttentionCudaArgs& a, void* stream);
int run_attention_fwd_hopper_cache_mask_d128(const AttentionCudaArgs& a, void* stream);

int run_attention_fwd_hopper_d128(const AttentionCudaArgs& a, void* stream) {
  if (a.g.fwd.pattern.kv_lens != nullptr) {  // (per-sequence key counts, paged caches: the KV-cache form)
    return a.g.fwd.pattern.mask_kinds != nullptr ? run_attention_fwd_hopper_cache_mask_d128(a, stream)
                                                 : run_attention_fwd_hopper_cache_d128(a, stream);
  }
  if (a.g.fwd.pattern.mask_kinds != nullptr) return run_attention_fwd_hopper_mask_d128(a, stream);
  if (hopper_fwd_persistent(a.g.fwd, 128)) return run_attention_fwd_hopper_persistent_d128(a, stream);
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsD128>(a, stream);
}

int attention_hopper_status() {
  return attention_cuda::hopper_status<attention_cuda::HopperFwdTraitsD128>();
}

}  // namespace opforge
