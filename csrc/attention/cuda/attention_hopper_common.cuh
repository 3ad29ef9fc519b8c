// attention CUDA, Hopper kernels (sm_90a): what the forward and backward kernels share on the host
// side: the one-time setup that refuses a binary without their code, and the TMA maps of the
// operands.
#pragma once

#include <cuda.h>

#include "attention/cuda/attention_cuda.h"
#include "common/cuda/launch.cuh"
#include "common/cuda/tma.cuh"

namespace opforge {
namespace attention_cuda {

// Raises the kernel's shared-memory limit once; refuses a binary without its sm_90a code
// (cudaErrorNoKernelImageForDevice: the trap-only stand-in of another build uses far fewer
// registers).
template <typename Kernel>
cudaError_t prepare_hopper(Kernel kernel, int smem_bytes, signed char (&state)[64]) {
  const cudaError_t err = cuda::configure_once(kernel, smem_bytes, state, [](const cudaFuncAttributes& f) {
    return f.ptxVersion >= 90 && (f.numRegs + 7) / 8 * 8 >= 168;
  });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

// 4-D maps (head dim, sequence, heads, batch) of q, k, v (and grad_out, when mdo is given) in
// boxes of 64 columns x q_rows / kv_rows rows; false where TMA cannot address an operand.
inline bool make_attention_maps(const AttentionCudaArgs& a, int d, uint32_t q_rows, uint32_t kv_rows, CUtensorMap* mq,
                                CUtensorMap* mk, CUtensorMap* mv, CUtensorMap* mdo = nullptr) {
  const AttentionParams& p = a.g.fwd;
  const int64_t sq = p.pattern.sq, sk = p.pattern.sk;
  return cuda::make_tma_map_4d_16bit(mq, p.q, p.dtype, sq, d, p.heads, p.batch, p.q_ss, p.q_hs, p.q_bs, 64, q_rows) &&
         cuda::make_tma_map_4d_16bit(mk, p.k, p.dtype, sk, d, p.kv_heads, p.batch, p.k_ss, p.k_hs, p.k_bs, 64,
                                     kv_rows) &&
         cuda::make_tma_map_4d_16bit(mv, p.v, p.dtype, sk, d, p.kv_heads, p.batch, p.v_ss, p.v_hs, p.v_bs, 64,
                                     kv_rows) &&
         (mdo == nullptr || cuda::make_tma_map_4d_16bit(mdo, a.g.grad_out, p.dtype, sq, d, p.heads, p.batch, a.g.g_ss,
                                                        a.g.g_hs, a.g.g_bs, 64, q_rows));
}

}  // namespace attention_cuda
}  // namespace opforge
