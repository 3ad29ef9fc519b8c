// attention CUDA decode for head dim 256 (DecodeMmaTraits<256, ...>: one, two or four m tiles), float16 and
// bfloat16.
#include "attention/cuda/attention_decode_kernel.cuh"

namespace opforge {

int run_attention_decode_d256(const AttentionCudaArgs& a, const DecodeSplit& s, void* stream) {
  return attention_cuda::run_decode<256>(a, s, stream);
}

int attention_decode_blocks_per_sm_d256(int rows) {
  return attention_cuda::decode_blocks_per_sm<256>(rows);
}

}  // namespace opforge
