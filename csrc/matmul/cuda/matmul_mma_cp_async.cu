// matmul variant "mma_cp_async": the cp.async mma.sync kernel (mma_cp_async_kernel.cuh) in its
// shipped configuration, for bfloat16 and float16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "matmul/cuda/mma_cp_async_kernel.cuh"
#include "matmul/matmul_params.h"

namespace opforge {

int run_matmul_mma_cp_async_cuda(const GemmParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kBFloat16:
      return mma::launch_cp_async<mma::CpAsyncTraits, __nv_bfloat16>(p, s);
    case DType::kFloat16:
      return mma::launch_cp_async<mma::CpAsyncTraits, __half>(p, s);
    default:
      return cudaErrorInvalidValue;
  }
}

bool matmul_mma_cp_async_available() {
  return mma::prepare_cp_async<mma::CpAsyncTraits, __nv_bfloat16>() == cudaSuccess &&
         mma::prepare_cp_async<mma::CpAsyncTraits, __half>() == cudaSuccess;
}

}  // namespace opforge
