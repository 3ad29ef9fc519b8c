// preprocess_frames: CUDA launcher. checks -> device guard -> current stream -> params -> launch ->
// launch check. Frames already on the GPU (a decoder's output, any strides) are read in place.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "preprocess_frames/preprocess_frames.h"

namespace opforge {
namespace {

at::Tensor preprocess_frames_cuda(const at::Tensor& frames, c10::IntArrayRef size, c10::IntArrayRef region,
                                  double scale, c10::ArrayRef<double> mean, c10::ArrayRef<double> std,
                                  double pad_value, c10::IntArrayRef channels, at::ScalarType out_dtype) {
  check_preprocess_frames_inputs(frames, size, region, scale, mean, std, pad_value, channels, out_dtype);
  const c10::cuda::CUDAGuard guard(frames.device());
  PreprocessPlan plan =
      plan_preprocess_frames(frames, size, region, scale, mean, std, pad_value, channels, out_dtype);
  if (plan.out.numel() == 0) return plan.out;
  plan.params.num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto err = static_cast<cudaError_t>(
      run_preprocess_frames_cuda(plan.params, at::cuda::getCurrentCUDAStream().stream()));
  TORCH_CHECK(err == cudaSuccess,
              "opforge.preprocess_frames: CUDA kernel launch failed: ", cudaGetErrorString(err));
  return plan.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("preprocess_frames", &preprocess_frames_cuda);
}

}  // namespace opforge
