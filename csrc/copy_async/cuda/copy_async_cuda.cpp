// copy_async with a CUDA tensor on either side: enqueued on the current stream of the CUDA
// device, never synchronizing the host (except where CUDA itself must: a pageable destination).
//  - device -> device, same dense layout: one cudaMemcpyAsync; other layouts: ATen's strided
//    copy kernel on the same stream. Another device's source: its current stream's work is
//    waited for first (an event), and that stream then waits for the copy.
//  - pinned host -> device, same dense layout: one cudaMemcpyAsync; the pinned block is recorded
//    on the stream, so the caching host allocator cannot hand it out again before the DMA ends.
//  - pageable host -> device: a parallel host memcpy into a pinned staging block (from the caching
//    host allocator, recorded on the stream), then the same asynchronous transfer. The call
//    returns once the host memcpy is done, not the transfer.
//  - device -> host: asynchronous into pinned memory; into pageable memory CUDA completes the copy
//    before returning.
// Every CUDA tensor touched is recorded on the stream (CUDACachingAllocator::recordStream), so
// memory allocated on another stream is not reused before the copy has run.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/checks.h"
#include "copy_async/copy_async.h"

namespace opforge {
namespace {

constexpr const char* kOp = "opforge.copy_async";

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, kOp, ": ", what, " failed: ", cudaGetErrorString(err));
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// Tell the allocators that `stream` uses t's memory.
void record_device(const at::Tensor& t, const at::cuda::CUDAStream& stream) {
  if (t.is_cuda() && t.device() == stream.device())
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
}
void record_host(const at::Tensor& t, const at::cuda::CUDAStream& stream, bool graph) {
  // (Under capture the graph's replays read the buffer: keeping it alive is the caller's part.)
  if (graph) return;
  const c10::DataPtr& ptr = t.storage().data_ptr();
  at::getHostAllocator(at::kCUDA)->record_event(ptr.get(), ptr.get_context(), stream.unwrap());
}

// The refusals under CUDA-graph capture are about the tensors' memory (pageable, not dense) or
// devices: RuntimeError, as for every tensor that does not fit (docs/adding-an-op.md, section 3).
void device_to_device(const at::Tensor& dst, const at::Tensor& src, const at::cuda::CUDAStream& stream,
                      bool graph) {
  const bool cross = src.device() != dst.device();
  TORCH_CHECK(!cross || !graph, kOp, ": a copy between two GPUs (", src.device().str(), " to ",
              dst.device().str(),
              ") cannot be captured in a CUDA graph here (it orders two devices' streams); capture a copy "
              "within one device");
  if (cross) {
    at::cuda::CUDAEvent ready;
    ready.record(at::cuda::getCurrentCUDAStream(src.device().index()));
    ready.block(stream);
  }
  if (copy_async_same_dense_layout(dst, src)) {
    check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.const_data_ptr(), dst.numel() * dst.element_size(),
                               cudaMemcpyDeviceToDevice, stream.stream()),
               "cudaMemcpyAsync (device to device)");
  } else {
    dst.copy_(src, /*non_blocking=*/true);  // ATen's strided copy kernel, on this stream
  }
  if (cross) {
    at::cuda::CUDAEvent done;
    done.record(stream);
    done.block(at::cuda::getCurrentCUDAStream(src.device().index()));
  }
  record_device(src, stream);
}

void host_to_device(const at::Tensor& dst, const at::Tensor& src, const at::cuda::CUDAStream& stream,
                    bool graph) {
  at::Tensor host = src;
  const auto pinned = src.options().pinned_memory(true);
  if (!src.is_pinned()) {
    TORCH_CHECK(!graph, kOp,
                ": src is in pageable host memory, which a CUDA graph cannot capture (the host-side "
                "staging copy would not replay); copy from pinned memory (tensor.pin_memory())");
    host = at::empty_like(dst, pinned);
    host_copy(host, src);
  } else if (!host.is_non_overlapping_and_dense()) {
    TORCH_CHECK(!graph, kOp,
                ": a non-dense pinned src cannot be captured in a CUDA graph (it is packed on "
                "the host first); pass a dense view");
    host = at::empty(src.sizes(), pinned);
    host_copy(host, src);
  }
  // The transfer goes in the host buffer's layout; a different dst layout is reordered on the GPU.
  const at::Tensor target =
      copy_async_same_dense_layout(dst, host) ? dst : at::empty_like(host, dst.options());
  check_cuda(cudaMemcpyAsync(target.data_ptr(), host.const_data_ptr(), host.numel() * host.element_size(),
                             cudaMemcpyHostToDevice, stream.stream()),
             "cudaMemcpyAsync (host to device)");
  record_host(host, stream, graph);
  if (!target.is_same(dst)) dst.copy_(target, /*non_blocking=*/true);
}

void device_to_host(const at::Tensor& dst, const at::Tensor& src, const at::cuda::CUDAStream& stream,
                    bool graph) {
  const bool pinned = dst.is_pinned();
  TORCH_CHECK(!graph || pinned, kOp,
              ": dst is in pageable host memory, which a CUDA graph cannot capture; copy into pinned memory");
  at::Tensor dev = src;
  if (!copy_async_same_dense_layout(dst, src)) {
    TORCH_CHECK(!graph || dst.is_non_overlapping_and_dense(), kOp,
                ": a non-dense dst cannot be captured in a CUDA graph; pass a dense view");
    // Reorder on the GPU into dst's layout (or a dense one), then one flat transfer.
    dev = at::empty_like(dst, src.options());
    dev.copy_(src, /*non_blocking=*/true);
  }
  if (copy_async_same_dense_layout(dst, dev)) {
    check_cuda(cudaMemcpyAsync(dst.data_ptr(), dev.const_data_ptr(), dev.numel() * dev.element_size(),
                               cudaMemcpyDeviceToHost, stream.stream()),
               "cudaMemcpyAsync (device to host)");
    if (pinned) record_host(dst, stream, graph);
  } else {
    // dst is not dense: the transfer into a dense host buffer must finish before it is spread out.
    at::Tensor host = at::empty(dev.sizes(), dev.options().device(at::kCPU).pinned_memory(true));
    check_cuda(cudaMemcpyAsync(host.data_ptr(), dev.const_data_ptr(), dev.numel() * dev.element_size(),
                               cudaMemcpyDeviceToHost, stream.stream()),
               "cudaMemcpyAsync (device to host)");
    check_cuda(cudaStreamSynchronize(stream.stream()), "cudaStreamSynchronize (non-dense host dst)");
    host_copy(dst, host);
  }
  record_device(dev, stream);
  record_device(src, stream);
}

void copy_async_cuda(const at::Tensor& dst, const at::Tensor& src) {
  check_copy_async_inputs(dst, src);
  TORCH_CHECK((dst.is_cuda() || dst.is_cpu()) && (src.is_cuda() || src.is_cpu()), kOp,
              ": dst and src must be CPU or CUDA tensors, got ", dst.device().str(), " and ",
              src.device().str());
  if (dst.numel() == 0 || dst.is_same(src)) return;
  if (dst.device() == src.device() && at::get_overlap_status(dst, src) == at::MemOverlapStatus::Full) return;
  const c10::cuda::CUDAGuard guard(dst.is_cuda() ? dst.device() : src.device());
  const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
  const bool graph = capturing(stream.stream());
  if (dst.is_cuda() && src.is_cuda()) {
    device_to_device(dst, src, stream, graph);
  } else if (dst.is_cuda()) {
    host_to_device(dst, src, stream, graph);
  } else {
    device_to_host(dst, src, stream, graph);
  }
  record_device(dst, stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("copy_async", &copy_async_cuda);
}

}  // namespace opforge
