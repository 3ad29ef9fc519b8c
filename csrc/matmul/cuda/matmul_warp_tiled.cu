// matmul variants "warp_tiled_staged" and "warp_tiled_cp_async" (float32): the warp-tiled kernels
// (warp_tiled_kernel.cuh) in their shipped configurations.
#include <cuda_runtime.h>

#include "matmul/cuda/warp_tiled_kernel.cuh"
#include "matmul/matmul_params.h"

namespace opforge {

int run_matmul_warp_tiled_staged_cuda(const GemmParams& p, void* stream) {
  return warp_tiled::launch_staged<warp_tiled::StagedTraits>(p, static_cast<cudaStream_t>(stream));
}

int run_matmul_warp_tiled_cp_async_cuda(const GemmParams& p, void* stream) {
  return warp_tiled::launch_cp_async<warp_tiled::CpAsyncTraits>(p, static_cast<cudaStream_t>(stream));
}

bool matmul_warp_tiled_cp_async_available() {
  return warp_tiled::prepare_cp_async<warp_tiled::CpAsyncTraits>() == cudaSuccess;
}

}  // namespace opforge
