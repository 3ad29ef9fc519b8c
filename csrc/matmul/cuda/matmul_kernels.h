// matmul CUDA: the launch functions of the rungs (one .cu file each, no torch). Every function
// computes c[b] = a[b] @ b[b] for b < p.batch with a (m, k), b (k, n) and c (m, n) row-major
// (column stride 1; p.a_cs == p.b_cs == 1), on `stream`, and returns a cudaError_t as int.
#pragma once

#include "matmul/matmul_params.h"

namespace opforge {

int matmul_naive_cuda(const GemmParams& p, void* stream);             // float32
int matmul_smem_tiled_cuda(const GemmParams& p, void* stream);        // float32
int matmul_register_blocked_cuda(const GemmParams& p, void* stream);  // float32
int matmul_warp_tiled_cuda(const GemmParams& p, void* stream);        // float32
// float16/bfloat16, sm_80+; also needs k, p.a_rs, p.b_rs and the batch strides multiples of 8
// and a, b 16-byte aligned; b readable to the next multiple of 8 columns (ldb >= that).
int matmul_mma_cuda(const GemmParams& p, void* stream);
// float16/bfloat16, sm_90a (built only when the arch list has 9.0a: OPFORGE_HAS_SM90A). p.b holds
// b TRANSPOSED, (n, k) rows; k, the row strides and batch strides multiples of 8, bases 16-byte
// aligned, batch strides not 0 (TMA descriptors).
int matmul_wgmma_cuda(const GemmParams& p, void* stream);

}  // namespace opforge
