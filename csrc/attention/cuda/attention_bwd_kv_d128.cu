// attention CUDA backward, the dK/dV pass for head dim 128 (BwdKVTraitsD128), float16 and bfloat16.
#include "attention/cuda/attention_bwd_kernel.cuh"

namespace opforge {

int run_attention_bwd_kv_d128(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_bwd_kv<attention_cuda::BwdKVTraitsD128>(a, stream);
}

}  // namespace opforge
