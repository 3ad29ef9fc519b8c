// attention CUDA backward for Hopper: the dQ conversion kernel (the float32 workspace to dQ, times
// the softmax scale) and the host side: the one-pass kernel's setup and grid, run_hopper_bwd (the
// generated instantiations' entry). The one-pass kernel and the design: attention_bwd_hopper_kernel.cuh.
#pragma once

#include "attention/cuda/attention_bwd_hopper_kernel.cuh"

namespace opforge {
namespace attention_cuda {

// dQ from the workspace, times the softmax scale: one block of 128 threads per 64-row part. Thread t
// reads its kDQPartCols / 8 float4s (consecutive threads, consecutive vectors), the values go
// through shared memory as T (rows of kDQPartCols / 2 + 4 words: the threads of a warp write 32
// different banks), and each row leaves as 16-byte stores.
template <typename Tr, typename T>
__global__ void __launch_bounds__(128) attention_bwd_hopper_dq_kernel(const AttentionCudaArgs a) {
  constexpr int kCols = Tr::kDQPartCols, kRowWords = kCols / 2 + 4;
  __shared__ __align__(16) uint32_t rows[64 * kRowWords];
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  const int64_t parts = a.lse2_ld / Tr::kBlockM * 2;  // per (b, h); varlen: per h
  const int64_t bh = blockIdx.x / parts, rem = blockIdx.x % parts;
  const int c = static_cast<int>(rem % 2);
  int64_t b, h, tile = rem / 2;
  if (pat.varlen()) {  // the sequence whose padded rows hold this tile's
    const int64_t r = tile * Tr::kBlockM;
    int64_t unused;
    h = bh;
    if (!padded_tile(pat.cu_seqlens_q, pat.total_q, p.batch, 128, r / 128, b, unused)) return;
    tile = (r - padded_start(pat.cu_seqlens_q, pat.total_q, b, 128)) / Tr::kBlockM;
  } else {
    b = bh / p.heads, h = bh % p.heads;
  }
  const int64_t sq = pat.at(b).sq;
  if (tile * Tr::kBlockM >= sq) return;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane / 4, t4 = lane % 4;
  const float4* src =
      reinterpret_cast<const float4*>(a.dq_accum + dq_tile_offset<Tr>(a, b, h, tile) + c * Tr::kDQPartFloats);
  const int r0 = warp * 16 + g;
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n) {
    float4 v = src[n * 128 + t];  // (the sums of unscaled dS K: the softmax scale applied here)
    v.x *= a.scale, v.y *= a.scale, v.z *= a.scale, v.w *= a.scale;
    rows[r0 * kRowWords + 4 * n + t4] = cuda::pack2<T>(v.x, v.y);
    rows[(r0 + 8) * kRowWords + 4 * n + t4] = cuda::pack2<T>(v.z, v.w);
  }
  __syncthreads();
  const int64_t first = tile * Tr::kBlockM + (Tr::kDQSplitD ? 0 : c * 64);
  T* dq = static_cast<T*>(a.g.dq) + a.g.dq_at(b, h);
  constexpr int kChunks = kCols / 8;  // 16-byte chunks a row (a fragment's 8 columns: Tr::part_col)
#pragma unroll
  for (int k = 0; k < 64 * kChunks / 128; ++k) {
    const int chunk = t + 128 * k, row = chunk / kChunks, part = chunk % kChunks;
    if (first + row < sq) {
      *reinterpret_cast<uint4*>(dq + (first + row) * a.g.dq_ss + Tr::part_col(c, part)) =
          *reinterpret_cast<const uint4*>(&rows[row * kRowWords + part * 4]);
    }
  }
}

// ---- launch ---------------------------------------------------------------------------------

template <typename Tr, typename T>
cudaError_t launch_hopper_bwd(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  const cudaError_t err = prepare_hopper(attention_bwd_hopper_kernel<Tr, T>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  CUtensorMap mq, mk, mv, mdo;
  if (!make_attention_maps(a, Tr::kD, Tr::kDV, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv, &mdo))
    return cudaErrorInvalidValue;
  const AttentionParams& p = a.g.fwd;
  const bool varlen = p.pattern.varlen();
  const int64_t parts = (varlen ? 1 : p.batch) * p.heads * (a.lse2_ld / Tr::kBlockM) * 2;
  // Varlen: kv heads x the padded key blocks of the packed keys (padding blocks return at once).
  const int64_t pairs = varlen ? p.kv_heads : p.batch * p.kv_heads;
  const int64_t blocks = varlen ? padded_rows(p.pattern.total_k, p.batch, Tr::kBlockN) / Tr::kBlockN
                                : (p.pattern.sk + Tr::kBlockN - 1) / Tr::kBlockN;
  if (a.dq_accum == nullptr || a.lse2_ld % Tr::kBlockM != 0 || parts > 0x7fffffff ||
      pairs * blocks > 0x7fffffff ||
      (Tr::kDQAtomic && a.dq_semaphore != nullptr)) {  // (the ordered additions need the staged dQ)
    return cudaErrorInvalidValue;
  }
  // Pairs a group: what one pair's blocks read and add into (Q, dO, the dQ workspace of its GQA group
  // of heads) times the group within about half of the H100/H200's 50 MB L2.
  const int64_t pair_bytes = (p.heads / p.kv_heads) * p.pattern.sq * Tr::kD * (2 + 2 + 4);
  const int64_t fit = (int64_t{24} << 20) / std::max<int64_t>(pair_bytes, 1);
  const int group_pairs = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pairs, fit)));
  attention_bwd_hopper_kernel<Tr, T>
      <<<static_cast<unsigned>(pairs * blocks), Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, mdo, a,
                                                                                        group_pairs);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  attention_bwd_hopper_dq_kernel<Tr, T><<<static_cast<unsigned>(parts), 128, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename Tr>
int run_hopper_bwd(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16:
      return launch_hopper_bwd<Tr, __nv_bfloat16>(a, s);
    case DType::kFloat16:
      return launch_hopper_bwd<Tr, __half>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace attention_cuda
}  // namespace opforge
