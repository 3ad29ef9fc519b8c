// attention CUDA forward for Hopper, head dim 128, the persistent form (HopperFwdTraitsPersistentD128: a
// block a multiprocessor walking the work items, chosen by hopper_fwd_persistent), float16 and bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_persistent_d128(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsPersistentD128>(a, stream);
}

}  // namespace opforge
