// vector_add: the plain parameters that cross from the launcher to the kernels (no torch).
#pragma once

#include <cstdint>

#include "common/scalar_type.h"
#include "common/strided.h"

namespace opforge {

struct VectorAddParams {
  void* out = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  DType dtype = DType::kFloat32;
  Geometry<3> geom;  // operands: out, a, b
  int num_sms = 0;   // CUDA only: sizes the grid
};

#if OPFORGE_WITH_CUDA
// Defined in cuda/vector_add_kernel.cu. Launches on `stream` (a cudaStream_t) and returns the
// launch's cudaError_t as an int, so that this header needs no CUDA include.
int run_vector_add_cuda(const VectorAddParams& p, void* stream);
#endif

}  // namespace opforge
