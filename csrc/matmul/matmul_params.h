// matmul: the plain parameters that cross from the launchers to the kernels (no torch), and the
// CUDA kernels' launchers.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace opforge {

// c[b] = a[b] @ b[b] for b < batch: a (m, k), b (k, n), c (m, n). Strides in elements, any sign
// and layout for a and b (transposed views need no copy on the CPU); c is contiguous.
struct GemmParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t a_bs = 0, a_rs = 0, a_cs = 0;  // batch, row (m), column (k) strides of a
  int64_t b_bs = 0, b_rs = 0, b_cs = 0;  // batch, row (k), column (n) strides of b
  int64_t c_bs = 0, c_rs = 0;            // batch and row strides of c (columns are contiguous)
  DType dtype = DType::kFloat32;
};

// The kernels a caller can ask for by name (opforge.matmul's `variant`). kAuto picks the fastest
// that can serve the call; kWarpTiled and kMma pick the fastest kernel of their rung.
enum class MatmulVariant : int8_t {
  kAuto,
  kNaive,
  kSmemTiled,
  kRegisterBlocked,
  kWarpTiled,
  kWarpTiledStaged,
  kWarpTiledCpAsync,
  kMma,
  kMmaCpAsync,
  kMmaTma,
  kMmaWs,
  kWgmma,
};

// ---- what the kernels need of a call's layout (row-major operands: a_cs == b_cs == 1) --------

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The float32 kernels' 16-byte accesses: every 4-float group one access (row and batch strides in
// multiples of 4 floats, 16-byte aligned bases). register_blocked and warp_tiled_staged use them
// where they can; warp_tiled_cp_async needs them.
inline bool simt_vectorizable(const GemmParams& p) {
  return p.a_rs % 4 == 0 && p.b_rs % 4 == 0 && p.c_rs % 4 == 0 && p.a_bs % 4 == 0 && p.b_bs % 4 == 0 &&
         p.c_bs % 4 == 0 && aligned16(p.a) && aligned16(p.b) && aligned16(p.c);
}
// The mma kernels read a and b in 16-byte chunks: k, the row and batch strides multiples of 8
// elements, 16-byte aligned bases, and b's rows at least n rounded up to 8 long (its last chunk
// of a row may run past n: the launcher pads b unless n % 8 == 0, so that it stays inside any
// storage).
inline bool mma_chunk_readable(const GemmParams& p) {
  return p.a_cs == 1 && p.b_cs == 1 && p.k % 8 == 0 && p.b_rs >= (p.n + 7) / 8 * 8 && p.a_rs % 8 == 0 &&
         p.b_rs % 8 == 0 && (p.batch == 1 || (p.a_bs % 8 == 0 && p.b_bs % 8 == 0)) && aligned16(p.a) &&
         aligned16(p.b);
}
// ... and TMA: nonzero row and batch strides (a broadcast operand has none: TMA cannot address
// it) and int coordinates.
inline bool mma_tma_loadable(const GemmParams& p) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 512;
  return mma_chunk_readable(p) && p.a_rs > 0 && p.b_rs > 0 &&
         (p.batch == 1 || (p.a_bs != 0 && p.b_bs != 0)) && p.m < kMax && p.n < kMax && p.k < kMax;
}
// Can bulk tensor copies store c (16-byte aligned base, strides in multiples of 16 bytes)?
inline bool mma_tma_storable(const GemmParams& p) {
  return aligned16(p.c) && p.c_rs % 8 == 0 && (p.batch == 1 || p.c_bs % 8 == 0);
}

#if OPFORGE_WITH_CUDA
// The CUDA kernels (csrc/matmul/cuda/*.cu; docs/matmul.md describes each). Each computes
// c[b] = a[b] @ b[b] for b < p.batch with a (m, k) and b (k, n) read by rows (a_cs == b_cs == 1;
// wgmma also takes b by columns) on `stream`, and returns a cudaError_t as an int:
// cudaErrorInvalidValue when the call breaks the kernel's requirements (the launcher,
// matmul_cuda.cpp, arranges them), cudaErrorNoKernelImageForDevice when this binary has no code
// for the GPU (the *_available functions say so beforehand, for the current device).
int run_matmul_naive_cuda(const GemmParams& p, void* stream);                // float32, any strides
int run_matmul_smem_tiled_cuda(const GemmParams& p, void* stream);           // float32, any strides
int run_matmul_register_blocked_cuda(const GemmParams& p, void* stream);     // float32, any strides
int run_matmul_warp_tiled_staged_cuda(const GemmParams& p, void* stream);    // float32, any strides
int run_matmul_warp_tiled_cp_async_cuda(const GemmParams& p, void* stream);  // float32, vectorizable
bool matmul_warp_tiled_cp_async_available();                                 // sm_80+ code
int run_matmul_mma_cp_async_cuda(const GemmParams& p, void* stream);         // 16-bit, chunk-readable
bool matmul_mma_cp_async_available();                                        // sm_80+ code
int run_matmul_mma_tma_cuda(const GemmParams& p, void* stream);              // 16-bit, TMA-loadable
bool matmul_mma_tma_available();                                             // sm_90 code
int run_matmul_mma_ws_cuda(const GemmParams& p, void* stream);  // 16-bit, TMA-loadable and -storable
bool matmul_mma_ws_available();                                 // sm_90a code
// 16-bit, sm_90a; b by rows (b_cs == 1) or by columns (b_rs == 1: the rows of b^T, row stride
// b_cs); row and batch strides multiples of 8 and not 0, 16-byte aligned bases (TMA).
int run_matmul_wgmma_cuda(const GemmParams& p, void* stream);
bool matmul_wgmma_available();  // sm_90a code
#endif

}  // namespace opforge
