// matmul rung 2, "smem_tiled": 32 x 32 tiles of a and b are staged in shared memory by the whole
// block (each thread loads one element of each: rows of a and rows of b are read coalesced), and
// every staged element is used 32 times from shared memory instead of being fetched 32 times.
// One thread per output; a warp reads one row of the a tile (a broadcast) and 32 consecutive
// floats of a b tile row (32 banks): no bank conflicts.
#include <cuda_runtime.h>

#include <cstdint>

#include "matmul/matmul_params.h"

namespace opforge {
namespace {

constexpr int kTile = 32;

__global__ void __launch_bounds__(kTile* kTile)
    matmul_smem_tiled_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                             int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                             int64_t a_bs, int64_t b_bs, int64_t c_bs) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  a += blockIdx.z * a_bs;
  b += blockIdx.z * b_bs;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    as[ty][tx] = (row < m && k0 + tx < k) ? a[row * lda + k0 + tx] : 0.0f;
    bs[ty][tx] = (k0 + ty < k && col < n) ? b[(k0 + ty) * ldb + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += as[ty][i] * bs[i][tx];
    __syncthreads();
  }
  if (row < m && col < n) c[blockIdx.z * c_bs + row * ldc + col] = acc;
}

}  // namespace

int run_matmul_smem_tiled_cuda(const GemmParams& p, void* stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((p.n + kTile - 1) / kTile),
                  static_cast<unsigned>((p.m + kTile - 1) / kTile), static_cast<unsigned>(p.batch));
  matmul_smem_tiled_kernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(p.a), static_cast<const float*>(p.b), static_cast<float*>(p.c), p.m, p.n, p.k,
      p.a_rs, p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  return cudaGetLastError();
}

}  // namespace opforge
