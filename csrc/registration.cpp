// Every opforge schema, in one place. Kernels register themselves in their backend files
// (TORCH_LIBRARY_IMPL(opforge, CPU|CUDA, m)); Python adds fake kernels and autograd.
#include <torch/library.h>

TORCH_LIBRARY(opforge, m) {
  m.def("vector_add(Tensor a, Tensor b) -> Tensor");
  m.def("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
  m.def("batched_nms(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor");
  m.def("nms_padded(Tensor boxes, Tensor scores, float iou_threshold, Tensor? idxs=None) -> (Tensor, Tensor)");
  m.def("matmul(Tensor a, Tensor b, *, str variant=\"auto\") -> Tensor");
  // Which CPU variant of the kernels runs here ("avx2" or "default"), for tests and benchmark
  // reports (common/cpu_isa.cpp).
  m.def("_cpu_isa() -> str");
}
