// matmul CUDA launcher: checks -> device guard -> the kernel (the variant named, or for "auto",
// "warp_tiled" and "mma" the fastest that serves the call: choose_*) -> operands in a layout the
// kernel reads (a copy only where it cannot read them) -> its launch on the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "common/checks.h"
#include "matmul/matmul.h"

namespace opforge {
namespace {

constexpr const char* kOp = "opforge.matmul";

constexpr MatmulVariant kFp32Variants[] = {MatmulVariant::kNaive,           MatmulVariant::kSmemTiled,
                                           MatmulVariant::kRegisterBlocked, MatmulVariant::kWarpTiled,
                                           MatmulVariant::kWarpTiledStaged, MatmulVariant::kWarpTiledCpAsync};
constexpr MatmulVariant kHalfVariants[] = {MatmulVariant::kMma, MatmulVariant::kMmaCpAsync,
                                           MatmulVariant::kMmaTma, MatmulVariant::kMmaWs,
                                           MatmulVariant::kWgmma};

template <size_t N>
bool one_of(MatmulVariant v, const MatmulVariant (&list)[N]) {
  for (MatmulVariant x : list)
    if (x == v) return true;
  return false;
}
template <size_t N>
std::string names(const MatmulVariant (&list)[N]) {
  std::string s = "auto";
  for (MatmulVariant x : list) s += std::string(", ") + matmul_variant_name(x);
  return s;
}

// warp_tiled: the cp.async kernel where the call's 4-float groups are 16-byte accesses and the
// binary has its sm_80+ code, else the register-staged one (any layout, any GPU).
MatmulVariant choose_warp_tiled(const GemmParams& p) {
  return simt_vectorizable(p) && matmul_warp_tiled_cp_async_available() ? MatmulVariant::kWarpTiledCpAsync
                                                                        : MatmulVariant::kWarpTiledStaged;
}

// mma: the fastest mma.sync kernel for the call. The warp-specialised persistent kernel (sm_90a
// code) where TMA can read a and b and store c; else the TMA kernel (sm_90 code) where TMA can
// read a and b (not a broadcast operand: its stride is 0); else the cp.async kernel (sm_80+).
MatmulVariant choose_mma(const GemmParams& p) {
  if (mma_tma_loadable(p) && mma_tma_storable(p) && matmul_mma_ws_available()) return MatmulVariant::kMmaWs;
  if (mma_tma_loadable(p) && matmul_mma_tma_available()) return MatmulVariant::kMmaTma;
  return MatmulVariant::kMmaCpAsync;
}

// Refuses a kernel this binary has no code for on this GPU, saying what it needs.
void check_available(MatmulVariant v) {
  const auto* props = at::cuda::getCurrentDeviceProperties();
  bool ok = true;
  const char* needs = "";
  switch (v) {
    case MatmulVariant::kWarpTiledCpAsync:
      ok = matmul_warp_tiled_cp_async_available();
      needs = "a GPU of compute capability 8.0 or newer and a build with code for it";
      break;
    case MatmulVariant::kMma:
    case MatmulVariant::kMmaCpAsync:
      ok = matmul_mma_cp_async_available();
      needs = "a GPU of compute capability 8.0 or newer and a build with code for it";
      break;
    case MatmulVariant::kMmaTma:
      ok = matmul_mma_tma_available();
      needs = "an sm_90 GPU (H100/H200) and a build for 9.0 or 9.0a";
      break;
    case MatmulVariant::kMmaWs:
      ok = matmul_mma_ws_available();
      needs = "an sm_90 GPU (H100/H200) and a build for 9.0a";
      break;
    case MatmulVariant::kWgmma:
      ok = matmul_wgmma_available();
      needs = "an sm_90 GPU (H100/H200) and a build for 9.0a";
      break;
    default:
      break;
  }
  TORCH_CHECK_VALUE(ok, kOp, ": variant '", matmul_variant_name(v), "' needs ", needs,
                    "; here: compute capability ", props->major, ".", props->minor, ". Use variant 'auto'");
}

// A 3-D view whose rows are contiguous (column stride 1), copying only when they are not.
at::Tensor row_major(const at::Tensor& t3) {
  if (t3.stride(2) == 1 || t3.size(2) <= 1) return t3;
  return t3.contiguous();
}

// t3 (batch, rows, cols) in a zero-filled (batch, rows_to, cols_to) buffer (zeros in k add
// nothing; padded columns of b are never stored).
at::Tensor zero_padded(const at::Tensor& t3, int64_t rows_to, int64_t cols_to) {
  at::Tensor p = at::zeros({t3.size(0), rows_to, cols_to}, t3.options());
  p.narrow(1, 0, t3.size(1)).narrow(2, 0, t3.size(2)).copy_(t3);
  return p;
}

// Can TMA (wgmma) read t's rows? Column stride 1, row and batch strides multiples of 8 elements
// and not 0, a 16-byte aligned base.
bool tma_rows(const at::Tensor& t3) {
  const bool batch_ok = t3.size(0) == 1 || (t3.stride(0) % 8 == 0 && t3.stride(0) > 0);
  return t3.stride(2) == 1 && t3.stride(1) % 8 == 0 && t3.stride(1) > 0 && batch_ok &&
         reinterpret_cast<uintptr_t>(t3.const_data_ptr()) % 16 == 0;
}

int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}

void check_launch(MatmulVariant v, int err) {
  TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA kernel launch failed (variant '", matmul_variant_name(v),
              "'): ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// The wgmma rung: TMA reads rows of a, and rows of b (a @ b) or rows of b^T (x @ w.t(): a view of
// b). Other layouts get a zero-padded or contiguous copy.
void run_wgmma(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const int64_t m = a.size(-2), n = b.size(-1), k = a.size(-1);
  const int64_t k8 = round_up(k, 8), n8 = round_up(n, 8);
  // The kernel counts tiles in int: keep m, n, k a tile short of 2^31.
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 256;
  TORCH_CHECK(m < kMaxDim && n8 < kMaxDim && k8 < kMaxDim, kOp, ": the wgmma variant takes dimensions below ",
              kMaxDim);
  at::Tensor a3 = row_major(as_batched(a)), b3 = as_batched(b);
  if (k % 8 != 0)
    a3 = zero_padded(a3, m, k8);
  else if (!tma_rows(a3))
    a3 = a3.clone(at::MemoryFormat::Contiguous);  // not contiguous(): a (1, 1, k) view "is"
  const at::Tensor bt = b3.transpose(1, 2);
  const bool by_columns = k % 8 == 0 && tma_rows(bt);  // b_rs == 1
  const bool by_rows = k % 8 == 0 && tma_rows(b3);     // b_cs == 1
  if (!by_columns && !by_rows) b3 = zero_padded(b3, k8, n8);
  GemmParams p = gemm_params(a3, b3, as_batched(out));
  p.n = n;
  check_launch(MatmulVariant::kWgmma, run_matmul_wgmma_cuda(p, at::cuda::getCurrentCUDAStream().stream()));
}

at::Tensor matmul_cuda(const at::Tensor& a, const at::Tensor& b, c10::string_view variant) {
  check_matmul_inputs(a, b);
  MatmulVariant v = parse_matmul_variant(variant);
  const c10::cuda::CUDAGuard guard(a.device());
  const at::ScalarType dtype = a.scalar_type();
  // A dtype this backend has no kernel for: NotImplementedError, as PyTorch's "not implemented for".
  TORCH_CHECK_NOT_IMPLEMENTED(
      dtype != at::kDouble, kOp,
      ": float64 is computed on the CPU only; on CUDA use float32, float16 or bfloat16");
  const bool fp32 = dtype == at::kFloat;
  if (v == MatmulVariant::kAuto) {
    v = fp32                       ? MatmulVariant::kWarpTiled
        : matmul_wgmma_available() ? MatmulVariant::kWgmma
                                   : MatmulVariant::kMma;
  }
  if (fp32) {
    TORCH_CHECK_VALUE(one_of(v, kFp32Variants), kOp, ": variant '", matmul_variant_name(v),
                      "' cannot serve float32; for float32 on CUDA the variants are: ", names(kFp32Variants));
  } else {
    TORCH_CHECK_VALUE(one_of(v, kHalfVariants), kOp, ": variant '", matmul_variant_name(v), "' cannot serve ",
                      dtype_str(dtype), "; for ", dtype_str(dtype),
                      " on CUDA the variants are: ", names(kHalfVariants));
  }
  check_available(v);
  const auto shape = matmul_output_shape(a, b);
  const int64_t m = a.size(-2), n = b.size(-1), k = a.size(-1), batch = a.dim() == 3 ? a.size(0) : 1;
  TORCH_CHECK(batch <= 65535 && (m + 15) / 16 <= 65535, kOp, ": at most 65535 batches and ", 65535 * 16,
              " rows on CUDA, got ", batch, " and ", m);
  if (batch == 0 || m == 0 || n == 0 || k == 0) return at::zeros(shape, a.options());
  at::Tensor out = at::empty(shape, a.options());
  if (v == MatmulVariant::kWgmma) {
    run_wgmma(a, b, out);
    return out;
  }

  at::Tensor a3 = row_major(as_batched(a)), b3 = row_major(as_batched(b)), c3 = as_batched(out);
  int64_t n_out = n;  // c's row length: n, or n padded where the kernel needs 16-byte rows of c
  if (!fp32) {
    // The mma kernels copy 16-byte chunks: other layouts get zero-padded copies (b's 8-column
    // chunks may run past n up to the next multiple of 8: only n % 8 == 0 keeps them inside any
    // storage).
    if (n % 8 != 0 || !mma_chunk_readable(gemm_params(a3, b3, c3))) {
      a3 = zero_padded(a3, m, round_up(k, 8));
      b3 = zero_padded(b3, round_up(k, 8), round_up(n, 8));
    }
    if (v == MatmulVariant::kMma) v = choose_mma(gemm_params(a3, b3, c3));
    if (v == MatmulVariant::kMmaTma || v == MatmulVariant::kMmaWs) {
      // TMA cannot address a broadcast operand (a batch or row stride of 0): materialise it.
      if ((batch > 1 && a3.stride(0) == 0) || a3.stride(1) == 0) a3 = a3.clone(at::MemoryFormat::Contiguous);
      if ((batch > 1 && b3.stride(0) == 0) || b3.stride(1) == 0) b3 = b3.clone(at::MemoryFormat::Contiguous);
      constexpr int64_t kMax = (int64_t{1} << 31) - 512;
      TORCH_CHECK(m < kMax && b3.size(2) < kMax && a3.size(2) < kMax, kOp, ": variant '",
                  matmul_variant_name(v), "' takes dimensions below ", kMax, "; use variant 'mma'");
    }
    if (v == MatmulVariant::kMmaWs && n % 8 != 0) n_out = round_up(n, 8);  // TMA stores 16-byte rows
  } else {
    if (v == MatmulVariant::kWarpTiled) v = choose_warp_tiled(gemm_params(a3, b3, c3));
    if (v == MatmulVariant::kWarpTiledCpAsync && !simt_vectorizable(gemm_params(a3, b3, c3))) {
      // 16-byte accesses: rows of a, b and c padded to multiples of 4 floats.
      a3 = zero_padded(a3, m, round_up(k, 4));
      b3 = zero_padded(b3, round_up(k, 4), round_up(n, 4));
      n_out = round_up(n, 4);
    }
  }
  const at::Tensor c_kernel = n_out == n ? c3 : at::empty({batch, m, n_out}, a.options());
  GemmParams p = gemm_params(a3, b3, c_kernel);
  p.n = n;  // columns past n (padding of b) are never stored
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  int err = cudaSuccess;
  switch (v) {
    case MatmulVariant::kNaive:
      err = run_matmul_naive_cuda(p, stream);
      break;
    case MatmulVariant::kSmemTiled:
      err = run_matmul_smem_tiled_cuda(p, stream);
      break;
    case MatmulVariant::kRegisterBlocked:
      err = run_matmul_register_blocked_cuda(p, stream);
      break;
    case MatmulVariant::kWarpTiledStaged:
      err = run_matmul_warp_tiled_staged_cuda(p, stream);
      break;
    case MatmulVariant::kWarpTiledCpAsync:
      err = run_matmul_warp_tiled_cp_async_cuda(p, stream);
      break;
    case MatmulVariant::kMmaCpAsync:
      err = run_matmul_mma_cp_async_cuda(p, stream);
      break;
    case MatmulVariant::kMmaTma:
      err = run_matmul_mma_tma_cuda(p, stream);
      break;
    case MatmulVariant::kMmaWs:
      err = run_matmul_mma_ws_cuda(p, stream);
      break;
    default:
      TORCH_CHECK(false, kOp, ": internal error, no launcher for variant ", matmul_variant_name(v));
  }
  check_launch(v, err);
  if (n_out != n) c3.copy_(c_kernel.narrow(2, 0, n));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("matmul", &matmul_cuda);
}

}  // namespace opforge
