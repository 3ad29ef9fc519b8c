// attention CUDA forward for Hopper, head dim 64, the persistent form (HopperFwdTraitsPersistentD64: a
// block a multiprocessor walking the work items, chosen by hopper_fwd_persistent), float16 and bfloat16.
#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_fwd_hopper_persistent_d64(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_fwd<attention_cuda::HopperFwdTraitsPersistentD64>(a, stream);
}

}  // namespace opforge
