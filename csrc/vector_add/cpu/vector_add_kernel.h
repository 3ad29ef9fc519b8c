// vector_add CPU: the contiguous inner loop, one instantiation per CPU variant (common/cpu_isa.h).
#pragma once

#include <cstdint>

#include "common/cpu_isa.h"
#include "common/scalar_type.h"

namespace opforge {

// out[i] = a[i] + b[i] for i < n; all contiguous, of the dtype the function was chosen for.
using AddContiguousFn = void (*)(void* out, const void* a, const void* b, int64_t n);

namespace cpu_default {
AddContiguousFn vector_add_contiguous(DType dtype);
}
#if OPFORGE_CPU_AVX2_VARIANT
namespace cpu_avx2 {
AddContiguousFn vector_add_contiguous(DType dtype);
}
#endif

inline AddContiguousFn vector_add_contiguous(DType dtype, CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) return cpu_avx2::vector_add_contiguous(dtype);
#endif
  return cpu_default::vector_add_contiguous(dtype);
}

}  // namespace opforge
