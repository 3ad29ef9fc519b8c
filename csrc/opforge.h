// opforge: the public C++ API. Each function calls the PyTorch dispatcher, so C++ users get
// the same CPU/CUDA dispatch, autograd (when the Python package registered it) and checks as
// Python users of torch.ops.opforge.
#pragma once

#include <ATen/core/Tensor.h>

namespace opforge {

// out = a + b, elementwise. a and b: same shape, dtype (float32/float64/float16/bfloat16) and
// device; any strides. The output follows a's memory layout when a is dense, else contiguous.
at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b);

}  // namespace opforge
