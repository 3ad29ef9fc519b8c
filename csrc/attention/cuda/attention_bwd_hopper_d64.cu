// attention CUDA backward for Hopper, head dim 64 (HopperBwdTraitsD64; with a block mask the form in
// attention_bwd_hopper_mask_d64.cu): the one-pass kernel and its
// dQ conversion, float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_mask_d64(const AttentionCudaArgs& a, void* stream);

int run_attention_bwd_hopper_d64(const AttentionCudaArgs& a, void* stream) {
  if (a.g.fwd.pattern.mask_kinds != nullptr) return run_attention_bwd_hopper_mask_d64(a, stream);
  return attention_cuda::run_hopper_bwd<attention_cuda::HopperBwdTraitsD64>(a, stream);
}

}  // namespace opforge
