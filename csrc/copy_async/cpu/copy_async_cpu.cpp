// copy_async between two CPU tensors: an ordinary (parallel) host copy; there is no stream to
// order it on, so it is complete when the call returns.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "copy_async/copy_async.h"

namespace opforge {
namespace {

void copy_async_cpu(const at::Tensor& dst, const at::Tensor& src) {
  check_copy_async_inputs(dst, src);
  if (dst.numel() == 0 || dst.is_same(src)) return;
  if (at::get_overlap_status(dst, src) == at::MemOverlapStatus::Full) return;  // the same elements
  host_copy(dst, src);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("copy_async", &copy_async_cpu);
}

}  // namespace opforge
