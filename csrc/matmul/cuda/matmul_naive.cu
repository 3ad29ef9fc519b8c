// matmul rung 1, "naive": the tutorial's kernel. One thread per output element, the dot product
// of a row of a and a column of b straight from global memory: neighbouring threads (x) read
// neighbouring columns of b (coalesced) and the same element of a (a broadcast). Every input
// element is fetched k times from L2/DRAM: no reuse beyond the caches.
#include <cuda_runtime.h>

#include <cstdint>

#include "matmul/matmul_params.h"

namespace opforge {
namespace {

constexpr int kTile = 16;

__global__ void __launch_bounds__(kTile* kTile)
    matmul_naive_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                        int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t a_bs,
                        int64_t b_bs, int64_t c_bs) {
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  if (row >= m || col >= n) return;
  a += blockIdx.z * a_bs + row * lda;
  b += blockIdx.z * b_bs + col;
  float acc = 0.0f;
  for (int64_t i = 0; i < k; ++i) acc += a[i] * b[i * ldb];
  c[blockIdx.z * c_bs + row * ldc + col] = acc;
}

}  // namespace

int run_matmul_naive_cuda(const GemmParams& p, void* stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((p.n + kTile - 1) / kTile),
                  static_cast<unsigned>((p.m + kTile - 1) / kTile), static_cast<unsigned>(p.batch));
  matmul_naive_kernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(p.a), static_cast<const float*>(p.b), static_cast<float*>(p.c), p.m, p.n, p.k,
      p.a_rs, p.b_rs, p.c_rs, p.a_bs, p.b_bs, p.c_bs);
  return cudaGetLastError();
}

}  // namespace opforge
