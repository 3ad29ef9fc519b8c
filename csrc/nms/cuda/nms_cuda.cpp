// nms: CUDA launchers. checks -> device guard -> sort into scan order (on the device) -> overlap
// graph and greedy resolution (nms_kernel.cu) -> compaction into score order. nms and batched_nms read the
// kept count once (the single device->host copy, since the output size depends on the data); nms_padded reads
// nothing, so it can be captured in a CUDA graph.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/checks.h"
#include "nms/nms.h"

namespace opforge {
namespace {

void check_cuda(const char* op, int err) {
  TORCH_CHECK(err == cudaSuccess, op,
              ": CUDA kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// (keep [n] padded with -1, num_kept 0-d), all on the device, no synchronisation.
std::tuple<at::Tensor, at::Tensor> padded(const char* op, const at::Tensor& boxes, const at::Tensor& scores,
                                          const std::optional<at::Tensor>& idxs, double iou_threshold) {
  check_nms_inputs(op, boxes, scores, idxs, iou_threshold);
  const c10::cuda::CUDAGuard guard(boxes.device());
  const int64_t n = boxes.size(0);
  const auto long_opts = boxes.options().dtype(at::kLong);
  if (n == 0) return {at::empty({0}, long_opts), at::zeros({}, long_opts)};
  const int64_t words = nms_words(n);
  TORCH_CHECK(words <= 65535, op, ": at most ", 65535 * 64, " boxes on CUDA, got ", n);
  at::Tensor keep = at::empty({n}, long_opts);
  at::Tensor num_kept = at::empty({}, long_opts);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();

  // One scratch allocation; its head (row_nz, in_deg, state, flags, rank) zeroed with one memset.
  const NmsCudaLayout layout = nms_cuda_layout(n);
  at::Tensor scratch = at::empty({layout.total_bytes}, boxes.options().dtype(at::kByte));
  char* base = static_cast<char*>(scratch.data_ptr());
  check_cuda(op, cudaMemsetAsync(base, 0, layout.zeroed_bytes, stream));
  const NmsCudaBuffers buf = nms_cuda_buffers(base, layout);

  NmsPlan plan;
  const int64_t* score_order = nullptr;
  if (!idxs.has_value() && n <= kNmsSmallSort && boxes.scalar_type() != at::kDouble) {
    const at::Tensor b = boxes.contiguous(), s = scores.contiguous();
    check_cuda(
        op, run_nms_rank_sort_cuda(b.const_data_ptr(), s.const_data_ptr(), n, to_dtype(boxes.scalar_type()),
                                   buf.rank, buf.score_order, buf.scan_boxes, stream));
    plan.params = nms_params(n, boxes.scalar_type(), iou_threshold);
    plan.params.boxes = buf.scan_boxes;
    score_order = buf.score_order;
  } else {
    plan = plan_nms(boxes, scores, idxs, iou_threshold);
    score_order = plan.score_order.const_data_ptr<int64_t>();
  }
  check_cuda(op, run_nms_cuda(plan.params, buf, score_order, keep.data_ptr<int64_t>(),
                              num_kept.data_ptr<int64_t>(), stream));
  return {keep, num_kept};
}

at::Tensor unpadded(const char* op, const at::Tensor& boxes, const at::Tensor& scores,
                    const std::optional<at::Tensor>& idxs, double iou_threshold) {
  auto [keep, num_kept] = padded(op, boxes, scores, idxs, iou_threshold);
  return keep.narrow(0, 0, num_kept.item<int64_t>());  // the one device->host read
}

at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  return unpadded("opforge.nms", boxes, scores, std::nullopt, iou_threshold);
}

at::Tensor batched_nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                            double iou_threshold) {
  return unpadded("opforge.batched_nms", boxes, scores, idxs, iou_threshold);
}

std::tuple<at::Tensor, at::Tensor> nms_padded_cuda(const at::Tensor& boxes, const at::Tensor& scores,
                                                   double iou_threshold,
                                                   const std::optional<at::Tensor>& idxs) {
  return padded("opforge.nms_padded", boxes, scores, idxs, iou_threshold);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("nms", &nms_cuda);
  m.impl("batched_nms", &batched_nms_cuda);
  m.impl("nms_padded", &nms_padded_cuda);
}

}  // namespace opforge
