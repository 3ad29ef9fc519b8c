// nms: autocast kernels (CPU and CUDA). Under torch.autocast a detector's boxes stay float32 while
// its scores come out in float16/bfloat16; as torchvision's NMS does, both are then cast to
// float32 (float64 stays float64) and the op runs below autocast. idxs are integers: untouched.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "opforge.h"

namespace opforge {
namespace {

template <c10::DispatchKey kKey, c10::DeviceType kDevice>
struct NmsAutocast {
  static at::Tensor f32(const at::Tensor& t) { return at::autocast::cached_cast(at::kFloat, t, kDevice); }

  static at::Tensor nms(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    return opforge::nms(f32(boxes), f32(scores), iou_threshold);
  }
  static at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                                double iou_threshold) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    return opforge::batched_nms(f32(boxes), f32(scores), idxs, iou_threshold);
  }
  static std::tuple<at::Tensor, at::Tensor> nms_padded(const at::Tensor& boxes, const at::Tensor& scores,
                                                       double iou_threshold,
                                                       const std::optional<at::Tensor>& idxs) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    return opforge::nms_padded(f32(boxes), f32(scores), iou_threshold, idxs);
  }
};

using CpuAutocast = NmsAutocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>;
using CudaAutocast = NmsAutocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>;

}  // namespace

TORCH_LIBRARY_IMPL(opforge, AutocastCPU, m) {
  m.impl("nms", &CpuAutocast::nms);
  m.impl("batched_nms", &CpuAutocast::batched_nms);
  m.impl("nms_padded", &CpuAutocast::nms_padded);
}

TORCH_LIBRARY_IMPL(opforge, AutocastCUDA, m) {
  m.impl("nms", &CudaAutocast::nms);
  m.impl("batched_nms", &CudaAutocast::batched_nms);
  m.impl("nms_padded", &CudaAutocast::nms_padded);
}

}  // namespace opforge
