// attention CUDA backward for Hopper, head dim 128 (HopperBwdTraitsD128; with a block mask the form in
// attention_bwd_hopper_mask_d128.cu): the one-pass kernel and its
// dQ conversion, float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_mask_d128(const AttentionCudaArgs& a, void* stream);

int run_attention_bwd_hopper_d128(const AttentionCudaArgs& a, void* stream) {
  if (a.g.fwd.pattern.mask_kinds != nullptr) return run_attention_bwd_hopper_mask_d128(a, stream);
  return attention_cuda::run_hopper_bwd<attention_cuda::HopperBwdTraitsD128>(a, stream);
}

}  // namespace opforge
