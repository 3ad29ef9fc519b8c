// attention CUDA backward for Hopper, the dK/dV pass for head dim 128 (HopperBwdKVTraitsD128), float16 and bfloat16.
#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {

int run_attention_bwd_hopper_kv_d128(const AttentionCudaArgs& a, void* stream) {
  return attention_cuda::run_hopper_pass<attention_cuda::HopperBwdKVTraitsD128, attention_cuda::LaunchBwdKV>(a, stream);
}

}  // namespace opforge
