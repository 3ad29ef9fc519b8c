// nms: CUDA device code (no torch). After the sort into scan order:
//  1. nms_mask_kernel: for each pair of 64-box blocks at or right of the diagonal (within the row
//     block's class segment), one thread per row box computes its IoU with the 64 column boxes.
//     The result is a sparse graph: a 64-bit word of "suppresses" bits, written only when
//     non-zero and flagged in a per-row bitmap, and each box's in-degree (how many higher-ranked
//     boxes overlap it above the threshold).
//  2. nms_greedy_kernel: one block resolves the greedy order on that graph in rounds: boxes whose
//     suppressors are all suppressed are kept (first round: boxes nothing overlaps); boxes a kept
//     box overlaps are suppressed; each suppressed box releases its out-neighbours. This gives
//     exactly the sequential greedy result, in as many rounds as the longest chain of
//     suppressions, instead of one serial step per 64 boxes.
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
                    int64_t nz_words, typename Acc<T>::type threshold, const int32_t* __restrict__ or_end,
                    uint64_t* __restrict__ mask, unsigned long long* __restrict__ row_nz, int32_t* __restrict__ in_deg) {
  using A = typename Acc<T>::type;
  const int64_t row_block = blockIdx.y, col_block = blockIdx.x;
  if (col_block < row_block || col_block >= or_end[row_block]) return;
  const int row_size = static_cast<int>(min64(kBlock, n - row_block * kBlock));
  const int col_size = static_cast<int>(min64(kBlock, n - col_block * kBlock));

  __shared__ A col_boxes[kBlock][4];
  __shared__ int64_t col_class[kBlock];
  __shared__ int col_count[kBlock];  // in-degree contributions of this tile, summed on chip
  const int t = threadIdx.x;
  col_count[t] = 0;
  if (t < col_size) {
    const int64_t j = col_block * kBlock + t;
#pragma unroll
    for (int k = 0; k < 4; ++k) col_boxes[t][k] = to_acc(boxes[j * 4 + k]);
    col_class[t] = classes ? classes[j] : 0;
  }
  __syncthreads();
  if (t < row_size) {
    const int64_t i = row_block * kBlock + t;
    A row[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) row[k] = to_acc(boxes[i * 4 + k]);
    const int64_t row_class = classes ? classes[i] : 0;
    uint64_t bits = 0;
    for (int j = (row_block == col_block ? t + 1 : 0); j < col_size; ++j)
      if (col_class[j] == row_class && iou(row, col_boxes[j]) > threshold) bits |= uint64_t{1} << j;
    if (bits) {
      mask[i * words + col_block] = bits;
      atomicOr(&row_nz[i * nz_words + col_block / 64], 1ull << (col_block % 64));
      for (uint64_t b = bits; b; b &= b - 1) atomicAdd(&col_count[__ffsll(static_cast<long long>(b)) - 1], 1);
    }
  }
  __syncthreads();
  if (t < col_size && col_count[t]) atomicAdd(&in_deg[col_block * kBlock + t], col_count[t]);
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

enum : int32_t { kUndecided = 0, kKept = 1, kSuppressed = 2 };

// Calls f(j) for every box j that box i suppresses and that may still be undecided: the set bits
// of i's non-zero mask words, filtered by the `open` bitmap of undecided boxes (bits are only
// ever cleared, so a stale read can only let through a box that is already decided, which f
// checks). On dense graphs (large clusters, a negative threshold) this skips decided boxes a
// word at a time.
template <typename F>
__device__ __forceinline__ void for_each_out_neighbour(int64_t i, const uint64_t* __restrict__ mask,
                                                       const unsigned long long* __restrict__ row_nz,
                                                       const unsigned long long* open, int64_t words,
                                                       int64_t nz_words, F f) {
  for (int64_t z = (i / kBlock) / 64; z < nz_words; ++z) {
    for (unsigned long long nz = row_nz[i * nz_words + z]; nz; nz &= nz - 1) {
      const int64_t c = z * 64 + __ffsll(static_cast<long long>(nz)) - 1;
      for (uint64_t bits = mask[i * words + c] & __ldcg(open + c); bits; bits &= bits - 1)
        f(c * kBlock + __ffsll(static_cast<long long>(bits)) - 1);
    }
  }
}

__device__ __forceinline__ void close_box(unsigned long long* open, int64_t i) {
  atomicAnd(open + i / kBlock, ~(1ull << (i % kBlock)));
}

__global__ void __launch_bounds__(kScanThreads)
    nms_greedy_kernel(const uint64_t* __restrict__ mask, const unsigned long long* __restrict__ row_nz, int64_t n,
                      int64_t words, int64_t nz_words, const int32_t* __restrict__ in_deg, int32_t* __restrict__ work,
                      unsigned long long* open, const int64_t* __restrict__ to_score_pos, uint8_t* __restrict__ kept) {
  int32_t* remaining = work;      // suppressors of each box not yet suppressed
  int32_t* state = work + n;      // kUndecided, kKept or kSuppressed
  int32_t* frontier = work + 2 * n;    // boxes kept in this round
  int32_t* suppressed = work + 3 * n;  // boxes suppressed in this round
  int32_t* next = work + 4 * n;        // boxes kept in the next round
  __shared__ int num_frontier, num_suppressed, num_next;
  const int t = threadIdx.x;
  if (t == 0) num_frontier = num_suppressed = num_next = 0;
  __syncthreads();
  for (int64_t w = t; w < words; w += kScanThreads)
    open[w] = (w == words - 1 && n % kBlock) ? (1ull << (n % kBlock)) - 1 : ~0ull;
  for (int64_t i = t; i < n; i += kScanThreads) {
    remaining[i] = in_deg[i];
    state[i] = kUndecided;
    if (in_deg[i] == 0) frontier[atomicAdd(&num_frontier, 1)] = static_cast<int32_t>(i);
  }
  __syncthreads();
  // Each round keeps at least one new box, so n rounds always suffice; the bound is insurance.
  for (int64_t round = 0; round <= n && num_frontier > 0; ++round) {
    // Kept boxes suppress every box they overlap (once: the first to claim it lists it).
    const int nf = num_frontier;
    for (int q = t; q < nf; q += kScanThreads) {
      const int64_t k = frontier[q];
      state[k] = kKept;
      close_box(open, k);
      for_each_out_neighbour(k, mask, row_nz, open, words, nz_words, [&](int64_t j) {
        if (atomicCAS(&state[j], kUndecided, kSuppressed) == kUndecided) {
          close_box(open, j);
          suppressed[atomicAdd(&num_suppressed, 1)] = static_cast<int32_t>(j);
        }
      });
    }
    __syncthreads();
    // Suppressed boxes release their out-neighbours; a box whose last suppressor this was is
    // kept next round (a box with a kept suppressor never reaches zero). Boxes already
    // suppressed need no count: no state changes to kSuppressed in this phase.
    const int ns = num_suppressed;
    for (int q = t; q < ns; q += kScanThreads) {
      for_each_out_neighbour(suppressed[q], mask, row_nz, open, words, nz_words, [&](int64_t j) {
        if (state[j] == kUndecided && atomicSub(&remaining[j], 1) == 1)
          next[atomicAdd(&num_next, 1)] = static_cast<int32_t>(j);
      });
    }
    __syncthreads();
    int32_t* swap = frontier;
    frontier = next;
    next = swap;
    if (t == 0) {
      num_frontier = num_next;
      num_next = 0;
      num_suppressed = 0;
    }
    __syncthreads();
  }
  for (int64_t i = t; i < n; i += kScanThreads)
    kept[to_score_pos ? to_score_pos[i] : i] = static_cast<uint8_t>(state[i] == kKept);
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
  const int64_t words = nms_words(p.n), nz_words = nms_nz_words(p.n);
  nms_or_end_kernel<<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(p.classes, p.n, words, buf.or_end);
  const A threshold = sizeof(A) == sizeof(double) ? static_cast<A>(p.iou_threshold) : static_cast<A>(p.iou_threshold_f32);
  const dim3 grid(static_cast<unsigned>(words), static_cast<unsigned>(words));
  nms_mask_kernel<T><<<grid, kBlock, 0, stream>>>(static_cast<const T*>(p.boxes), p.classes, p.n, words, nz_words,
                                                   threshold, buf.or_end, buf.mask,
                                                   reinterpret_cast<unsigned long long*>(buf.row_nz), buf.in_deg);
  nms_greedy_kernel<<<1, kScanThreads, 0, stream>>>(buf.mask, reinterpret_cast<const unsigned long long*>(buf.row_nz),
                                                    p.n, words, nz_words, buf.in_deg, buf.work,
                                                    reinterpret_cast<unsigned long long*>(buf.open), p.to_score_pos,
                                                    buf.kept);
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
