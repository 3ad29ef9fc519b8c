// copy_async / to_device_async: C++ entries (through the dispatcher), checks, and
// to_device_async itself (CompositeImplicitAutograd: an allocation and a copy_async, which
// torch.compile sees as such).
#include "copy_async/copy_async.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/function.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "common/checks.h"
#include "common/host_pool.h"
#include "opforge.h"

namespace opforge {

namespace {
constexpr const char* kOp = "opforge.copy_async";
// Bytes per thread at least: a 1080p frame (6 MB) spreads over 16 threads (one thread copies
// ~6 GB/s); below it one thread copies alone.
constexpr int64_t kCopyGrainBytes = int64_t{256} << 10;
}  // namespace

void check_copy_async_inputs(const at::Tensor& dst, const at::Tensor& src) {
  check_defined(kOp, "dst", dst);
  check_defined(kOp, "src", src);
  check_same_dtype(kOp, "src", src, "dst", dst);
  check_same_shape(kOp, "src", src, "dst", dst);
  // Memory overlap: RuntimeError, as Tensor.copy_ raises (at::assert_no_internal_overlap and
  // at::assert_no_partial_overlap), with this op's words.
  TORCH_CHECK(at::has_internal_overlap(dst) != at::MemOverlap::Yes, kOp,
              ": dst has elements that share memory (an expanded or overlapping view); it cannot be "
              "written element by element");
  if (dst.device() == src.device()) {
    TORCH_CHECK(at::get_overlap_status(dst, src) != at::MemOverlapStatus::Partial, kOp,
                ": dst and src partially overlap in memory");
  }
}

bool copy_async_same_dense_layout(const at::Tensor& dst, const at::Tensor& src) {
  return dst.is_non_overlapping_and_dense() && src.is_non_overlapping_and_dense() &&
         dst.strides() == src.strides();
}

void parallel_memcpy(void* dst, const void* src, int64_t n) {
  if (n <= 0) return;
  // On opforge's host pool, not at::parallel_for: these copies come from a FrameStream's staging
  // thread as often as from the main thread, and from a second thread OpenMP wakes its workers
  // from sleep for every region (host_pool.h).
  const int parts = static_cast<int>(std::clamp<int64_t>(n / kCopyGrainBytes, 1, at::get_num_threads()));
  const int64_t chunk = ((n + parts - 1) / parts + 63) & ~int64_t{63};
  host_parallel(parts, parts, [&](int i) {
    const int64_t begin = std::min(n, i * chunk), end = std::min(n, begin + chunk);
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
  });
}

void host_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (copy_async_same_dense_layout(dst, src)) {
    parallel_memcpy(dst.data_ptr(), src.const_data_ptr(), dst.numel() * dst.element_size());
  } else {
    dst.copy_(src);
  }
}

namespace {

// dst on `device`: src's layout when src is dense (one flat copy then serves), pinned host memory
// when a CUDA tensor comes back to the CPU (so that copy stays asynchronous too).
at::Tensor to_device_async_impl(const at::Tensor& src, at::Device device) {
  check_defined("opforge.to_device_async", "src", src);
  auto options = src.options().device(device);
  if (device.is_cpu() && src.is_cuda()) options = options.pinned_memory(true);
  at::Tensor dst = at::empty_like(src, options, c10::MemoryFormat::Preserve);
  copy_async(dst, src);
  return dst;
}

}  // namespace

at::Tensor& copy_async(at::Tensor& dst, const at::Tensor& src) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::copy_async", "")
                       .typed<void(const at::Tensor&, const at::Tensor&)>();
  op.call(dst, src);
  return dst;
}

at::Tensor to_device_async(const at::Tensor& src, at::Device device) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::to_device_async", "")
                       .typed<at::Tensor(const at::Tensor&, at::Device)>();
  return op.call(src, device);
}

TORCH_LIBRARY_IMPL(opforge, CompositeImplicitAutograd, m) {
  m.impl("to_device_async", &to_device_async_impl);
}

namespace {

// The copy's gradient, as Tensor.copy_'s, with an in-place op's edges (dst's old values first, as
// CopySlices expects when dst is a view): zeros for dst's values before the copy, dst's incoming
// gradient for src (on src's device).
struct CopyAsyncBackward final : torch::autograd::Node {
  explicit CopyAsyncBackward(at::TensorOptions src) : src_options(src) {}
  at::TensorOptions src_options;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor& g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor()};
    return {at::zeros_like(g), should_compute_output(1) ? g.to(src_options) : at::Tensor()};
  }
  std::string name() const override { return "CopyAsyncBackward"; }
};

// torch 2.14 holds autograd nodes in c10::intrusive_ptr, earlier releases in std::shared_ptr.
using NodePtr = decltype(torch::autograd::Edge::function);
template <typename T, typename... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// Under autograd copy_async writes dst as Tensor.copy_ does: a leaf that requires grad is refused
// (outside torch.no_grad), dst's version counter moves on (a backward that saved dst's old values
// then raises instead of using the new ones), and dst's history becomes the copy's (the gradient
// flows to src; dst's old values get none).
void copy_async_autograd(const at::Tensor& dst, const at::Tensor& src) {
  NodePtr grad_fn;
  if (at::GradMode::is_enabled() && (dst.requires_grad() || src.requires_grad())) {
    torch::autograd::check_inplace(dst, true);
    grad_fn = make_node<CopyAsyncBackward>(src.options());
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(dst, src));
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor target = dst;
    copy_async(target, src);
  }
  torch::autograd::increment_version(dst);
  if (grad_fn) torch::autograd::rebase_history(dst, std::move(grad_fn));
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("copy_async", &copy_async_autograd);
}

}  // namespace opforge
