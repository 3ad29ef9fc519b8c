// attention CPU: the softmax's inner loops, one instantiation per CPU variant (common/cpu_isa.h).
#pragma once

#include <cstdint>

#include "common/cpu_isa.h"

namespace opforge {

// The float32 row loops of the online softmax (x contiguous, n elements).
struct SoftmaxRowFns {
  float (*max)(const float* x, int64_t n, float init);  // max(init, x...)
  float (*exp_sum)(float* x, int64_t n, float m);       // x = exp(x - m) (0 for -inf), returns the sum
  void (*exp)(float* x, int64_t n, float m);            // x = exp(x - m) (0 for -inf)
  // The decode path's products over a block of cols keys (k, v: cols rows of d floats each):
  // s (rows x cols) = q (rows x d) . k^T, and o (rows x d) += p (rows x cols) . v.
  // (k and v rows ld elements apart: the cache itself when it is float32 with unit column stride)
  void (*scores)(const float* q, int64_t rows, const float* k, int64_t ld, int64_t cols, int64_t d, float* s);
  void (*accumulate)(const float* p, int64_t rows, const float* v, int64_t ld, int64_t cols, int64_t d,
                     float* o);
};

namespace cpu_default {
SoftmaxRowFns softmax_row_fns();
}
#if OPFORGE_CPU_AVX2_VARIANT
namespace cpu_avx2 {
SoftmaxRowFns softmax_row_fns();
}
#endif

inline SoftmaxRowFns softmax_row_fns(CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) return cpu_avx2::softmax_row_fns();
#endif
  return cpu_default::softmax_row_fns();
}

}  // namespace opforge
