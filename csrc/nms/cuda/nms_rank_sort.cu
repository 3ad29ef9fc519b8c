// nms: CUDA device code (no torch) that puts plain nms of up to kNmsSmallSort boxes in scan order
// (descending score, ties by index, as torch.sort's stable descending sort) by ranking: each box's
// rank counted against all others (nms_rank_kernel), then boxes and their indices scattered to it.
// No host synchronisation. The suppression itself: nms_kernel.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "nms/nms_params.h"

namespace opforge {
namespace {

__device__ __forceinline__ float as_float(float x) {
  return x;
}
__device__ __forceinline__ float as_float(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float as_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// A key whose ascending order is torch.sort's descending order: NaN first, then +inf ... -inf,
// -0 equal to +0 (so the index decides, as in a stable sort).
__device__ __forceinline__ uint32_t descending_key(float f) {
  if (f != f) return 0u;
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;
}

constexpr int kRankThreads = 256;

// rank[i] = how many boxes come before box i: (key, index) below box i's. Brute force, n^2
// comparisons: for n <= 16k a few microseconds of the whole GPU in one kernel, instead of a
// multi-pass radix sort and a gather. Grid: x = boxes, y = slices of the boxes compared against
// (each slice's count is added into the zeroed ranks).
template <typename T>
__global__ void __launch_bounds__(kRankThreads)
    nms_rank_kernel(const T* __restrict__ scores, int n, int per_slice, int32_t* __restrict__ rank) {
  __shared__ uint32_t key[kRankThreads];
  const int t = threadIdx.x, i = blockIdx.x * kRankThreads + t;
  const uint32_t mine = i < n ? descending_key(as_float(scores[i])) : 0u;
  const int j0 = blockIdx.y * per_slice, j1 = min(n, j0 + per_slice);
  int count = 0;
  for (int jt = j0; jt < j1; jt += kRankThreads) {  // block-uniform trip count
    __syncthreads();
    if (jt + t < j1) key[t] = descending_key(as_float(scores[jt + t]));
    __syncthreads();
    const int m = min(kRankThreads, j1 - jt);
    const int first_i = blockIdx.x * kRankThreads;
    if (jt + m <= first_i) {  // every j below every i of the block: ties count
      for (int u = 0; u < m; ++u) count += key[u] <= mine;
    } else if (jt >= first_i + kRankThreads) {  // every j above: ties do not
      for (int u = 0; u < m; ++u) count += key[u] < mine;
    } else {
      for (int u = 0; u < m; ++u) count += (key[u] < mine) | ((key[u] == mine) & (jt + u < i));
    }
  }
  if (i < n && count) atomicAdd(rank + i, count);
}

template <typename T>
__global__ void nms_rank_scatter_kernel(const T* __restrict__ boxes, int n, const int32_t* __restrict__ rank,
                                        int64_t* __restrict__ score_order, T* __restrict__ scan_boxes) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t r = rank[i];
  score_order[r] = i;
#pragma unroll
  for (int c = 0; c < 4; ++c) scan_boxes[r * 4 + c] = boxes[static_cast<int64_t>(i) * 4 + c];
}

template <typename T>
cudaError_t launch_rank_sort(const void* boxes, const void* scores, int64_t n, int32_t* rank,
                             int64_t* score_order, void* scan_boxes, cudaStream_t stream) {
  const int row_blocks = static_cast<int>((n + kRankThreads - 1) / kRankThreads);
  // About 1k blocks: the compared boxes are split into slices of whole tiles.
  const int slices = std::max(1, std::min(row_blocks, 1024 / row_blocks));
  const int per_slice = (row_blocks + slices - 1) / slices * kRankThreads;
  const unsigned used_slices = static_cast<unsigned>((n + per_slice - 1) / per_slice);
  nms_rank_kernel<T><<<dim3(row_blocks, used_slices), kRankThreads, 0, stream>>>(
      static_cast<const T*>(scores), static_cast<int>(n), per_slice, rank);
  nms_rank_scatter_kernel<T><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<const T*>(boxes), static_cast<int>(n), rank, score_order, static_cast<T*>(scan_boxes));
  return cudaGetLastError();
}

}  // namespace

int run_nms_rank_sort_cuda(const void* boxes, const void* scores, int64_t n, DType dtype, int32_t* rank,
                           int64_t* score_order, void* scan_boxes, void* stream) {
  if (n == 0) return cudaSuccess;
  if (n > kNmsSmallSort) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kFloat32:
      return launch_rank_sort<float>(boxes, scores, n, rank, score_order, scan_boxes, s);
    case DType::kFloat16:
      return launch_rank_sort<__half>(boxes, scores, n, rank, score_order, scan_boxes, s);
    case DType::kBFloat16:
      return launch_rank_sort<__nv_bfloat16>(boxes, scores, n, rank, score_order, scan_boxes, s);
    case DType::kFloat64:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace opforge
