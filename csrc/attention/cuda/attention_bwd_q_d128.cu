// attention CUDA backward, the dQ pass for head dim 128 (BwdQTraitsD128), float16 and bfloat16.
#include "attention/cuda/attention_bwd_kernel.cuh"

namespace opforge {

int run_attention_bwd_q_d128(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_bwd_q<attention_cuda::BwdQTraitsD128>(a, stream);
}

}  // namespace opforge
