// attention CUDA backward for Hopper (sm_90a): one pass over key blocks with five GEMMs a tile
// (FlashAttention-3's design). One block per key block (128 keys; 64 at head dim 256) of one
// (batch, kv head), three warpgroups:
//   producer warpgroup: warp 0 loads K and V once by TMA, then, for every q head of the GQA group
//     and every visible query tile, Q, dO, lse2 and delta into a ring (cuda::Pipeline); warp 1
//     adds each tile's dQ into a float32 workspace by bulk reduce-add (cp.reduce.async.bulk, done
//     at L2) as the consumers hand it over through shared memory;
//   consumers, keys layout (head dims 64, 128): warpgroup c owns keys 64c..64c+63: S^T = K Q^T and
//     dP^T = V dO^T (both operands in shared memory), P^T and dS^T (without the softmax scale:
//     dK's epilogue and the dQ conversion apply it) in registers; dV += P^T dO and dK += dS^T Q with
//     P^T / dS^T as register operands (dO and Q read MN-major); dS^T also goes to shared memory,
//     where after a barrier over both warpgroups dQ = dS K (dS read MN-major) gives the
//     warpgroup's 64 x 64 part of the tile's dQ;
//   consumers, head-dim layout (head dim 256, 64 x 64 tiles: FlashAttention-4's SM90 choice): S and
//     dP over each warpgroup's 32 keys, P and dS of both through shared memory, then each
//     warpgroup's dV, dK and dQ over its 128 head-dim columns (all operands in shared memory).
// dK and dV stay in registers until the block's last tile. Deterministic mode (a.dq_semaphore): the
// additions into each query tile's dQ come in a fixed order, from the last key block that sees the
// tile to the first, each block waiting for the later ones' additions to complete (a counter per
// (batch, head, query tile)). Later key blocks reach a query tile sooner (causal and windows walk
// query tiles from their diagonal on) and are launched first, so blocks rarely wait and never wait
// for one not yet launched. The prep kernel (delta, lse2, the workspace zeroed;
// attention_bwd_kernel.cuh) runs before, attention_bwd_hopper_dq_kernel (workspace -> dQ) after.
// Query tiles: 128 at head dim 64, 64 at 128 and 256. Without sm_90a device code the kernel traps;
// the launcher's rule asks attention_hopper_status() first.
#pragma once

#include "attention/cuda/attention_bwd_hopper_consumer.cuh"
#include "attention/cuda/attention_bwd_hopper_producer.cuh"
#include "attention/cuda/attention_bwd_hopper_traits.cuh"

namespace opforge {
namespace attention_cuda {

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_bwd_hopper_kernel(const __grid_constant__ CUtensorMap map_q,
                                const __grid_constant__ CUtensorMap map_k,
                                const __grid_constant__ CUtensorMap map_v,
                                const __grid_constant__ CUtensorMap map_do, const AttentionCudaArgs a,
                                const int group_pairs) {
#ifdef OPFORGE_ATTENTION_BWD_WGMMA_DEVICE
  constexpr int kBN = Tr::kBlockN;
  using cuda::smem_addr;
  extern __shared__ unsigned char smem_raw[];
  const BwdSmem<Tr> sm(cuda::align_shared<1024>(smem_raw));
  const AttentionParams& p = a.g.fwd;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  // The block's (batch, kv head) pair and key block: groups of group_pairs pairs (whose Q, dO and
  // dQ workspace fit in L2 together) one after the other, each walking its key blocks across its
  // pairs: the first key blocks first (with causal, the most query tiles: longest first); in
  // deterministic mode the last ones first, which reach each query tile first (see rank). Varlen:
  // the padded key blocks of the packed keys in order, the kv heads of each together.
  int64_t b, hk;
  int kblock;
  if (p.pattern.varlen()) {
    int64_t x;
    if (!padded_tile_warp(p.pattern.cu_seqlens_k, p.pattern.total_k, p.batch, kBN, blockIdx.x / p.kv_heads, b,
                          x)) {
      return;
    }
    hk = blockIdx.x % p.kv_heads, kblock = static_cast<int>(x);
  } else {
    const int blocks = static_cast<int>((p.pattern.sk + kBN - 1) / kBN);
    int pair;
    cuda::grouped_tile(static_cast<int>(blockIdx.x), group_pairs, static_cast<int>(p.batch * p.kv_heads),
                       blocks, false, pair, kblock);
    b = pair / p.kv_heads, hk = pair % p.kv_heads;
  }
  const AttentionPattern pat = p.pattern.at(b);
  const int blocks = static_cast<int>((pat.sk + kBN - 1) / kBN);
  if (a.dq_semaphore) kblock = blocks - 1 - kblock;
  const int64_t j0 = int64_t{kblock} * kBN, j1 = min(j0 + kBN, pat.sk);
  const int64_t group = p.heads / p.kv_heads;
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(sm.kv_full), 1);
    sm.pipe.init(2);  // one arrival per consumer warpgroup
    cuda::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    cuda::setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp == 0) {
      bwd_load_tiles<Tr>(sm, &map_q, &map_k, &map_v, &map_do, a, pat, b, hk, j0, j1, group, lane);
    } else if (warp == 1 && !Tr::kDQAtomic) {
      bwd_add_dq<Tr>(sm, a, pat, b, j0, j1, kblock, blocks, lane);
    }
    return;
  }

  cuda::setmaxnreg_inc<Tr::kConsumerRegs>();
  // (half through a shuffle: the compiler then knows it is warp-uniform and keeps what derives from
  // it, the descriptors, in uniform registers)
  const int half = __shfl_sync(0xffffffffu, wg, 0) - 1;
  if constexpr (Tr::kSplitHeadDim) {
    bwd_consume_head_dim<Tr, T>(sm, a, pat, b, hk, j0, half, t);
  } else {
    bwd_consume_keys<Tr, T>(sm, a, pat, b, hk, j0, half, t);
  }
#else
  __trap();
#endif
}

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
  const int col0 = Tr::kDQSplitD ? c * kCols : 0;
  T* dq = static_cast<T*>(a.g.dq) + a.g.dq_at(b, h);
  constexpr int kChunks = kCols / 8;  // 16-byte chunks a row
#pragma unroll
  for (int k = 0; k < 64 * kChunks / 128; ++k) {
    const int chunk = t + 128 * k, row = chunk / kChunks, part = chunk % kChunks;
    if (first + row < sq) {
      *reinterpret_cast<uint4*>(dq + (first + row) * a.g.dq_ss + col0 + part * 8) =
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
  if (!make_attention_maps(a, Tr::kD, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv, &mdo))
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
