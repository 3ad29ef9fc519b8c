// opforge: the public C++ API. Each function calls the PyTorch dispatcher, so C++ users get
// the same CPU/CUDA dispatch, autograd (when the Python package registered it) and checks as
// Python users of torch.ops.opforge.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

namespace opforge {

// out = a + b, elementwise. a and b: same shape, dtype (float32/float64/float16/bfloat16) and
// device; any strides. The output is empty_like(a): a's memory layout when a is dense, else a
// dense one in a's stride order.
at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b);

// Non-maximum suppression with torchvision's contract: boxes (N, 4) as (x1, y1, x2, y2), scores (N,);
// returns the int64 indices of the kept boxes by decreasing score (equal scores: lower index
// first). A box is suppressed by a kept, higher-scoring box when their IoU > iou_threshold.
at::Tensor nms(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);

// NMS within each class idxs[i] (any integer dtype); boxes of different classes never suppress
// each other. Indices of the kept boxes by decreasing score, across classes.
at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                       double iou_threshold);

// nms (or batched_nms with idxs) without a device->host synchronisation: keep has N entries,
// the kept indices first and -1 after them; num_kept is a 0-d int64 tensor.
std::tuple<at::Tensor, at::Tensor> nms_padded(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold,
                                              const std::optional<at::Tensor>& idxs = std::nullopt);

// c = a @ b: a (m, k) and b (k, n), or batched (batch, m, k) and (batch, k, n); float32, float64,
// float16 or bfloat16 (16-bit: fp32 accumulation, rounded once); any strides. `variant` names the
// kernel ("auto": the fastest that can serve the call; on CUDA also "naive", "smem_tiled",
// "register_blocked", "warp_tiled" for float32 and "mma", "wgmma" for 16-bit types).
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view variant = "auto");

}  // namespace opforge
