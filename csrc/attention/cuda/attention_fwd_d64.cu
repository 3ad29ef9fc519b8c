// attention CUDA forward for head dim 64 (FwdTraitsD64), float16 and bfloat16.
#include "attention/cuda/attention_fwd_kernel.cuh"

namespace opforge {

int run_attention_fwd_d64(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_fwd<attention_cuda::FwdTraitsD64>(a, stream);
}

}  // namespace opforge
