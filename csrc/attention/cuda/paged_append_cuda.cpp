// opforge::paged_kv_append on CUDA: the checks (paged_append.h), then one kernel
// (paged_append_kernel.cuh) that looks every token's place up on the device: nothing is read on the
// host, so a CUDA graph captures the call with the counts and the table changed in place between
// replays. Tokens that have no place are not written (the CPU raises a ValueError for them).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "attention/cuda/instantiations/attention_instantiations.h"
#include "attention/paged_append.h"

namespace opforge {
namespace {

void paged_kv_append_cuda(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& block_table, const at::Tensor& kv_lens) {
  check_paged_append(k_cache, v_cache, k, v, block_table, kv_lens);
  const c10::cuda::CUDAGuard guard(k_cache.device());
  PagedAppendParams p;
  p.k_cache = k_cache.data_ptr(), p.v_cache = v_cache.data_ptr();
  p.k = k.const_data_ptr(), p.v = v.const_data_ptr();
  p.block_table = block_table.const_data_ptr(), p.kv_lens = kv_lens.const_data_ptr();
  p.table_64 = block_table.scalar_type() == at::kLong, p.lens_64 = kv_lens.scalar_type() == at::kLong;
  p.batch = k.size(0), p.kv_heads = k.size(1), p.s_new = k.size(2), p.head_dim = k.size(3);
  p.pages = k_cache.size(0), p.page_size = k_cache.size(1), p.max_pages = block_table.size(1);
  for (int d = 0; d < 4; ++d) {
    p.c_s[d] = k_cache.stride(d), p.vc_s[d] = v_cache.stride(d), p.k_s[d] = k.stride(d),
    p.v_s[d] = v.stride(d);
  }
  p.t_s0 = block_table.stride(0), p.t_s1 = block_table.stride(1), p.l_s0 = kv_lens.stride(0);
  TORCH_CHECK(p.batch * p.s_new <= 0x7fffffff, kAppendOp, ": at most 2^31 - 1 new tokens a call, got ",
              p.batch * p.s_new);
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  const int64_t bytes = k_cache.element_size();
  const auto err = static_cast<cudaError_t>(bytes == 2   ? run_paged_kv_append<2>(p, stream)
                                            : bytes == 4 ? run_paged_kv_append<4>(p, stream)
                                                         : run_paged_kv_append<8>(p, stream));
  TORCH_CHECK(
      err != cudaErrorNoKernelImageForDevice, kAppendOp,
      ": this build has no kernel for this GPU (the CUDA kernels need compute capability 8.0 or newer "
      "and a build for it)");
  TORCH_CHECK(err == cudaSuccess, kAppendOp, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("paged_kv_append", &paged_kv_append_cuda);
}

}  // namespace opforge
