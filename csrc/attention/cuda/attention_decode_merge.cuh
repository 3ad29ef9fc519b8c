// attention CUDA decode: the merge of the chunks' partial states (attention_decode_kernel.cuh) into
// the output and the LSE, in a fixed order.
#pragma once

#include "attention/cuda/attention_decode_staging.cuh"

namespace opforge {
namespace attention_cuda {

// One block a query row: the chunks' partial states merged into the output and the LSE. Every warp
// finds the max and the weighted sum over all parts (lanes over parts, reductions in a fixed order);
// warp w sums the outputs of parts w, w + 4, ..., and the four sums are added in warp order
// (deterministic). Lane l owns output columns l * kD / 32 onwards.
constexpr int kMergeThreads = 128;

template <int kD, typename T>
__global__ void __launch_bounds__(kMergeThreads)
    attention_decode_merge_kernel(const AttentionCudaArgs a, const DecodeSplit s) {
  constexpr int kCols = kD / 32, kWarps = kMergeThreads / 32;
  __shared__ float partial[kWarps - 1][kD];
  const AttentionParams& p = a.g.fwd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;  // (b, hk, r)
  const int64_t r = row % s.rows, bh = row / s.rows, hk = bh % p.kv_heads, b = bh / p.kv_heads;
  const int64_t group = p.heads / p.kv_heads, sq = p.pattern.sq, h = hk * group + r / sq, i = r % sq;
  const int parts = s.blocks ? s.counts[b] : s.chunks;  // (the tokens-present split: this sequence's)
  const float* first = s.part + (bh * s.chunks * s.rows + r) * decode_part_stride(kD);
  const int64_t step = int64_t{s.rows} * decode_part_stride(kD);  // from one chunk's state to the next
  float mx = kNegInf;
  for (int c = lane; c < parts; c += 32) mx = fmaxf(mx, first[c * step + kD]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float acc[kCols] = {}, sum = 0.f;
  if (mx != kNegInf) {
    for (int c = lane; c < parts; c += 32) {
      const float mc = first[c * step + kD];
      if (mc != kNegInf) sum += __expf(mc - mx) * first[c * step + kD + 1];
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
#pragma unroll 4
    for (int c = warp; c < parts; c += kWarps) {
      const float* part = first + c * step;
      const float mc = part[kD];
      const float w = mc == kNegInf ? 0.f : __expf(mc - mx);
      constexpr int kVec =
          kCols < 4 ? kCols : 4;  // (16-byte loads at most: the states' rows are 16-byte aligned)
#pragma unroll
      for (int e0 = 0; e0 < kCols; e0 += kVec) {
        const auto x = *reinterpret_cast<const cuda::Pack<float, kVec>*>(part + lane * kCols + e0);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e0 + e] += w * x.v[e];
      }
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int e = 0; e < kCols; ++e) partial[warp - 1][lane * kCols + e] = acc[e];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w) {
#pragma unroll
    for (int e = 0; e < kCols; ++e) acc[e] += partial[w][lane * kCols + e];
  }
  float inv, lse;
  if (p.sinks) {  // (the states' max and sum in natural units; sink_total's in log2 units)
    sink_total(mx * cuda::kLog2eFloat, sum, static_cast<const float*>(p.sinks)[h], inv, lse);
    lse *= cuda::kLn2Float;
  } else {
    inv = sum > 0.f ? 1.f / sum : 0.f;
    lse = sum > 0.f ? mx + __logf(sum) : kNegInf;
  }
  T* out = static_cast<T*>(p.out) + b * p.o_bs + h * p.o_hs + i * p.o_ss + lane * kCols;
#pragma unroll
  for (int e = 0; e < kCols; e += 2) cuda::store_pair<T>(out + e, acc[e] * inv, acc[e + 1] * inv, true);
  if (lane == 0) static_cast<float*>(p.lse)[(b * p.heads + h) * sq + i] = lse;
}

}  // namespace attention_cuda
}  // namespace opforge
