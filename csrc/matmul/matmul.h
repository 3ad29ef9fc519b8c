// matmul: what the CPU and CUDA entries share: checks, variant names, and the parameters of a call.
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>

#include "matmul/matmul_params.h"

namespace opforge {

// The variant of the name, or an error naming the op and every variant.
MatmulVariant parse_matmul_variant(std::string_view name);
const char* matmul_variant_name(MatmulVariant v);

// Raises an error naming "opforge.matmul" and the argument on bad input: a and b 2-D (m, k) and
// (k, n), or 3-D (batch, m, k) and (batch, k, n); same dtype and device.
void check_matmul_inputs(const at::Tensor& a, const at::Tensor& b);

// A 3-D view (batch, rows, cols) of a 2-D or 3-D tensor (no copy).
inline at::Tensor as_batched(const at::Tensor& t) {
  return t.dim() == 2 ? t.unsqueeze(0) : t;
}

// The output's shape: (m, n) or (batch, m, n).
std::vector<int64_t> matmul_output_shape(const at::Tensor& a, const at::Tensor& b);

// Parameters for c = a @ b with a, b, c as 3-D views (c contiguous).
GemmParams gemm_params(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& c3);

}  // namespace opforge
