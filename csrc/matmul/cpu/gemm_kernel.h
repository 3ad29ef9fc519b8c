// matmul CPU: the blocked GEMM, one instantiation per CPU variant (common/cpu_isa.h).
#pragma once

#include <cstdint>

#include "common/cpu_isa.h"
#include "matmul/matmul_params.h"

namespace opforge {

// Computes the block c[bi][m0:m1, n0:n1] of p (the whole k) on the calling thread. c is float
// for float16/bfloat16 inputs (the caller rounds it), else the input type. `work`: at least
// gemm_work_bytes(dtype) bytes, 64-byte aligned, private to the call.
using GemmBlockFn = void (*)(const GemmParams& p, int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                             void* work);

namespace cpu_default {
GemmBlockFn gemm_block(DType dtype);
int64_t gemm_work_bytes(DType dtype);
}
#if OPFORGE_CPU_AVX2_VARIANT
namespace cpu_avx2 {
GemmBlockFn gemm_block(DType dtype);
int64_t gemm_work_bytes(DType dtype);
}
#endif

inline GemmBlockFn gemm_block(DType dtype, CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) return cpu_avx2::gemm_block(dtype);
#endif
  return cpu_default::gemm_block(dtype);
}

inline int64_t gemm_work_bytes(DType dtype, CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) return cpu_avx2::gemm_work_bytes(dtype);
#endif
  return cpu_default::gemm_work_bytes(dtype);
}

}  // namespace opforge
