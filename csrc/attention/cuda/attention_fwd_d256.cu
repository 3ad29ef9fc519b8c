// attention CUDA forward for head dim 256 (FwdTraitsD256), float16 and bfloat16.
#include "attention/cuda/attention_fwd_kernel.cuh"

namespace opforge {

int run_attention_fwd_d256(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_fwd<attention_cuda::FwdTraitsD256>(a, stream);
}

}  // namespace opforge
