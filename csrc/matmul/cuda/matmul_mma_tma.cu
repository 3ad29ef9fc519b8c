// matmul variant "mma_tma": the TMA-fed mma.sync kernel (mma_tma_kernel.cuh) in its shipped
// configuration, for bfloat16 and float16, with either epilogue (TMA stores where c allows).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "matmul/cuda/mma_tma_kernel.cuh"
#include "matmul/matmul_params.h"

namespace opforge {

int run_matmul_mma_tma_cuda(const GemmParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kBFloat16:
      return mma::launch_tma<mma::TmaTraits, __nv_bfloat16>(p, s);
    case DType::kFloat16:
      return mma::launch_tma<mma::TmaTraits, __half>(p, s);
    default:
      return cudaErrorInvalidValue;
  }
}

bool matmul_mma_tma_available() {
  return mma::prepare_tma<mma::TmaTraits, __nv_bfloat16, true>() == cudaSuccess &&
         mma::prepare_tma<mma::TmaTraits, __half, true>() == cudaSuccess;
}

}  // namespace opforge
