// copy_async / to_device_async: checks and the host-side helpers the CPU and CUDA kernels share.
#pragma once

#include <ATen/core/Tensor.h>

namespace opforge {

// Raise naming opforge.copy_async and the argument: both dense, same dtype and shape, dst
// writable without overlapping itself or partially overlapping src.
void check_copy_async_inputs(const at::Tensor& dst, const at::Tensor& src);

// Whether dst and src cover their memory the same way: one flat copy of nbytes from the lowest
// address of each is the elementwise copy.
bool copy_async_same_dense_layout(const at::Tensor& dst, const at::Tensor& src);

// Host memcpy of n bytes, in parallel chunks from kCopyGrainBytes on (below it, serial).
void parallel_memcpy(void* dst, const void* src, int64_t n);

// The element-wise host copy dst <- src (CPU tensors): a parallel memcpy when the layouts agree,
// else ATen's strided copy.
void host_copy(const at::Tensor& dst, const at::Tensor& src);

}  // namespace opforge
