// vector_add: what the CPU and CUDA entries share (checks, output allocation, geometry).
#pragma once

#include <ATen/core/Tensor.h>

#include "vector_add/vector_add_params.h"

namespace opforge {

// Raises an error naming opforge.vector_add and the argument on bad input.
void check_vector_add_inputs(const at::Tensor& a, const at::Tensor& b);

// The output and the tensors the kernel reads (the inputs, or copies of them in the output's
// layout in the rare case that keeps more than kMaxDims dims), with the kernel's parameters.
struct VectorAddPlan {
  at::Tensor out, a, b;
  VectorAddParams params;
};

// Allocates the output (empty_like(a): a's layout when a is dense, else dense in a's stride
// order) and fills the params.
// Call after check_vector_add_inputs, under the device guard.
VectorAddPlan plan_vector_add(const at::Tensor& a, const at::Tensor& b);

}  // namespace opforge
