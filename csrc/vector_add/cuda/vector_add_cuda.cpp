// vector_add: CUDA launcher. checks -> device guard -> current stream -> params -> launch ->
// launch check. The device code lives in vector_add_kernel.cu, free of torch headers.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "vector_add/vector_add.h"

namespace opforge {
namespace {

at::Tensor vector_add_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_vector_add_inputs(a, b);
  const c10::cuda::CUDAGuard guard(a.device());
  VectorAddPlan plan = plan_vector_add(a, b);
  if (plan.out.numel() == 0) return plan.out;
  plan.params.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto err =
      static_cast<cudaError_t>(run_vector_add_cuda(plan.params, at::cuda::getCurrentCUDAStream().stream()));
  TORCH_CHECK(err == cudaSuccess, "opforge.vector_add: CUDA kernel launch failed: ", cudaGetErrorString(err));
  return plan.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("vector_add", &vector_add_cuda);
}

}  // namespace opforge
