// nms: what the CPU and CUDA entries share: checks and the sort into scan order.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include "nms/nms_params.h"

namespace opforge {

// Raises an error naming `op` ("opforge.nms", ...) and the argument on bad input.
void check_nms_inputs(const char* op, const at::Tensor& boxes, const at::Tensor& scores,
                      const std::optional<at::Tensor>& idxs, double iou_threshold);

// Boxes sorted into scan order (nms_params.h) on their own device, and the kernel parameters.
struct NmsPlan {
  at::Tensor score_order;   // [n] int64: box indices by decreasing score, ties by lower index
  at::Tensor scan_boxes;    // [n, 4] contiguous, in scan order
  at::Tensor scan_classes;  // [n] int64 in scan order (batched only)
  at::Tensor to_score_pos;  // [n] int64 scan position -> score position (batched only)
  NmsParams params;
};
// Kernel parameters for n boxes of `dtype` (pointers left null).
NmsParams nms_params(int64_t n, at::ScalarType dtype, double iou_threshold);
NmsPlan plan_nms(const at::Tensor& boxes, const at::Tensor& scores, const std::optional<at::Tensor>& idxs,
                 double iou_threshold);

}  // namespace opforge
