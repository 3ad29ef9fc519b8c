// nms: CUDA launchers. checks -> device guard -> sort into scan order (on the device) -> overlap
// graph and greedy resolution (nms_kernel.cu) -> compaction into score order. nms and batched_nms read the kept
// count once (the single device->host copy, since the output size depends on the data);
// nms_padded reads nothing, so it can be captured in a CUDA graph.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "nms/nms.h"

namespace opforge {
namespace {

void check_cuda(const char* op, int err) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// (keep [n] padded with -1, num_kept 0-d), all on the device, no synchronisation.
std::tuple<at::Tensor, at::Tensor> padded(const char* op, const at::Tensor& boxes, const at::Tensor& scores,
                                          const std::optional<at::Tensor>& idxs, double iou_threshold) {
  check_nms_inputs(op, boxes, scores, idxs, iou_threshold);
  const c10::cuda::CUDAGuard guard(boxes.device());
  const int64_t n = boxes.size(0);
  const auto long_opts = boxes.options().dtype(at::kLong);
  at::Tensor keep = at::full({n}, -1, long_opts);
  at::Tensor num_kept = at::zeros({}, long_opts);
  if (n == 0) return {keep, num_kept};
  const int64_t words = nms_words(n);
  TORCH_CHECK(words <= 65535, op, ": at most ", 65535 * 64, " boxes on CUDA, got ", n);
  const NmsPlan plan = plan_nms(boxes, scores, idxs, iou_threshold);
  const auto int_opts = boxes.options().dtype(at::kInt);
  at::Tensor mask = at::empty({n, words}, long_opts);  // sparse: only non-zero words are written
  at::Tensor row_nz = at::zeros({n, nms_nz_words(n)}, long_opts);
  at::Tensor in_deg = at::zeros({n}, int_opts);
  at::Tensor or_end = at::empty({words}, int_opts);
  at::Tensor work = at::empty({5, n}, int_opts);
  at::Tensor open = at::empty({words}, long_opts);
  at::Tensor kept = at::empty({n}, boxes.options().dtype(at::kByte));
  const NmsCudaBuffers buf{reinterpret_cast<uint64_t*>(mask.data_ptr<int64_t>()),
                           reinterpret_cast<uint64_t*>(row_nz.data_ptr<int64_t>()),
                           in_deg.data_ptr<int32_t>(),
                           or_end.data_ptr<int32_t>(),
                           work.data_ptr<int32_t>(),
                           reinterpret_cast<uint64_t*>(open.data_ptr<int64_t>()),
                           kept.data_ptr<uint8_t>()};
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  check_cuda(op, run_nms_cuda(plan.params, buf, stream));
  const at::Tensor prefix = at::cumsum(kept, 0, at::kInt);
  check_cuda(op, run_nms_compact_cuda(kept.const_data_ptr<uint8_t>(), prefix.const_data_ptr<int32_t>(),
                                      plan.score_order.const_data_ptr<int64_t>(), n, keep.data_ptr<int64_t>(),
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
                                                   const std::optional<at::Tensor>& idxs, double iou_threshold) {
  return padded("opforge.nms_padded", boxes, scores, idxs, iou_threshold);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("nms", &nms_cuda);
  m.impl("batched_nms", &batched_nms_cuda);
  m.impl("nms_padded", &nms_padded_cuda);
}

}  // namespace opforge
