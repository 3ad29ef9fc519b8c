// nms: CUDA device code (no torch). After the sort into scan order:
//  1. nms_mask_kernel: for each pair of 64-box blocks at or right of the diagonal (within the row
//     block's class segment), one thread per row box tests the 64 column boxes. Most pairs do not
//     intersect and cost a few min/max; intersecting ones get a fast reciprocal IoU whose result
//     is only trusted away from the threshold (else the exact IEEE division decides). The result
//     is a sparse graph: a 64-bit word of "suppresses" bits, written only when non-zero and flagged
//     in a per-row bitmap, and each box's in-degree (how many higher-ranked boxes overlap it).
//  2. nms_greedy_kernel (cooperative: the whole grid, grid-wide barriers) resolves the greedy
//     order on that graph in rounds: boxes whose suppressors are all suppressed are kept (first
//     round: boxes nothing overlaps); boxes a kept box overlaps are suppressed; each suppressed box
//     releases its out-neighbours. This is exactly the sequential greedy result, in as many rounds
//     as the longest chain of suppressions (3-6 on detector-like sets of 1k-50k boxes). One warp
//     walks one box's row, its lanes on different mask words. Then each block compacts its segment
//     of the kept flags into `keep` (score order), after the counts of the blocks before it.
// Plain nms of up to kNmsSmallSort boxes is put in scan order by ranking (nms_rank_sort.cu).
// No host synchronisation: the launcher reads the kept count once, after compaction.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "nms/nms_params.h"

namespace opforge {
namespace {

namespace cg = cooperative_groups;

constexpr int kBlock = 64;  // boxes per mask word
constexpr int kGreedyThreads = 512;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

__device__ __forceinline__ float to_acc(float x) {
  return x;
}
__device__ __forceinline__ double to_acc(double x) {
  return x;
}
__device__ __forceinline__ float to_acc(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// IEEE operations that the compiler may not fuse into FMAs: the same bits as the CPU kernel and
// as torchvision's CPU formula, inter / (area_i + area_j - inter).
__device__ __forceinline__ float mul(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul(double a, double b) {
  return __dmul_rn(a, b);
}

// The threshold test with precomputed bounds: IoU > t exactly as inter / union > t in IEEE
// arithmetic. `lo`/`hi` are t * (1 -/+ 2^-20): a quotient from the fast reciprocal (at most 2 ulp
// = 2^-22 relative error for operands in [2^-60, 2^60]) above hi or below lo decides the same as
// the correctly rounded division; between them, or outside that range, the division decides.
template <typename A>
struct Threshold {
  A t, lo, hi;
  bool nonneg;  // t >= 0: a pair that does not intersect (inter = 0, or NaN) never exceeds it
};

__device__ __forceinline__ bool exceeds_fast(float inter, float uni, const Threshold<float>& th) {
  constexpr float kMin = 0x1p-60f, kMax = 0x1p60f;
  if (inter >= kMin && inter <= kMax && uni >= kMin && uni <= kMax) {
    const float q = __fdividef(inter, uni);
    if (q > th.hi) return true;
    if (q < th.lo) return false;
  }
  return inter / uni > th.t;
}
__device__ __forceinline__ bool exceeds_fast(double inter, double uni, const Threshold<double>& th) {
  return inter / uni > th.t;
}

template <typename A>
struct alignas(4 * sizeof(A)) Box4 {
  A x1, y1, x2, y2;
};

template <typename T>
__device__ __forceinline__ Box4<typename Acc<T>::type> load_box_acc(const T* src) {
  return {to_acc(src[0]), to_acc(src[1]), to_acc(src[2]), to_acc(src[3])};
}
template <typename A>
__device__ __forceinline__ A area(const Box4<A>& b) {
  return mul(b.x2 - b.x1, b.y2 - b.y1);
}

// Does box a (area aa) suppress box b (area ba)? inter / (aa + ba - inter) > t, bit for bit as
// the CPU kernel, where inter = max(min(x2) - max(x1), 0) * max(min(y2) - max(y1), 0).
// kNonneg (t >= 0): a pair that does not intersect (inter 0 or NaN) never exceeds t, and most
// pairs stop after the x test.
template <bool kNonneg, typename A>
__device__ __forceinline__ bool suppresses(const Box4<A>& a, A aa, const Box4<A>& b, A ba,
                                           const Threshold<A>& th) {
  if (kNonneg) {
    const A w = min(a.x2, b.x2) - max(a.x1, b.x1);
    if (!(w > A(0))) return false;
    const A h = min(a.y2, b.y2) - max(a.y1, b.y1);
    if (!(h > A(0))) return false;
    const A inter = mul(w, h);
    if (!(inter > A(0))) return false;
    return exceeds_fast(inter, aa + ba - inter, th);
  }
  const A w = max(min(a.x2, b.x2) - max(a.x1, b.x1), A(0));
  const A h = max(min(a.y2, b.y2) - max(a.y1, b.y1), A(0));
  const A inter = mul(w, h);
  return exceeds_fast(inter, aa + ba - inter, th);
}

// All pairs, in scan order. Grid: x = groups of `cols_per_block` column blocks, y = row blocks.
// 64 threads: one per row box.
template <typename T, bool kClasses, bool kNonneg>
__global__ void __launch_bounds__(kBlock)
    nms_mask_kernel(const T* __restrict__ boxes, const int64_t* __restrict__ classes, int64_t n,
                    int64_t words, int64_t nz_words, int cols_per_block, Threshold<typename Acc<T>::type> th,
                    const int32_t* __restrict__ or_end, uint64_t* __restrict__ mask,
                    unsigned long long* __restrict__ row_nz, int32_t* __restrict__ in_deg) {
  using A = typename Acc<T>::type;
  const int64_t row_block = blockIdx.y;
  const int64_t col_end =
      min64(kClasses ? or_end[row_block] : words, (static_cast<int64_t>(blockIdx.x) + 1) * cols_per_block);
  int64_t col_block = std::max<int64_t>(static_cast<int64_t>(blockIdx.x) * cols_per_block, row_block);
  if (col_block >= col_end) return;

  __shared__ Box4<A> col_box[kBlock];
  __shared__ A col_area[kBlock];
  __shared__ int64_t col_class[kClasses ? kBlock : 1];
  __shared__ int col_count[kBlock];  // in-degree contributions of this tile, summed on chip
  const int t = threadIdx.x;
  const int row_size = static_cast<int>(min64(kBlock, n - row_block * kBlock));
  const int64_t i = row_block * kBlock + t;
  Box4<A> row{};
  A row_area = A(0);
  int64_t row_class = 0;
  if (t < row_size) {
    row = load_box_acc(boxes + i * 4);
    row_area = area(row);
    if (kClasses) row_class = classes[i];
  }
  for (; col_block < col_end; ++col_block) {
    const int col_size = static_cast<int>(min64(kBlock, n - col_block * kBlock));
    __syncthreads();  // the previous tile's readers are done
    col_count[t] = 0;
    if (t < col_size) {
      const int64_t j = col_block * kBlock + t;
      col_box[t] = load_box_acc(boxes + j * 4);
      col_area[t] = area(col_box[t]);
      if (kClasses) col_class[t] = classes[j];
    }
    __syncthreads();
    if (t < row_size) {
      uint64_t bits = 0;
      const int first = row_block == col_block ? t + 1 : 0;
      if (kNonneg) {
        // Stage 1, branch-free and fully unrolled (constant shifts): which columns overlap the
        // row in x and in y, necessary for IoU > t >= 0 (and false for NaN, whose IoU is NaN).
        // Stage 2: the exact test on those few only.
        uint64_t cand = 0;
#pragma unroll
        for (int j = 0; j < kBlock; ++j) {
          const Box4<A> c = col_box[j];
          const bool hit = (c.x1 < row.x2) & (row.x1 < c.x2) & (c.y1 < row.y2) & (row.y1 < c.y2);
          cand |= static_cast<uint64_t>(hit) << j;
        }
        cand &= (col_size == kBlock ? ~0ull : (1ull << col_size) - 1) &
                (first == kBlock ? 0ull : ~((1ull << first) - 1));
        for (; cand; cand &= cand - 1) {
          const int j = __ffsll(static_cast<long long>(cand)) - 1;
          if ((!kClasses || col_class[j] == row_class) &&
              suppresses<true>(row, row_area, col_box[j], col_area[j], th))
            bits |= uint64_t{1} << j;
        }
      } else {
        for (int j = first; j < col_size; ++j)
          if ((!kClasses || col_class[j] == row_class) &&
              suppresses<false>(row, row_area, col_box[j], col_area[j], th))
            bits |= uint64_t{1} << j;
      }
      if (bits) {
        mask[i * words + col_block] = bits;
        atomicOr(&row_nz[i * nz_words + col_block / 64], 1ull << (col_block % 64));
        for (uint64_t b = bits; b; b &= b - 1)
          atomicAdd(&col_count[__ffsll(static_cast<long long>(b)) - 1], 1);
      }
    }
    __syncthreads();
    if (t < col_size && col_count[t]) atomicAdd(&in_deg[col_block * kBlock + t], col_count[t]);
  }
}

// or_end[r]: one past the last word that row block r's boxes can suppress (the word holding the
// end of the class segment of the block's last box). batched_nms only.
__global__ void nms_or_end_kernel(const int64_t* __restrict__ classes, int64_t n, int64_t words,
                                  int32_t* __restrict__ or_end) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= words) return;
  const int64_t last = min(n, (r + 1) * kBlock) - 1;
  const int64_t cls = classes[last];
  // Binary search for the end of this class's segment (classes are sorted in scan order).
  int64_t lo = last + 1, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (classes[mid] == cls)
      lo = mid + 1;
    else
      hi = mid;
  }
  or_end[r] = static_cast<int32_t>((lo - 1) / kBlock + 1);
}

// Box states. Suppressed boxes record their round: kSuppressed + r.
enum : int32_t { kUndecided = 0, kKept = 1, kPending = 2, kSuppressed = 3 };

// The whole warp calls f(j) (on some lane) for every box j that box i suppresses and that is
// still open (undecided) in the `open` bitmap. Bits are only ever cleared, so a stale read can
// only let through a box that is already decided, which f checks. The row's non-zero mask words
// are spread over the lanes: their loads are issued together.
template <typename F>
__device__ __forceinline__ void warp_for_each_out_neighbour(int64_t i, const uint64_t* __restrict__ mask,
                                                            const unsigned long long* __restrict__ row_nz,
                                                            const unsigned long long* open, int64_t words,
                                                            int64_t nz_words, F f) {
  const int lane = threadIdx.x & 31;
  for (int64_t zb = (i / kBlock) / 64; zb < nz_words; zb += 32) {
    const int64_t z = zb + lane;
    const unsigned long long w = z < nz_words ? __ldg(row_nz + i * nz_words + z) : 0ull;
    const int cnt = __popcll(w);
    int incl = cnt;  // inclusive prefix sum of the lanes' counts
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(kFull, incl, d);
      if (lane >= d) incl += v;
    }
    const int total = __shfl_sync(kFull, incl, 31);
    for (int k0 = 0; k0 < total; k0 += 32) {
      const int k = k0 + lane;  // this lane's item: the k-th non-zero word of the row chunk
      int owner = 0;            // the first lane whose inclusive count exceeds k
#pragma unroll
      for (int step = 16; step; step >>= 1) {
        const int v = __shfl_sync(kFull, incl, owner + step - 1);
        if (v <= k) owner += step;
      }
      owner = min(owner, 31);
      const unsigned long long ow = __shfl_sync(kFull, w, owner);
      const int before = __shfl_sync(kFull, incl - cnt, owner);
      if (k < total) {
        unsigned long long rest = ow;
        for (int r = k - before; r > 0; --r) rest &= rest - 1;
        const int64_t c = (zb + owner) * 64 + __ffsll(static_cast<long long>(rest)) - 1;
        for (uint64_t bits = __ldg(mask + i * words + c) & __ldcg(open + c); bits; bits &= bits - 1)
          f(c * kBlock + __ffsll(static_cast<long long>(bits)) - 1);
      }
    }
  }
}

__device__ __forceinline__ void close_box(unsigned long long* open, int64_t i) {
  atomicAnd(open + i / kBlock, ~(1ull << (i % kBlock)));
}

// Every box whose state is `target` (read at the call), one warp per box: boxes are dealt to
// warps round-robin so that a run of neighbouring boxes spreads over the grid.
template <typename F>
__device__ __forceinline__ void for_each_box_in_state(const int32_t* state, int64_t n, int32_t target, F f) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  for (int64_t base = warp; base < n; base += warps * 32) {
    const int64_t i = base + warps * lane;
    unsigned match = __ballot_sync(kFull, i < n && __ldcg(state + i) == target);
    while (match) {
      const int src = __ffs(match) - 1;
      match &= match - 1;
      f(base + warps * src);
    }
  }
}

struct GreedyArgs {
  const uint64_t* mask;
  const unsigned long long* row_nz;
  int64_t n, words, nz_words;
  int32_t* remaining;  // in-degrees on entry
  int32_t* state;      // zeroed (kUndecided)
  int32_t* flags;      // zeroed
  int32_t* partial;    // [gridDim.x]: kept boxes per block segment
  unsigned long long* open;
  const int64_t* to_score_pos;  // null for plain nms
  uint8_t* kept;
  const int64_t* score_order;
  int64_t* keep;
  int64_t* num_kept;
};

// Sum of v over the block (every thread gets it). `scratch`: one int per warp.
__device__ __forceinline__ int64_t block_sum(int64_t v, int64_t* scratch) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  int64_t total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

__global__ void __launch_bounds__(kGreedyThreads, 2) nms_greedy_kernel(const GreedyArgs a) {
  // A one-block launch (small inputs) is not cooperative: its barrier is the block's.
  const auto barrier = [] {
    if (gridDim.x == 1)
      __syncthreads();
    else
      cg::this_grid().sync();
  };
  // Scalars for the lambdas below (by value: a struct taken by reference would live in memory).
  const uint64_t* const mask = a.mask;
  const unsigned long long* const row_nz = a.row_nz;
  const int64_t n = a.n, words = a.words, nz_words = a.nz_words;
  int32_t* const state = a.state;
  int32_t* const remaining = a.remaining;
  int32_t* const flags = a.flags;
  unsigned long long* const open = a.open;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t w = tid; w < words; w += stride)
    open[w] = (w == words - 1 && n % kBlock) ? (1ull << (n % kBlock)) - 1 : ~0ull;
  for (int64_t i = tid; i < n; i += stride) {
    if (remaining[i] == 0) {
      state[i] = kPending;
      flags[0] = 1;
    }
  }
  barrier();
  // Each round keeps at least one new box, so n rounds always suffice; the bound is insurance.
  for (int32_t round = 0; round <= n; ++round) {
    if (__ldcg(flags + round % 2) == 0) break;  // nothing became pending: all boxes are decided
    if (tid == 0) flags[(round + 1) % 2] = 0;   // last read a round ago; set again after the next barrier
    const int32_t suppressed = kSuppressed + round;
    int32_t* const next_flag = flags + (round + 1) % 2;
    // Pending boxes are kept and suppress every open box they overlap.
    for_each_box_in_state(state, n, kPending, [=](int64_t k) {
      if ((threadIdx.x & 31) == 0) {
        state[k] = kKept;
        close_box(open, k);
      }
      warp_for_each_out_neighbour(k, mask, row_nz, open, words, nz_words, [=](int64_t j) {
        if (atomicCAS(state + j, kUndecided, suppressed) == kUndecided) close_box(open, j);
      });
    });
    barrier();
    // Boxes suppressed this round release their out-neighbours: a box whose last suppressor
    // this was becomes pending (a box with a kept suppressor is suppressed, never undecided).
    for_each_box_in_state(state, n, suppressed, [=](int64_t s) {
      warp_for_each_out_neighbour(s, mask, row_nz, open, words, nz_words, [=](int64_t j) {
        if (__ldcg(state + j) == kUndecided && atomicSub(remaining + j, 1) == 1) {
          state[j] = kPending;
          *next_flag = 1;
        }
      });
    });
    barrier();
  }

  // Compaction into score order: block b owns score positions [begin, end); it counts its kept
  // boxes, then writes them after those of the blocks before it.
  for (int64_t i = tid; i < n; i += stride)
    a.kept[a.to_score_pos ? a.to_score_pos[i] : i] = static_cast<uint8_t>(__ldcg(state + i) == kKept);
  barrier();
  __shared__ int64_t scratch[kGreedyThreads / 32];
  const int64_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const int64_t begin = min64(n, blockIdx.x * per_block), end = min64(n, begin + per_block);
  int64_t mine = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) mine += __ldcg(a.kept + i);
  mine = block_sum(mine, scratch);
  if (threadIdx.x == 0) a.partial[blockIdx.x] = static_cast<int32_t>(mine);
  barrier();
  int64_t before = 0, total = 0;
  for (int64_t b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
    const int64_t c = __ldcg(a.partial + b);
    total += c;
    if (b < blockIdx.x) before += c;
  }
  before = block_sum(before, scratch);
  total = block_sum(total, scratch);
  __shared__ int warp_count[kGreedyThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int64_t tile = begin; tile < end; tile += blockDim.x) {  // block-uniform trip count
    const int64_t i = tile + threadIdx.x;
    const bool k = i < end && __ldcg(a.kept + i);
    const unsigned ballot = __ballot_sync(kFull, k);
    __syncthreads();  // the previous tile's counts are read
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int64_t at = before;
    for (int w = 0; w < warp; ++w) at += warp_count[w];
    if (k) a.keep[at + __popc(ballot & ((1u << lane) - 1))] = a.score_order[i];
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) before += warp_count[w];
  }
  for (int64_t q = total + tid; q < n; q += stride) a.keep[q] = -1;
  if (tid == 0) *a.num_kept = total;
}

// Largest co-resident grid of the greedy kernel on the current device (a cooperative launch
// must not exceed it), at most two blocks per SM: more blocks only make the barriers dearer.
int greedy_grid_cap() {
  static int cap[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 1;
  if (cap[dev] == 0) {
    int per_sm = 0, sms = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, nms_greedy_kernel, kGreedyThreads, 0);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cap[dev] = std::max(1, std::min(per_sm, 2) * sms);
  }
  return cap[dev];
}

template <typename T, bool kClasses, bool kNonneg>
void launch_mask(const NmsParams& p, const NmsCudaBuffers& buf, const Threshold<typename Acc<T>::type>& th,
                 cudaStream_t stream) {
  const int64_t words = nms_words(p.n), nz_words = nms_nz_words(p.n);
  // 4 column blocks per block from 16k boxes (fewer blocks to schedule). Measured: 8 per block
  // from 4k boxes made 10k boxes slower (83 -> 128 us): the tiles of a block run one after the
  // other, so the kernel is bound by each tile's latency, not by launching blocks.
  const int cols_per_block = words >= 256 ? 4 : 1;
  const dim3 grid(static_cast<unsigned>((words + cols_per_block - 1) / cols_per_block),
                  static_cast<unsigned>(words));
  nms_mask_kernel<T, kClasses, kNonneg><<<grid, kBlock, 0, stream>>>(
      static_cast<const T*>(p.boxes), p.classes, p.n, words, nz_words, cols_per_block, th, buf.or_end,
      buf.mask, reinterpret_cast<unsigned long long*>(buf.row_nz), buf.in_deg);
}

template <typename T>
cudaError_t launch(const NmsParams& p, const NmsCudaBuffers& buf, const int64_t* score_order, int64_t* keep,
                   int64_t* num_kept, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t words = nms_words(p.n), nz_words = nms_nz_words(p.n);
  Threshold<A> th;
  th.t = sizeof(A) == sizeof(double) ? static_cast<A>(p.iou_threshold) : static_cast<A>(p.iou_threshold_f32);
  th.lo = static_cast<A>(static_cast<double>(th.t) * (1.0 - 0x1p-20));
  th.hi = static_cast<A>(static_cast<double>(th.t) * (1.0 + 0x1p-20));
  th.nonneg = th.t >= A(0);
  if (p.classes) {
    nms_or_end_kernel<<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(p.classes, p.n, words,
                                                                                      buf.or_end);
    if (th.nonneg)
      launch_mask<T, true, true>(p, buf, th, stream);
    else
      launch_mask<T, true, false>(p, buf, th, stream);
  } else {
    if (th.nonneg)
      launch_mask<T, false, true>(p, buf, th, stream);
    else
      launch_mask<T, false, false>(p, buf, th, stream);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  GreedyArgs a;
  a.mask = buf.mask;
  a.row_nz = reinterpret_cast<const unsigned long long*>(buf.row_nz);
  a.n = p.n;
  a.words = words;
  a.nz_words = nz_words;
  a.remaining = buf.in_deg;
  a.state = buf.state;
  a.flags = buf.flags;
  a.partial = buf.partial;
  a.open = reinterpret_cast<unsigned long long*>(buf.open);
  a.to_score_pos = p.to_score_pos;
  a.kept = buf.kept;
  a.score_order = score_order;
  a.keep = keep;
  a.num_kept = num_kept;
  // About two boxes per warp, within the co-resident limit.
  const int64_t want = (p.n + 2 * (kGreedyThreads / 32) - 1) / (2 * (kGreedyThreads / 32));
  // Up to 256 boxes, one block: its barriers cost far less than grid-wide ones.
  const unsigned blocks = p.n <= 256
                              ? 1u
                              : static_cast<unsigned>(std::max<int64_t>(
                                    1, std::min<int64_t>({want, greedy_grid_cap(), kNmsMaxGreedyBlocks})));
  if (blocks == 1) {
    nms_greedy_kernel<<<1, kGreedyThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
  void* args[] = {&a};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(nms_greedy_kernel), dim3(blocks),
                                     dim3(kGreedyThreads), args, 0, stream);
}

}  // namespace

int run_nms_cuda(const NmsParams& p, const NmsCudaBuffers& buf, const int64_t* score_order, int64_t* keep,
                 int64_t* num_kept, void* stream) {
  if (p.n == 0) return cudaSuccess;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat32:
      return launch<float>(p, buf, score_order, keep, num_kept, s);
    case DType::kFloat64:
      return launch<double>(p, buf, score_order, keep, num_kept, s);
    case DType::kFloat16:
      return launch<__half>(p, buf, score_order, keep, num_kept, s);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(p, buf, score_order, keep, num_kept, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace opforge
