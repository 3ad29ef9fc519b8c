// matmul: the plain parameters that cross from the launchers to the kernels (no torch).
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace opforge {

// c[b] = a[b] @ b[b] for b < batch: a (m, k), b (k, n), c (m, n). Strides in elements, any sign
// and layout for a and b (transposed views need no copy on the CPU); c is contiguous.
struct GemmParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t a_bs = 0, a_rs = 0, a_cs = 0;  // batch, row (m), column (k) strides of a
  int64_t b_bs = 0, b_rs = 0, b_cs = 0;  // batch, row (k), column (n) strides of b
  int64_t c_bs = 0, c_rs = 0;            // batch and row strides of c (columns are contiguous)
  DType dtype = DType::kFloat32;
};

// The kernels a caller can ask for by name; kAuto picks the fastest valid one.
enum class MatmulVariant : int8_t {
  kAuto,
  kNaive,
  kSmemTiled,
  kRegisterBlocked,
  kWarpTiled,
  kMma,
  kWgmma,
};

}  // namespace opforge
