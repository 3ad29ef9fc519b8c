// attention CUDA backward, the prep pass (delta and lse2 per query row) for every head dim and
// 16-bit type.
#include "attention/cuda/attention_bwd_kernel.cuh"

namespace opforge {

namespace {
template <int kD, typename T>
int launch_prep(const AttentionCudaArgs& a, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 256 / (kD / 8);
  const int64_t rows = (a.g.fwd.pattern.varlen() ? 1 : a.g.fwd.batch) * a.g.fwd.heads * a.lse2_ld;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  attention_cuda::attention_bwd_prep_kernel<kD, T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(a);
  return cudaGetLastError();
}
template <typename T>
int launch_prep_t(const AttentionCudaArgs& a, cudaStream_t stream) {
  switch (a.g.fwd.head_dim) {
    case 64:
      return launch_prep<64, T>(a, stream);
    case 128:
      return launch_prep<128, T>(a, stream);
    case 256:
      return launch_prep<256, T>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
}  // namespace

int run_attention_bwd_prep(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16:
      return launch_prep_t<__nv_bfloat16>(a, s);
    case DType::kFloat16:
      return launch_prep_t<__half>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace opforge
