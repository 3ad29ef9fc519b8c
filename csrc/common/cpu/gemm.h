// CPU: the blocked GEMM that matmul's and attention's CPU kernels share, one instantiation per CPU
// variant (common/cpu_isa.h).
#pragma once

#include <cstdint>

#include "common/cpu_isa.h"
#include "matmul/matmul_params.h"  // GemmParams

namespace opforge {

// Computes the block c[bi][m0:m1, n0:n1] of p (the whole k) on the calling thread. c is float
// for float16/bfloat16 inputs (the caller rounds it), else the input type. `work`: at least
// gemm_work_bytes(dtype) bytes, 64-byte aligned, private to the call.
using GemmBlockFn = void (*)(const GemmParams& p, int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                             void* work);

// Operands packed once and multiplied many times (attention's tiles): a (m, k) into the
// micro-kernel's row panels, b (k, n) into its column panels, in the accumulation type (float for
// 16-bit inputs); multiply then runs only micro-kernels: c (m, n) = a @ b (c += a @ b with
// accumulate), rows of ldc elements.
// Sizes are in elements of the accumulation type.
struct GemmPackedFns {
  int64_t (*a_size)(int64_t m, int64_t k);
  int64_t (*b_size)(int64_t k, int64_t n);
  void (*pack_a)(const void* a, int64_t rs, int64_t cs, int64_t m, int64_t k, void* dst);
  void (*pack_b)(const void* b, int64_t rs, int64_t cs, int64_t k, int64_t n, void* dst);
  void (*multiply)(int64_t m, int64_t n, int64_t k, const void* a_packed, const void* b_packed, void* c,
                   int64_t ldc, bool accumulate);
};

namespace cpu_default {
GemmBlockFn gemm_block(DType dtype);
int64_t gemm_work_bytes(DType dtype);
GemmPackedFns gemm_packed(DType dtype);
}  // namespace cpu_default
#if OPFORGE_CPU_AVX2_VARIANT
namespace cpu_avx2 {
GemmBlockFn gemm_block(DType dtype);
int64_t gemm_work_bytes(DType dtype);
GemmPackedFns gemm_packed(DType dtype);
}  // namespace cpu_avx2
#endif

inline GemmPackedFns gemm_packed(DType dtype, CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) return cpu_avx2::gemm_packed(dtype);
#endif
  return cpu_default::gemm_packed(dtype);
}

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
