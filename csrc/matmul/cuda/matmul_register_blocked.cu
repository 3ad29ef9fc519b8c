// matmul rung 3, "register_blocked": a 128 x 128 tile of c per block of 256 threads, each thread
// an 8 x 8 sub-tile held in registers: per k step it loads 8 values of a and 8 of b from shared
// memory and does 64 FMAs (4x the reuse of loading 2 values per FMA as in smem_tiled, and 16x
// fewer shared loads per FMA than one output per thread). Global loads are 16-byte float4 when
// the layout allows (the launcher checks alignment); the a tile is stored transposed (k-major,
// padded by 4 floats: conflict-free stores) so that a thread's 8 rows are two float4 reads. A
// thread's 8 rows and 8 columns are two groups of 4, 64 apart, so that neighbouring threads read
// neighbouring float4s: no bank conflicts. Loops over the k tile are fully unrolled.
#include <cuda_runtime.h>

#include <cstdint>

#include "matmul/cuda/simt_common.cuh"
#include "matmul/matmul_params.h"

namespace opforge {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 8, kPad = 4, kThreads = 256;

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    matmul_register_blocked_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ c, int64_t m, int64_t n, int64_t k, int64_t lda,
                                   int64_t ldb, int64_t ldc, int64_t a_bs, int64_t b_bs, int64_t c_bs) {
  __shared__ __align__(16) float as[kBK][kBM + kPad];
  __shared__ __align__(16) float bs[kBK][kBN + kPad];
  const int tid = threadIdx.x;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  a += blockIdx.z * a_bs;
  b += blockIdx.z * b_bs;
  c += blockIdx.z * c_bs;
  const int a_row = tid / 2, a_k = (tid % 2) * 4;    // the a tile: 128 rows x 8 k, one float4 each
  const int b_k = tid / 32, b_col = (tid % 32) * 4;  // the b tile: 8 k x 128 columns
  const int tr = tid / 16, tc = tid % 16;  // this thread's rows tr*4 + {0..3, 64..67}, likewise columns
  float acc[8][8] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kBK) {
    float va[4];
    simt::unpack(simt::load4<kVec>(a, m0 + a_row, k0 + a_k, m, k, lda), va);
#pragma unroll
    for (int i = 0; i < 4; ++i) as[a_k + i][a_row] = va[i];
    *reinterpret_cast<float4*>(&bs[b_k][b_col]) = simt::load4<kVec>(b, k0 + b_k, n0 + b_col, k, n, ldb);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float rm[8], rn[8];
      simt::unpack(*reinterpret_cast<const float4*>(&as[kk][tr * 4]), rm);
      simt::unpack(*reinterpret_cast<const float4*>(&as[kk][64 + tr * 4]), rm + 4);
      simt::unpack(*reinterpret_cast<const float4*>(&bs[kk][tc * 4]), rn);
      simt::unpack(*reinterpret_cast<const float4*>(&bs[kk][64 + tc * 4]), rn + 4);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(rm[i], rn[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = m0 + (i < 4 ? tr * 4 + i : 64 + tr * 4 + i - 4);
    simt::store4<kVec>(c, row, n0 + tc * 4, m, n, ldc,
                       make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
    simt::store4<kVec>(c, row, n0 + 64 + tc * 4, m, n, ldc,
                       make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]));
  }
}

}  // namespace

int run_matmul_register_blocked_cuda(const GemmParams& p, void* stream) {
  const dim3 grid(static_cast<unsigned>((p.n + kBN - 1) / kBN), static_cast<unsigned>((p.m + kBM - 1) / kBM),
                  static_cast<unsigned>(p.batch));
  const auto s = static_cast<cudaStream_t>(stream);
  const auto* a = static_cast<const float*>(p.a);
  const auto* b = static_cast<const float*>(p.b);
  auto* c = static_cast<float*>(p.c);
  if (simt_vectorizable(p))
    matmul_register_blocked_kernel<true>
        <<<grid, kThreads, 0, s>>>(a, b, c, p.m, p.n, p.k, p.a_rs, p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  else
    matmul_register_blocked_kernel<false>
        <<<grid, kThreads, 0, s>>>(a, b, c, p.m, p.n, p.k, p.a_rs, p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  return cudaGetLastError();
}

}  // namespace opforge
