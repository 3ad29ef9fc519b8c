// matmul CUDA launcher: checks -> device guard -> variant (dtype and GPU) -> row-major operands
// (a copy only for layouts the kernels cannot read) -> the rung's launch on the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/checks.h"
#include "matmul/cuda/matmul_kernels.h"
#include "matmul/matmul.h"

#ifndef OPFORGE_HAS_SM90A
#define OPFORGE_HAS_SM90A 0
#endif

namespace opforge {
namespace {

constexpr MatmulVariant kFp32Variants[] = {MatmulVariant::kNaive, MatmulVariant::kSmemTiled,
                                           MatmulVariant::kRegisterBlocked, MatmulVariant::kWarpTiled};

// A 3-D view whose rows are contiguous (column stride 1), copying only when they are not.
at::Tensor row_major(const at::Tensor& t3) {
  if (t3.stride(2) == 1 || t3.size(2) <= 1) return t3;
  return t3.contiguous();
}

// Can the tensor-core rungs read t's rows in 16-byte chunks? Column stride 1, row (and batch)
// strides multiples of 8 elements, 16-byte aligned base; TMA (wgmma) also needs a nonzero
// batch stride.
bool chunk_readable(const at::Tensor& t3, bool zero_batch_stride_ok) {
  const bool batch_ok = t3.size(0) == 1 || (t3.stride(0) % 8 == 0 && (zero_batch_stride_ok || t3.stride(0) > 0));
  return t3.stride(2) == 1 && t3.stride(1) % 8 == 0 && batch_ok &&
         reinterpret_cast<uintptr_t>(t3.const_data_ptr()) % 16 == 0;
}

at::Tensor matmul_cuda(const at::Tensor& a, const at::Tensor& b, c10::string_view variant) {
  constexpr const char* op = "opforge.matmul";
  check_matmul_inputs(a, b);
  MatmulVariant v = parse_matmul_variant(variant);
  const c10::cuda::CUDAGuard guard(a.device());
  const at::ScalarType dtype = a.scalar_type();
  if (dtype == at::kFloat) {
    if (v == MatmulVariant::kAuto) v = MatmulVariant::kWarpTiled;
    bool ok = false;
    for (MatmulVariant f : kFp32Variants) ok = ok || f == v;
    TORCH_CHECK_VALUE(ok, op, ": variant '", matmul_variant_name(v), "' cannot serve float32; for float32 on CUDA ",
                      "the variants are: auto, naive, smem_tiled, register_blocked, warp_tiled");
  } else {
    TORCH_CHECK_VALUE(dtype != at::kDouble, op, ": float64 is computed on the CPU only; on CUDA use float32, ",
                      "float16 or bfloat16");
    const auto* props = at::cuda::getCurrentDeviceProperties();
    const bool has_mma = props->major >= 8;
#if OPFORGE_HAS_SM90A
    const bool has_wgmma = props->major == 9 && props->minor == 0;
#else
    const bool has_wgmma = false;  // this build has no sm_90a code
#endif
    if (v == MatmulVariant::kAuto) v = has_wgmma ? MatmulVariant::kWgmma : MatmulVariant::kMma;
    TORCH_CHECK_VALUE(v == MatmulVariant::kMma || v == MatmulVariant::kWgmma, op, ": variant '",
                      matmul_variant_name(v), "' cannot serve ", dtype_str(dtype), "; for ", dtype_str(dtype),
                      " on CUDA the variants are: auto, mma, wgmma");
    TORCH_CHECK_VALUE(v != MatmulVariant::kWgmma || has_wgmma, op,
                      ": variant 'wgmma' needs an sm_90 GPU (H100/H200) and a build for 9.0a; here: compute ",
                      "capability ", props->major, ".", props->minor, ", ",
                      OPFORGE_HAS_SM90A ? "built for 9.0a" : "not built for 9.0a", ". Use variant 'mma'");
    TORCH_CHECK_VALUE(has_mma, op, ": the tensor-core variant mma needs a GPU of compute capability 8.0 or newer, ",
                      "this one is ", props->major, ".", props->minor);
  }
  const auto shape = matmul_output_shape(a, b);
  const int64_t m = a.size(-2), n = b.size(-1), k = a.size(-1), batch = a.dim() == 3 ? a.size(0) : 1;
  TORCH_CHECK(batch <= 65535 && (m + 15) / 16 <= 65535, op, ": at most 65535 batches and ", 65535 * 16,
              " rows on CUDA, got ", batch, " and ", m);
  if (batch == 0 || m == 0 || n == 0 || k == 0) return at::zeros(shape, a.options());
  at::Tensor out = at::empty(shape, a.options());
  if (v == MatmulVariant::kWgmma) {
    // TMA reads rows of a, and rows of b (a @ b) or rows of b^T (x @ w.t(): a view of b): bases
    // 16-byte aligned, row strides multiples of 8 elements and not 0. Other layouts get a
    // zero-padded copy (zeros in k add nothing; columns past n are never stored).
    const int64_t k8 = (k + 7) / 8 * 8, n8 = (n + 7) / 8 * 8;
    // The kernel counts tiles in int: keep m, n, k a tile short of 2^31.
    constexpr int64_t kMaxDim = (int64_t{1} << 31) - 256;
    TORCH_CHECK(m < kMaxDim && n8 < kMaxDim && k8 < kMaxDim, op, ": the wgmma variant takes dimensions below ",
                kMaxDim);
    at::Tensor a3 = row_major(as_batched(a)), b3 = as_batched(b);
    if (k % 8 != 0) {
      at::Tensor ap = at::zeros({batch, m, k8}, a.options());
      ap.narrow(2, 0, k).copy_(a3);
      a3 = ap;
    } else if (!chunk_readable(a3, false) || a3.stride(1) == 0) {
      a3 = a3.clone(at::MemoryFormat::Contiguous);  // not contiguous(): a (1, 1, k) view "is" with row stride 1
    }
    const at::Tensor bt = b3.transpose(1, 2);
    const bool by_columns = k % 8 == 0 && chunk_readable(bt, false) && bt.stride(1) > 0;  // b_rs == 1
    const bool by_rows = k % 8 == 0 && chunk_readable(b3, false) && b3.stride(1) > 0;     // b_cs == 1
    if (!by_columns && !by_rows) {
      at::Tensor bp = at::zeros({batch, k8, n8}, a.options());
      bp.narrow(1, 0, k).narrow(2, 0, n).copy_(b3);
      b3 = bp;
    }
    GemmParams p = gemm_params(a3, b3, as_batched(out));
    p.n = n;
    const int err = matmul_wgmma_cuda(p, at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ",
                cudaGetErrorString(static_cast<cudaError_t>(err)));
    return out;
  }
  at::Tensor a3 = row_major(as_batched(a)), b3 = row_major(as_batched(b));
  if (v == MatmulVariant::kMma) {
    // The mma rung copies 16-byte chunks; other layouts get a zero-padded copy (zeros in k add
    // nothing; padded columns of b are never stored). b's 8-column chunks may run past n up to
    // the next multiple of 8: only n % 8 == 0 keeps them inside any storage.
    if (k % 8 != 0 || n % 8 != 0 || !chunk_readable(a3, true) || !chunk_readable(b3, true)) {
      const int64_t k8 = (k + 7) / 8 * 8, n8 = (n + 7) / 8 * 8;
      at::Tensor ap = at::zeros({batch, m, k8}, a.options()), bp = at::zeros({batch, k8, n8}, a.options());
      ap.narrow(2, 0, k).copy_(a3);
      bp.narrow(1, 0, k).narrow(2, 0, n).copy_(b3);
      a3 = ap;
      b3 = bp;
    }
  }
  const at::Tensor c3 = as_batched(out);
  GemmParams p = gemm_params(a3, b3, c3);
  p.n = n;
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  int err = 0;
  switch (v) {
    case MatmulVariant::kNaive: err = matmul_naive_cuda(p, stream); break;
    case MatmulVariant::kSmemTiled: err = matmul_smem_tiled_cuda(p, stream); break;
    case MatmulVariant::kRegisterBlocked: err = matmul_register_blocked_cuda(p, stream); break;
    case MatmulVariant::kWarpTiled: err = matmul_warp_tiled_cuda(p, stream); break;
    case MatmulVariant::kMma: err = matmul_mma_cuda(p, stream); break;
    default: TORCH_CHECK(false, op, ": internal error, no launcher for variant ", matmul_variant_name(v));
  }
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) { m.impl("matmul", &matmul_cuda); }

}  // namespace opforge
