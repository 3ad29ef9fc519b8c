// attention CUDA backward, the dK/dV pass for head dim 64 (BwdKVTraitsD64), float16 and bfloat16.
#include "attention/cuda/attention_bwd_kernel.cuh"

namespace opforge {

int run_attention_bwd_kv_d64(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_bwd_kv<attention_cuda::BwdKVTraitsD64>(a, stream);
}

}  // namespace opforge
