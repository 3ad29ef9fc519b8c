// nms: CUDA device code (no torch). Two kernels do the work after the sort:
//  1. nms_mask_kernel: for each pair of 64-box blocks at or right of the diagonal, one thread
//     per row box computes its IoU with the 64 column boxes and writes a 64-bit word of
//     "suppresses" bits (only boxes of the same class for batched_nms; cross-class blocks are
//     skipped entirely).
//  2. nms_scan_kernel: one block walks the row blocks in score order, keeping the "removed"
//     bits in shared memory: one thread resolves the 64 boxes of a block from the diagonal
//     words, then all threads OR the kept boxes' rows into the removed bits to their right.
// No host synchronisation: the launcher reads the kept count once, after compaction.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "nms/nms_params.h"

namespace opforge {
namespace {

constexpr int kBlock = 64;           // boxes per mask word
constexpr int kScanThreads = 1024;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

// IEEE operations that the compiler may not fuse into FMAs: the same bits as the CPU kernel and
// as torchvision's CPU formula, inter / (area_i + area_j - inter).
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }

template <typename A>
__device__ __forceinline__ A iou(const A* a, const A* b) {
  const A w = max(min(a[2], b[2]) - max(a[0], b[0]), A(0));
  const A h = max(min(a[3], b[3]) - max(a[1], b[1]), A(0));
  const A inter = mul(w, h);
  const A area_a = mul(a[2] - a[0], a[3] - a[1]);
  const A area_b = mul(b[2] - b[0], b[3] - b[1]);
  return inter / (area_a + area_b - inter);
}

template <typename T>
__global__ void __launch_bounds__(kBlock)
    nms_mask_kernel(const T* __restrict__ boxes, const int64_t* __restrict__ classes, int64_t n, int64_t words,
                    typename Acc<T>::type threshold, const int32_t* __restrict__ or_end, uint64_t* __restrict__ mask) {
  using A = typename Acc<T>::type;
  const int64_t row_block = blockIdx.y, col_block = blockIdx.x;
  if (col_block < row_block || col_block >= or_end[row_block]) return;
  const int row_size = static_cast<int>(min64(kBlock, n - row_block * kBlock));
  const int col_size = static_cast<int>(min64(kBlock, n - col_block * kBlock));

  __shared__ A col_boxes[kBlock][4];
  __shared__ int64_t col_class[kBlock];
  const int t = threadIdx.x;
  if (t < col_size) {
    const int64_t j = col_block * kBlock + t;
#pragma unroll
    for (int k = 0; k < 4; ++k) col_boxes[t][k] = to_acc(boxes[j * 4 + k]);
    col_class[t] = classes ? classes[j] : 0;
  }
  __syncthreads();
  if (t >= row_size) return;
  const int64_t i = row_block * kBlock + t;
  A row[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) row[k] = to_acc(boxes[i * 4 + k]);
  const int64_t row_class = classes ? classes[i] : 0;
  uint64_t bits = 0;
  for (int j = (row_block == col_block ? t + 1 : 0); j < col_size; ++j)
    if (col_class[j] == row_class && iou(row, col_boxes[j]) > threshold) bits |= uint64_t{1} << j;
  mask[i * words + col_block] = bits;
}

// or_end[r]: one past the last word that row block r's boxes can suppress (the word holding the
// end of the class segment of the block's last box); `words` for plain nms.
__global__ void nms_or_end_kernel(const int64_t* __restrict__ classes, int64_t n, int64_t words,
                                  int32_t* __restrict__ or_end) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= words) return;
  if (!classes) {
    or_end[r] = static_cast<int32_t>(words);
    return;
  }
  const int64_t last = min(n, (r + 1) * kBlock) - 1;
  const int64_t cls = classes[last];
  // Binary search for the end of this class's segment (classes are sorted in scan order).
  int64_t lo = last + 1, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (classes[mid] == cls) lo = mid + 1; else hi = mid;
  }
  or_end[r] = static_cast<int32_t>((lo - 1) / kBlock + 1);
}

__global__ void __launch_bounds__(kScanThreads)
    nms_scan_kernel(const uint64_t* __restrict__ mask, int64_t n, int64_t words, const int32_t* __restrict__ or_end,
                    const int64_t* __restrict__ to_score_pos, uint8_t* __restrict__ kept) {
  extern __shared__ uint64_t removed[];  // [words]
  __shared__ uint64_t diag[2][kBlock];   // the diagonal words of this row block and the next
  __shared__ int kept_rows[kBlock];
  __shared__ int num_kept;
  __shared__ uint64_t kept_bits;
  const int t = threadIdx.x;
  for (int64_t w = t; w < words; w += kScanThreads) removed[w] = 0;
  if (t < kBlock && t < n) diag[0][t] = mask[static_cast<int64_t>(t) * words];
  __syncthreads();

  for (int64_t r = 0; r < words; ++r) {
    const int64_t row0 = r * kBlock;
    const int rows = static_cast<int>(min64(kBlock, n - row0));
    if (t == 0) {
      // Greedy over this block's boxes in score order, visiting only boxes not yet removed:
      // the next candidate is the lowest live bit above the last kept one.
      const uint64_t valid = rows == kBlock ? ~uint64_t{0} : (uint64_t{1} << rows) - 1;
      uint64_t gone = removed[r] | ~valid, keep = 0;
      uint64_t candidates = ~gone;
      int k = 0;
      while (candidates) {
        const int b = __ffsll(static_cast<long long>(candidates)) - 1;
        keep |= uint64_t{1} << b;
        kept_rows[k++] = b;
        gone |= diag[r & 1][b];  // only bits above b: the diagonal block is upper triangular
        candidates = ~gone & ~((uint64_t{2} << b) - 1);
      }
      num_kept = k;
      kept_bits = keep;
    }
    __syncthreads();
    const int k = num_kept;
    if (t < rows) {
      const int64_t s = row0 + t;
      kept[to_score_pos ? to_score_pos[s] : s] = static_cast<uint8_t>((kept_bits >> t) & 1);
    }
    // Prefetch the next block's diagonal words while the others OR.
    if (r + 1 < words) {
      const int next_rows = static_cast<int>(min64(kBlock, n - row0 - kBlock));
      if (t < next_rows) diag[(r + 1) & 1][t] = mask[(row0 + kBlock + t) * words + r + 1];
    }
    // removed[w] |= mask[kept row][w] for every word right of the diagonal in this segment.
    const int64_t first = r + 1, nw = or_end[r] - first;
    if (k > 0 && nw > 0) {
      const int64_t pairs = k * nw;
      for (int64_t q = t; q < pairs; q += kScanThreads) {
        const int64_t i = q / nw, w = first + (q - i * nw);
        const uint64_t v = mask[(row0 + kept_rows[i]) * words + w];
        if (v) atomicOr(reinterpret_cast<unsigned long long*>(&removed[w]), static_cast<unsigned long long>(v));
      }
    }
    __syncthreads();
  }
}

__global__ void nms_compact_kernel(const uint8_t* __restrict__ kept, const int32_t* __restrict__ prefix,
                                   const int64_t* __restrict__ score_order, int64_t n, int64_t* __restrict__ keep,
                                   int64_t* __restrict__ num_kept) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (kept[i]) keep[prefix[i] - 1] = score_order[i];
  if (i == n - 1) *num_kept = prefix[i];
}

template <typename T>
cudaError_t launch(const NmsParams& p, const NmsCudaBuffers& buf, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t words = nms_words(p.n);
  nms_or_end_kernel<<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(p.classes, p.n, words, buf.or_end);
  const A threshold = sizeof(A) == sizeof(double) ? static_cast<A>(p.iou_threshold) : static_cast<A>(p.iou_threshold_f32);
  const dim3 grid(static_cast<unsigned>(words), static_cast<unsigned>(words));
  nms_mask_kernel<T><<<grid, kBlock, 0, stream>>>(static_cast<const T*>(p.boxes), p.classes, p.n, words, threshold,
                                                   buf.or_end, buf.mask);
  const size_t smem = static_cast<size_t>(words) * sizeof(uint64_t);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(nms_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  nms_scan_kernel<<<1, kScanThreads, smem, stream>>>(buf.mask, p.n, words, buf.or_end, p.to_score_pos, buf.kept);
  return cudaGetLastError();
}

}  // namespace

int run_nms_cuda(const NmsParams& p, const NmsCudaBuffers& buf, void* stream) {
  if (p.n == 0) return cudaSuccess;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat32: return launch<float>(p, buf, s);
    case DType::kFloat64: return launch<double>(p, buf, s);
    case DType::kFloat16: return launch<__half>(p, buf, s);
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, buf, s);
  }
  return cudaErrorInvalidValue;
}

int run_nms_compact_cuda(const uint8_t* kept, const int32_t* prefix, const int64_t* score_order, int64_t n,
                         int64_t* keep, int64_t* num_kept, void* stream) {
  if (n == 0) return cudaSuccess;
  nms_compact_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      kept, prefix, score_order, n, keep, num_kept);
  return cudaGetLastError();
}

}  // namespace opforge
