// attention CUDA backward: the prep pass every backward kernel runs first (the mma.sync passes of
// attention_bwd_kernel.cuh and the Hopper one-pass kernel): per query row, delta = rowsum(dO * O) -
// grad_lse and lse2 = lse log2(e) (+inf where the row sees nothing, so that its P is 0); the Hopper
// backward's dQ workspace zeroed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/attention_cuda.h"
#include "common/cuda/math_constants.h"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/vector.cuh"

namespace opforge {
namespace attention_cuda {

using cuda::kNegInf;

template <int kD, typename T>
__global__ void __launch_bounds__(256) attention_bwd_prep_kernel(const AttentionCudaArgs a) {
  // One 16-byte chunk a lane, a row's lanes a power of two (at 192: 32, the last 8 idle).
  constexpr int kChunks = kD / 8, kLanes = kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  constexpr int kRowsPerBlock = 256 / kLanes;
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  const int64_t ld = a.lse2_ld, rows = (pat.varlen() ? 1 : p.batch) * p.heads * ld;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kLanes;
  const int c = threadIdx.x % kLanes;
  // The row's (batch row, head, query): varlen rows by their sequence's padded start (padding rows
  // between sequences have i >= sq).
  int64_t b = 0, h = 0, i = row % ld, sq = pat.sq;
  if (pat.varlen()) {
    h = row / ld;
    int64_t tile;
    if (padded_tile(pat.cu_seqlens_q, pat.total_q, p.batch, 128, i / 128, b, tile)) {
      i = tile * 128 + i % 128;
      sq = pat.at(b).sq;
    } else {
      sq = 0;
    }
  } else {
    b = row / ld / p.heads, h = row / ld % p.heads;
  }
  if (a.offsets_invalid && blockIdx.x == 0) {  // (deterministic varlen) offsets a partition?
    for (int64_t e = threadIdx.x; e <= p.batch; e += blockDim.x) {
      for (int side = 0; side < 2; ++side) {
        const int32_t* cu = side ? pat.cu_seqlens_k : pat.cu_seqlens_q;
        const int64_t total = side ? pat.total_k : pat.total_q;
        const bool bad = (e == 0 && cu[0] != 0) || (e > 0 && cu[e] < cu[e - 1]) || cu[e] > total;
        if (bad) atomicExch(a.offsets_invalid, 1);
      }
    }
  }
  float acc = 0.f;
  // (out and dO narrower than kD (p.head_dim_v, the Hopper backward's unpadded operands): the lanes
  // past their columns add nothing)
  const int64_t cols = p.head_dim_v > 0 && p.head_dim_v < kD ? p.head_dim_v : kD;
  if (row < rows && i < sq && c < kChunks && c * 8 < cols) {
    const T* go = static_cast<const T*>(a.g.grad_out) + a.g.g_at(b, h) + i * a.g.g_ss + c * 8;
    const T* o = static_cast<const T*>(p.out) + p.o_at(b, h) + i * p.o_ss + c * 8;
    const cuda::Pack<T, 8> x = *reinterpret_cast<const cuda::Pack<T, 8>*>(go);
    const cuda::Pack<T, 8> y = *reinterpret_cast<const cuda::Pack<T, 8>*>(o);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += cuda::to_float(x.v[e]) * cuda::to_float(y.v[e]);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (a.dq_accum && row < rows && c < kChunks) {  // the Hopper backward's dQ workspace: row's kD values
    float4* z = reinterpret_cast<float4*>(a.dq_accum + row * kD + c * 8);
    z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (row < rows && c == 0) {
    // Padding rows (i >= Sq): P = 0 (lse2 +inf), delta 0.
    const int64_t src = p.lse_at(b, h) + i;
    const float lse = i < sq ? static_cast<const float*>(p.lse)[src] : kNegInf;
    a.delta[row] = i < sq ? acc - (a.g.grad_lse ? static_cast<const float*>(a.g.grad_lse)[src] : 0.f) : 0.f;
    a.lse2[row] = lse == kNegInf ? -kNegInf : lse * cuda::kLog2eFloat;
  }
}

// The prep pass for head dim kD at the call's dtype: a row a kD / 8 lanes (rounded up to a power of
// two), 256 threads a block.
template <int kD>
int run_bwd_prep(const AttentionCudaArgs& a, void* stream) {
  constexpr int kRowsPerBlock = 256 / (kD / 8 <= 8 ? 8 : kD / 8 <= 16 ? 16 : 32);
  const int64_t rows = (a.g.fwd.pattern.varlen() ? 1 : a.g.fwd.batch) * a.g.fwd.heads * a.lse2_ld;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16:
      attention_bwd_prep_kernel<kD, __nv_bfloat16><<<static_cast<unsigned>(blocks), 256, 0, s>>>(a);
      break;
    case DType::kFloat16:
      attention_bwd_prep_kernel<kD, __half><<<static_cast<unsigned>(blocks), 256, 0, s>>>(a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace attention_cuda
}  // namespace opforge
