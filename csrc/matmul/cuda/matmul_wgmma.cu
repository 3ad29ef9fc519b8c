// matmul variant "wgmma" (float16/bfloat16, sm_90a): the warpgroup-MMA kernel (wgmma_kernel.cuh)
// in its shipped configurations. 128 x 256 tiles where there are at least half as many as SMs
// (measured faster from 2048^3 up), stored by TMA where c's layout allows; else 128 x 128 tiles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "matmul/cuda/wgmma_kernel.cuh"
#include "matmul/matmul_params.h"

namespace opforge {
namespace {

template <typename T, bool kBNMajor>
cudaError_t launch_for(const GemmParams& p, cudaStream_t stream) {
  int dev = 0, sms = 132;  // the current device's (cached by the runtime)
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t wide_tiles = (p.m + wgmma::kBM - 1) / wgmma::kBM * ((p.n + 255) / 256) * p.batch;
  if (2 * wide_tiles < sms) return wgmma::launch<wgmma::NarrowTraits, T, false, kBNMajor>(p, stream);
  return mma_tma_storable(p) ? wgmma::launch<wgmma::WideTraits, T, true, kBNMajor>(p, stream)
                             : wgmma::launch<wgmma::WideTraits, T, false, kBNMajor>(p, stream);
}

template <typename T>
cudaError_t launch_layout(const GemmParams& p, cudaStream_t stream) {
  if (p.b_cs == 1 && p.b_rs != 1) return launch_for<T, true>(p, stream);  // b by rows
  if (p.b_rs == 1) return launch_for<T, false>(p, stream);                // b by columns (rows of b^T)
  return cudaErrorInvalidValue;
}

}  // namespace

int run_matmul_wgmma_cuda(const GemmParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kBFloat16:
      return launch_layout<__nv_bfloat16>(p, s);
    case DType::kFloat16:
      return launch_layout<__half>(p, s);
    default:
      return cudaErrorInvalidValue;
  }
}

bool matmul_wgmma_available() {
  return wgmma::prepare<wgmma::WideTraits, __nv_bfloat16, true, true>() == cudaSuccess &&
         wgmma::prepare<wgmma::WideTraits, __half, true, true>() == cudaSuccess;
}

}  // namespace opforge
