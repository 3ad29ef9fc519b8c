// attention CUDA backward, mma.sync (sm_80+), deterministic (no atomics), in three passes:
//   prep: per query row, delta = rowsum(dO * O) - grad_lse and lse2 = lse log2(e) (+inf where the
//         row sees nothing, so that its P is 0);
//   kv:   one block per kBlockN keys of one (batch, kv head); it walks the visible query tiles of
//         every q head of its GQA group, recomputing S^T = K Q^T and P^T, and accumulates
//         dV += P^T dO and dK += dS^T Q in registers (the group's sum without a pass over memory);
//   q:    one block per kBlockM queries of one (batch, head); it walks the visible key tiles and
//         accumulates dQ += dS K.
// dS = P (dP - delta) scale (times 1 - tanh^2 under a softcap), dP = dO V^T. Both walks skip
// empty tiles and mask only partial ones, as the forward does. (Accumulating dQ with atomics in the
// kv pass would save the q pass's recomputation of S and dP, about 2/7 of the FLOPs, at the cost of
// run-to-run bit differences.)
#pragma once

#include "attention/cuda/attention_bwd_prep.cuh"
#include "attention/cuda/attention_mask.cuh"
#include "attention/cuda/attention_softmax.cuh"
#include "attention/cuda/attention_tile.cuh"
#include "attention/cuda/attention_walk.cuh"

namespace opforge {
namespace attention_cuda {

// ---- kv: dK, dV -----------------------------------------------------------------------------

// kBlockN keys a block, 16 a warp; kDSplit warps share a key group, each accumulating kD / kDSplit
// columns of dK and dV (and recomputing the group's S^T and dP^T).
template <int kD_, int kBlockN_, int kBlockM_, int kDSplit_>
struct BwdKVTraits {
  static constexpr int kD = kD_, kBlockN = kBlockN_, kBlockM = kBlockM_, kDSplit = kDSplit_;
  static constexpr int kKeyWarps = kBlockN / 16, kWarps = kKeyWarps * kDSplit, kThreads = kWarps * 32;
  static constexpr int kDPart = kD / kDSplit;
  static constexpr int kKVBytes = kBlockN * kD * 2, kQBytes = kBlockM * kD * 2;
  // K, V; two stages of Q, dO, lse2 and delta.
  static constexpr int kStageBytes = 2 * kQBytes + 2 * kBlockM * 4;
  static constexpr int kSmemBytes = 2 * kKVBytes + 2 * kStageBytes;
};

using BwdKVTraitsD64 = BwdKVTraits<64, 128, 64, 1>;

using BwdKVTraitsD128 = BwdKVTraits<128, 128, 32, 1>;

using BwdKVTraitsD256 = BwdKVTraits<256, 64, 32, 2>;

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1) attention_bwd_kv_kernel(const AttentionCudaArgs a) {
  constexpr int kD = Tr::kD, kBN = Tr::kBlockN, kBM = Tr::kBlockM, kThreads = Tr::kThreads;
  constexpr int kMT = kBM / 8, kPT = Tr::kDPart / 8, kKK = kD / 16;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sK = cuda::smem_addr(smem), sV = sK + Tr::kKVBytes, sStage0 = sV + Tr::kKVBytes;
  const AttentionParams& p = a.g.fwd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int key_warp = warp % Tr::kKeyWarps, dpart = warp / Tr::kKeyWarps;
  const int64_t hk = blockIdx.y;
  int64_t b, kblock;
  if (!block_tile(p, true, kBN, blockIdx.x, blockIdx.z, b, kblock)) return;
  const AttentionPattern pat = p.pattern.at(b);
  const int64_t j0 = kblock * kBN, j1 = min(j0 + kBN, pat.sk);
  const int64_t group = p.heads / p.kv_heads;
  const T* kg = static_cast<const T*>(p.k) + p.k_at(b, hk);
  const T* vg = static_cast<const T*>(p.v) + p.v_at(b, hk);
  load_rows<kBN, kD, kThreads>(sK, kg, p.k_ss, j0, pat.sk, tid);
  load_rows<kBN, kD, kThreads>(sV, vg, p.v_ss, j0, pat.sk, tid);
  cuda::cp_async_commit();

  QueryWalk<kBM> walk(pat, b, j0, j1, j1 - j0 < kBN);

  float dk[kPT][4], dv[kPT][4];
#pragma unroll
  for (int n = 0; n < kPT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  }

  for (int64_t gi = 0; gi < group; ++gi) {
    const int64_t h = hk * group + gi;
    const T* qg = static_cast<const T*>(p.q) + p.q_at(b, h);
    const T* gog = static_cast<const T*>(a.g.grad_out) + a.g.g_at(b, h);
    const float* lse2g = a.lse2 + a.ws_row(b, h);
    const float* deltag = a.delta + a.ws_row(b, h);
    auto load_q = [&](int t, int stage) {
      const uint32_t s = sStage0 + stage * Tr::kStageBytes;
      const int64_t i0 = int64_t{t} * kBM;
      load_rows<kBM, kD, kThreads>(s, qg, p.q_ss, i0, pat.sq, tid);
      load_rows<kBM, kD, kThreads>(s + Tr::kQBytes, gog, a.g.g_ss, i0, pat.sq, tid);
      float* f = reinterpret_cast<float*>(smem + (s - sK) + 2 * Tr::kQBytes);
      load_floats<kBM, kThreads>(f, lse2g, i0, pat.sq, tid);
      load_floats<kBM, kThreads>(f + kBM, deltag, i0, pat.sq, tid);
      cuda::cp_async_commit();
    };

    TileClass tc;
    int tile = walk.next(h, walk.begin, tc, lane);
    __syncthreads();  // every warp is done with the stages (the previous head's last tile)
    if (tile < walk.end) load_q(tile, 0);
    int stage = 0;
    while (tile < walk.end) {
      TileClass tn_class;
      const int tn = walk.next(h, tile + 1, tn_class, lane);
      cuda::cp_async_wait<0>();
      __syncthreads();
      if (tn < walk.end) load_q(tn, stage ^ 1);
      const uint32_t sQ = sStage0 + stage * Tr::kStageBytes, sdO = sQ + Tr::kQBytes;
      const float* lse2s = reinterpret_cast<const float*>(smem + (sQ - sK) + 2 * Tr::kQBytes);
      const float* deltas = lse2s + kBM;
      const int64_t i0 = int64_t{tile} * kBM;

      // S^T = K Q^T (this warp's 16 keys x kBM queries), and dP^T = V dO^T.
      float s[kMT][4], dp[kMT][4];
#pragma unroll
      for (int n = 0; n < kMT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < kKK; ++kk) {
        uint32_t ak[4], av[4];
        frag_a<kD>(ak, sK, key_warp * 16, kk, lane);
        frag_a<kD>(av, sV, key_warp * 16, kk, lane);
#pragma unroll
        for (int np = 0; np < kBM / 16; ++np) {
          uint32_t bq[4], bo[4];
          frag_b<kD>(bq, sQ, np * 16, kk, lane);
          frag_b<kD>(bo, sdO, np * 16, kk, lane);
          mma_m16n8k16<T>(s[2 * np], ak, bq);
          mma_m16n8k16<T>(s[2 * np + 1], ak, bq + 2);
          mma_m16n8k16<T>(dp[2 * np], av, bo);
          mma_m16n8k16<T>(dp[2 * np + 1], av, bo + 2);
        }
      }
      scores_log2(s, a);
      if (tc.kind == BlockKind::kPartial)
        mask_tile<true, kBM>(s, pat, tc, b, h, j0 + key_warp * 16, i0, lane);
      // P^T (columns are queries: their lse2 and delta), then dS^T in dp.
      score_grads_by_column(s, dp, lse2s, deltas, a, t4);
      // dV += P^T dO, dK += dS^T Q over this warp's columns of D.
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t ap[4], ads[4];
        acc_to_a<T>(ap, s, kk);
        acc_to_a<T>(ads, dp, kk);
#pragma unroll
        for (int np = 0; np < Tr::kDPart / 16; ++np) {
          uint32_t bo[4], bq[4];
          const int col = dpart * (Tr::kDPart / 16) + np;
          frag_b_trans<kD>(bo, sdO, kk * 16, col, lane);
          frag_b_trans<kD>(bq, sQ, kk * 16, col, lane);
          mma_m16n8k16<T>(dv[2 * np], ap, bo);
          mma_m16n8k16<T>(dv[2 * np + 1], ap, bo + 2);
          mma_m16n8k16<T>(dk[2 * np], ads, bq);
          mma_m16n8k16<T>(dk[2 * np + 1], ads, bq + 2);
        }
      }
      tile = tn;
      tc = tn_class;
      stage ^= 1;
    }
  }
  cuda::cp_async_wait<0>();  // (K, V's group when no tile was visible)

  T* dkg = static_cast<T*>(a.g.dk) + a.g.dk_at(b, hk);
  T* dvg = static_cast<T*>(a.g.dv) + a.g.dv_at(b, hk);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = j0 + key_warp * 16 + g + 8 * r;
    if (j >= pat.sk) continue;
#pragma unroll
    for (int n = 0; n < kPT; ++n) {
      const int col = dpart * Tr::kDPart + n * 8 + 2 * t4;
      cuda::store_pair<T>(dkg + j * a.g.dk_ss + col, dk[n][2 * r], dk[n][2 * r + 1], true);
      cuda::store_pair<T>(dvg + j * a.g.dv_ss + col, dv[n][2 * r], dv[n][2 * r + 1], true);
    }
  }
}

// ---- q: dQ ----------------------------------------------------------------------------------

template <int kD_, int kBlockM_, int kBlockN_>
struct BwdQTraits {
  static constexpr int kD = kD_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarps = kBlockM / 16, kThreads = kWarps * 32;
  static constexpr int kQBytes = kBlockM * kD * 2, kKVBytes = kBlockN * kD * 2;
  static constexpr int kSmemBytes = 2 * kQBytes + 4 * kKVBytes;  // Q, dO; K and V of two stages
};

using BwdQTraitsD64 = BwdQTraits<64, 128, 64>;

using BwdQTraitsD128 = BwdQTraits<128, 128, 64>;

using BwdQTraitsD256 = BwdQTraits<256, 64, 32>;

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1) attention_bwd_q_kernel(const AttentionCudaArgs a) {
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kThreads = Tr::kThreads;
  constexpr int kNT = kBN / 8, kDT = kD / 8, kKK = kD / 16;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sQ = cuda::smem_addr(smem), sdO = sQ + Tr::kQBytes, sKV = sdO + Tr::kQBytes;
  const AttentionParams& p = a.g.fwd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int64_t h = blockIdx.y;
  int64_t b, qb;
  if (!block_tile(p, false, kBM, gridDim.x - 1 - blockIdx.x, blockIdx.z, b, qb)) return;
  const AttentionPattern pat = p.pattern.at(b);
  const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
  const T* qg = static_cast<const T*>(p.q) + p.q_at(b, h);
  const T* gog = static_cast<const T*>(a.g.grad_out) + a.g.g_at(b, h);
  load_rows<kBM, kD, kThreads>(sQ, qg, p.q_ss, i0, pat.sq, tid);
  load_rows<kBM, kD, kThreads>(sdO, gog, a.g.g_ss, i0, pat.sq, tid);
  cuda::cp_async_commit();
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = i0 + warp * 16 + g + 8 * r, row = a.ws_row(b, h) + (i < pat.sq ? i : 0);
    lse2[r] = a.lse2[row];
    delta[r] = a.delta[row];
  }

  KeyWalk<kBN, kD, kThreads, T> walk(p, pat, b, h, i0, i1);
  TileClass tc;
  int tile = walk.next(walk.begin, tc, lane);
  if (tile < walk.end) walk.load(sKV, tile, tid);
  float dq[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  int stage = 0;
  while (tile < walk.end) {
    TileClass tn_class;
    const int tn = walk.next(tile + 1, tn_class, lane);
    cuda::cp_async_wait<0>();
    __syncthreads();
    if (tn < walk.end) walk.load(sKV + (stage ^ 1) * 2 * Tr::kKVBytes, tn, tid);
    const uint32_t sK = sKV + stage * 2 * Tr::kKVBytes, sV = sK + Tr::kKVBytes;

    float s[kNT][4], dp[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kKK; ++kk) {
      uint32_t aq[4], ao[4];
      frag_a<kD>(aq, sQ, warp * 16, kk, lane);
      frag_a<kD>(ao, sdO, warp * 16, kk, lane);
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t bk[4], bv[4];
        frag_b<kD>(bk, sK, np * 16, kk, lane);
        frag_b<kD>(bv, sV, np * 16, kk, lane);
        mma_m16n8k16<T>(s[2 * np], aq, bk);
        mma_m16n8k16<T>(s[2 * np + 1], aq, bk + 2);
        mma_m16n8k16<T>(dp[2 * np], ao, bv);
        mma_m16n8k16<T>(dp[2 * np + 1], ao, bv + 2);
      }
    }
    scores_log2(s, a);
    if (tc.kind == BlockKind::kPartial) {
      mask_tile<false, kBN>(s, pat, tc, b, h, i0 + warp * 16, int64_t{tile} * kBN, lane);
    }
    score_grads_by_row(s, dp, lse2, delta, a);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t ads[4];
      acc_to_a<T>(ads, dp, kk);
#pragma unroll
      for (int np = 0; np < kD / 16; ++np) {
        uint32_t bk[4];
        frag_b_trans<kD>(bk, sK, kk * 16, np, lane);
        mma_m16n8k16<T>(dq[2 * np], ads, bk);
        mma_m16n8k16<T>(dq[2 * np + 1], ads, bk + 2);
      }
    }
    tile = tn;
    tc = tn_class;
    stage ^= 1;
  }
  cuda::cp_async_wait<0>();

  T* dqg = static_cast<T*>(a.g.dq) + a.g.dq_at(b, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = i0 + warp * 16 + g + 8 * r;
    if (i >= pat.sq) continue;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
      cuda::store_pair<T>(dqg + i * a.g.dq_ss + n * 8 + 2 * t4, dq[n][2 * r], dq[n][2 * r + 1], true);
    }
  }
}

// ---- launch ---------------------------------------------------------------------------------

template <typename Tr, typename T>
cudaError_t launch_bwd_kv(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  const cudaError_t err = prepare_kernel(attention_bwd_kv_kernel<Tr, T>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  int64_t x, z;
  tile_grid(a.g.fwd, true, Tr::kBlockN, x, z);
  if (x > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(a.g.fwd.kv_heads),
                  static_cast<unsigned>(z));
  attention_bwd_kv_kernel<Tr, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename Tr, typename T>
cudaError_t launch_bwd_q(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  const cudaError_t err = prepare_kernel(attention_bwd_q_kernel<Tr, T>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  int64_t x, z;
  tile_grid(a.g.fwd, false, Tr::kBlockM, x, z);
  if (x > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(a.g.fwd.heads), static_cast<unsigned>(z));
  attention_bwd_q_kernel<Tr, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename Tr>
int run_bwd_kv(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16:
      return launch_bwd_kv<Tr, __nv_bfloat16>(a, s);
    case DType::kFloat16:
      return launch_bwd_kv<Tr, __half>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename Tr>
int run_bwd_q(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16:
      return launch_bwd_q<Tr, __nv_bfloat16>(a, s);
    case DType::kFloat16:
      return launch_bwd_q<Tr, __half>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace attention_cuda
}  // namespace opforge
