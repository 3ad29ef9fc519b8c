// nms: C++ entries (through the dispatcher), input checks, and the sort into scan order.
#include "nms/nms.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sort.h>

#include <cmath>
#include <limits>

#include "common/checks.h"
#include "opforge.h"

namespace opforge {

void check_nms_inputs(const char* op, const at::Tensor& boxes, const at::Tensor& scores,
                      const std::optional<at::Tensor>& idxs, double iou_threshold) {
  check_defined(op, "boxes", boxes);
  check_defined(op, "scores", scores);
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4, op,
              ": boxes must be a 2-D tensor of shape (N, 4), got ", boxes.sizes());
  TORCH_CHECK(scores.dim() == 1 && scores.size(0) == boxes.size(0), op,
              ": scores must be a 1-D tensor with one score per box (N=", boxes.size(0), "), got ",
              scores.sizes());
  check_dtype_in(op, "boxes", boxes, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16});
  check_same_dtype(op, "scores", scores, "boxes", boxes);
  check_same_device(op, "scores", scores, "boxes", boxes);
  if (idxs.has_value()) {
    check_defined(op, "idxs", *idxs);
    TORCH_CHECK(idxs->dim() == 1 && idxs->size(0) == boxes.size(0), op,
                ": idxs must be a 1-D tensor with one class per box (N=", boxes.size(0), "), got ",
                idxs->sizes());
    TORCH_CHECK(at::isIntegralType(idxs->scalar_type(), /*includeBool=*/false), op,
                ": idxs must have an integer dtype, got ", dtype_str(idxs->scalar_type()));
    check_same_device(op, "idxs", *idxs, "boxes", boxes);
  }
  // A value out of range: ValueError. (torchvision.ops.nms takes a NaN threshold without a word and
  // keeps every box, since no IoU is > NaN; opforge refuses it, as it refused it before.)
  TORCH_CHECK_VALUE(!std::isnan(iou_threshold), op, ": iou_threshold must be a number, got nan");
}

NmsParams nms_params(int64_t n, at::ScalarType dtype, double iou_threshold) {
  NmsParams p;
  p.n = n;
  p.dtype = to_dtype(dtype);
  p.iou_threshold = iou_threshold;
  // IoU > t in float32 decides exactly as (double)IoU > iou_threshold when t is the largest float
  // not above iou_threshold (torchvision's CPU kernel compares in double).
  float t = static_cast<float>(iou_threshold);
  if (static_cast<double>(t) > iou_threshold) t = std::nextafter(t, -std::numeric_limits<float>::infinity());
  p.iou_threshold_f32 = t;
  return p;
}

NmsPlan plan_nms(const at::Tensor& boxes, const at::Tensor& scores, const std::optional<at::Tensor>& idxs,
                 double iou_threshold) {
  NmsPlan plan;
  // Stable: equal scores keep the lower index first. NaN scores sort first, as in torch.sort.
  plan.score_order = std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/0, /*descending=*/true));
  at::Tensor scan_order = plan.score_order;
  if (idxs.has_value()) {
    const at::Tensor cls = idxs->to(at::kLong).index_select(0, plan.score_order);
    plan.to_score_pos = std::get<1>(at::sort(cls, /*stable=*/true, /*dim=*/0, /*descending=*/false));
    scan_order = plan.score_order.index_select(0, plan.to_score_pos);
    plan.scan_classes = cls.index_select(0, plan.to_score_pos).contiguous();
  }
  plan.scan_boxes = boxes.index_select(0, scan_order).contiguous();

  plan.params = nms_params(boxes.size(0), boxes.scalar_type(), iou_threshold);
  NmsParams& p = plan.params;
  p.boxes = plan.scan_boxes.const_data_ptr();
  p.classes = idxs.has_value() ? plan.scan_classes.const_data_ptr<int64_t>() : nullptr;
  p.to_score_pos = idxs.has_value() ? plan.to_score_pos.const_data_ptr<int64_t>() : nullptr;
  return plan;
}

at::Tensor nms(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::nms", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(boxes, scores, iou_threshold);
}

at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                       double iou_threshold) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::batched_nms", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>();
  return op.call(boxes, scores, idxs, iou_threshold);
}

std::tuple<at::Tensor, at::Tensor> nms_padded(const at::Tensor& boxes, const at::Tensor& scores,
                                              double iou_threshold, const std::optional<at::Tensor>& idxs) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::nms_padded", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double,
                                                                 const std::optional<at::Tensor>&)>();
  return op.call(boxes, scores, iou_threshold, idxs);
}

}  // namespace opforge
