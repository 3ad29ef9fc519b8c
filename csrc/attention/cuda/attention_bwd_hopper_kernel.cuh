// attention CUDA backward for Hopper (sm_90a): the dK/dV and dQ passes of attention_bwd_kernel.cuh
// (same prep, same deterministic order) as warp-specialised wgmma kernels, three warpgroups each:
//   kv: one block per 128 keys of one (batch, kv head); the producer warp loads K and V once, then
//       for every q head of the GQA group and every visible query tile (64 queries) Q, dO, lse2 and
//       delta into a ring; consumer warpgroup c owns keys 64c..64c+63 and computes S^T = K Q^T and
//       dP^T = V dO^T (both operands in shared memory), P^T and dS^T in registers, then
//       dV += P^T dO and dK += dS^T Q with P^T / dS^T as register operands (dO, Q read MN-major);
//   q:  one block per 128 queries of one (batch, head); Q and dO once, K and V tiles (128 keys) of
//       the visible key tiles through the ring; S = Q K^T, dP = dO V^T, then dQ += dS K.
// Head dims 64 and 128 (dK and dV of 64 keys x 256 do not fit a warpgroup's registers: head dim
// 256 keeps the mma.sync passes). Without sm_90a device code the kernels trap and the launcher
// uses the mma.sync passes.
#pragma once

#include <cuda.h>

#include "attention/cuda/attention_hopper_common.cuh"
#include "attention/cuda/attention_mma_common.cuh"
#include "common/cuda/mbarrier.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPFORGE_ATTENTION_BWD_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace attention_cuda {

template <int kD_, int kStages_>
struct HopperBwdKVTraits {
  static constexpr int kD = kD_, kBlockN = 128, kBlockM = 64, kStages = kStages_;
  static constexpr int kThreads = 384;
  static constexpr int kPanels = kD / 64;
  static constexpr int kKPanelBytes = kBlockN * 128, kQPanelBytes = kBlockM * 128;
  static constexpr int kKBytes = kPanels * kKPanelBytes, kQBytes = kPanels * kQPanelBytes;
  // A stage: Q, dO, then lse2 and delta (kBlockM floats each), padded to the swizzle atom.
  static constexpr int kStageBytes = (2 * kQBytes + 2 * kBlockM * 4 + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = 1024 + 2 * kKBytes + kStages * kStageBytes + (1 + 2 * kStages) * 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};
using HopperBwdKVTraitsD64 = HopperBwdKVTraits<64, 4>;
using HopperBwdKVTraitsD128 = HopperBwdKVTraits<128, 2>;

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_bwd_kv_hopper_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                                   const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                                   const AttentionCudaArgs a) {
#ifdef OPFORGE_ATTENTION_BWD_WGMMA_DEVICE
  constexpr int kD = Tr::kD, kBN = Tr::kBlockN, kBM = Tr::kBlockM, kStages = Tr::kStages;
  constexpr int kMT = kBM / 8, kDT = kD / 8;
  using cuda::smem_addr;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* const sK = smem;
  unsigned char* const sV = smem + Tr::kKBytes;
  unsigned char* const sStages = sV + Tr::kKBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sStages + kStages * Tr::kStageBytes);
  uint64_t* const bar_kv = bars;
  uint64_t* const full = bars + 1;
  uint64_t* const empty = full + kStages;
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = int64_t{blockIdx.x} * kBN, j1 = min(j0 + kBN, pat.sk);
  const int64_t group = p.heads / p.kv_heads;
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(bar_kv), 1);
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(smem_addr(&full[s]), 1);
      cuda::mbar_init(smem_addr(&empty[s]), 2);
    }
    cuda::fence_mbarrier_init();
  }
  __syncthreads();
  QueryWalk<kBM> walk(pat, b, j0, j1);

  if (wg == 0) {  // producer
    cuda::setmaxnreg_dec<24>();
    if (warp != 0) return;
    if (lane == 0) {
      cuda::mbar_arrive_expect_tx(smem_addr(bar_kv), 2 * Tr::kKBytes);
#pragma unroll
      for (int pn = 0; pn < Tr::kPanels; ++pn) {
        cuda::tma_load_4d(smem_addr(sK + pn * Tr::kKPanelBytes), &map_k, pn * 64, static_cast<int>(j0),
                          static_cast<int>(hk), static_cast<int>(b), smem_addr(bar_kv));
        cuda::tma_load_4d(smem_addr(sV + pn * Tr::kKPanelBytes), &map_v, pn * 64, static_cast<int>(j0),
                          static_cast<int>(hk), static_cast<int>(b), smem_addr(bar_kv));
      }
    }
    int it = 0;
    for (int64_t gi = 0; gi < group; ++gi) {
      const int h = static_cast<int>(hk * group + gi);
      const float* lse2 = a.lse2 + (b * p.heads + h) * a.lse2_ld;
      const float* delta = a.delta + (b * p.heads + h) * a.lse2_ld;
      TileClass tc;
      for (int tile = walk.next(h, walk.begin, tc, lane); tile < walk.end; tile = walk.next(h, tile + 1, tc, lane), ++it) {
        const int s = it % kStages;
        if (lane == 0) {
          cuda::mbar_wait(smem_addr(&empty[s]), ((it / kStages) & 1) ^ 1);
          unsigned char* const st = sStages + s * Tr::kStageBytes;
          const uint32_t bar = smem_addr(&full[s]);
          cuda::mbar_arrive_expect_tx(bar, 2 * Tr::kQBytes + 2 * kBM * 4);
#pragma unroll
          for (int pn = 0; pn < Tr::kPanels; ++pn) {
            cuda::tma_load_4d(smem_addr(st + pn * Tr::kQPanelBytes), &map_q, pn * 64, tile * kBM, h,
                              static_cast<int>(b), bar);
            cuda::tma_load_4d(smem_addr(st + Tr::kQBytes + pn * Tr::kQPanelBytes), &map_do, pn * 64, tile * kBM, h,
                              static_cast<int>(b), bar);
          }
          cuda::bulk_load(smem_addr(st + 2 * Tr::kQBytes), lse2 + tile * kBM, kBM * 4, bar);
          cuda::bulk_load(smem_addr(st + 2 * Tr::kQBytes + kBM * 4), delta + tile * kBM, kBM * 4, bar);
        }
        __syncwarp();
      }
    }
    return;
  }

  cuda::setmaxnreg_inc<240>();
  const int half = wg - 1, t4 = lane % 4;
  const int64_t key0 = j0 + half * 64 + warp * 16;  // this warp's first key
  float dk[kDT][4], dv[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  }
  cuda::mbar_wait(smem_addr(bar_kv), 0);
  const unsigned char* k_rows = sK + half * 64 * 128;
  const unsigned char* v_rows = sV + half * 64 * 128;
  int it = 0;
  for (int64_t gi = 0; gi < group; ++gi) {
    const int64_t h = hk * group + gi;
    TileClass tc;
    for (int tile = walk.next(h, walk.begin, tc, lane); tile < walk.end; ++it) {
      const int s = it % kStages;
      const unsigned char* sQ = sStages + s * Tr::kStageBytes;
      const unsigned char* sdO = sQ + Tr::kQBytes;
      const float* lse2s = reinterpret_cast<const float*>(sQ + 2 * Tr::kQBytes);
      const float* deltas = lse2s + kBM;
      float st[kMT][4], dpt[kMT][4];
      cuda::mbar_wait(smem_addr(&full[s]), (it / kStages) & 1);
      cuda::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int pn = kk / 4, off = (kk % 4) * 32;
        cuda::Wgmma<T, kBM>::template mma<0>(&st[0][0], cuda::smem_desc_k_major(k_rows + pn * Tr::kKPanelBytes + off),
                                             cuda::smem_desc_k_major(sQ + pn * Tr::kQPanelBytes + off), kk > 0);
      }
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int pn = kk / 4, off = (kk % 4) * 32;
        cuda::Wgmma<T, kBM>::template mma<0>(&dpt[0][0], cuda::smem_desc_k_major(v_rows + pn * Tr::kKPanelBytes + off),
                                             cuda::smem_desc_k_major(sdO + pn * Tr::kQPanelBytes + off), kk > 0);
      }
      cuda::wgmma_commit();
      cuda::wgmma_wait<0>();
      cuda::fence_operands(st);
      cuda::fence_operands(dpt);
      TileClass tn_class;
      const int tn = walk.next(h, tile + 1, tn_class, lane);

      scores_log2(st, a);
      if (tc.kind == BlockKind::kPartial) {
        mask_tile<true, kBM>(st, pat, tc, b, h, key0, int64_t{tile} * kBM, lane);
      }
      score_grads_by_column(st, dpt, lse2s, deltas, a, t4);
      uint32_t ap[kBM / 16][4], ads[kBM / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        acc_to_a<T>(ap[kk], st, kk);
        acc_to_a<T>(ads[kk], dpt, kk);
      }
      cuda::fence_operands(dv);
      cuda::fence_operands(dk);
      cuda::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {  // 16 queries = 16 rows of 128 bytes of dO and Q
        cuda::WgmmaRS<T, kD>::template mma<1>(&dv[0][0], ap[kk],
                                              cuda::smem_desc_mn_major(sdO + kk * 2048, Tr::kQPanelBytes), 1);
        cuda::WgmmaRS<T, kD>::template mma<1>(&dk[0][0], ads[kk],
                                              cuda::smem_desc_mn_major(sQ + kk * 2048, Tr::kQPanelBytes), 1);
      }
      cuda::wgmma_commit();
      cuda::wgmma_wait<0>();
      cuda::fence_operands(dv);
      cuda::fence_operands(dk);
      if (t == 0) cuda::mbar_arrive(smem_addr(&empty[s]));
      tile = tn;
      tc = tn_class;
    }
  }

  // dK and dV through this warpgroup's own rows of the K and V tiles (16-byte stores).
  const float one[2] = {1.f, 1.f};
  const int64_t first = j0 + half * 64;
  store_accumulator_rows<kD, T>(dk, one, sK + half * 64 * 128, Tr::kKPanelBytes,
                                static_cast<T*>(a.g.dk) + b * a.g.dk_bs + hk * a.g.dk_hs, a.g.dk_ss, first, pat.sk, t,
                                1 + half);
  store_accumulator_rows<kD, T>(dv, one, sV + half * 64 * 128, Tr::kKPanelBytes,
                                static_cast<T*>(a.g.dv) + b * a.g.dv_bs + hk * a.g.dv_hs, a.g.dv_ss, first, pat.sk, t,
                                1 + half);
#else
  __trap();
#endif
}

template <int kD_, int kBlockN_, int kStages_>
struct HopperBwdQTraits {
  static constexpr int kD = kD_, kBlockM = 128, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kThreads = 384;
  static constexpr int kPanels = kD / 64;
  static constexpr int kQPanelBytes = kBlockM * 128, kKVPanelBytes = kBlockN * 128;
  static constexpr int kQBytes = kPanels * kQPanelBytes, kKVBytes = kPanels * kKVPanelBytes;
  static constexpr int kStageBytes = 2 * kKVBytes;  // K then V
  static constexpr int kSmemBytes = 1024 + 2 * kQBytes + kStages * kStageBytes + (1 + 2 * kStages) * 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};
using HopperBwdQTraitsD64 = HopperBwdQTraits<64, 128, 3>;
using HopperBwdQTraitsD128 = HopperBwdQTraits<128, 128, 2>;

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_bwd_q_hopper_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                                  const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                                  const AttentionCudaArgs a) {
#ifdef OPFORGE_ATTENTION_BWD_WGMMA_DEVICE
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kNT = kBN / 8, kDT = kD / 8;
  using cuda::smem_addr;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* const sQ = smem;
  unsigned char* const sdO = smem + Tr::kQBytes;
  unsigned char* const sKV = sdO + Tr::kQBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sKV + kStages * Tr::kStageBytes);
  uint64_t* const bar_q = bars;
  uint64_t* const full = bars + 1;
  uint64_t* const empty = full + kStages;
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t qb = gridDim.x - 1 - blockIdx.x;
  const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(bar_q), 1);
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(smem_addr(&full[s]), 1);
      cuda::mbar_init(smem_addr(&empty[s]), 2);
    }
    cuda::fence_mbarrier_init();
  }
  __syncthreads();
  KeyWalk<kBN, kD, 32, T> walk(p, b, h, i0, i1);

  if (wg == 0) {  // producer
    cuda::setmaxnreg_dec<24>();
    if (warp != 0) return;
    const int hk = static_cast<int>(h / (p.heads / p.kv_heads));
    if (lane == 0) {
      cuda::mbar_arrive_expect_tx(smem_addr(bar_q), 2 * Tr::kQBytes);
#pragma unroll
      for (int pn = 0; pn < Tr::kPanels; ++pn) {
        cuda::tma_load_4d(smem_addr(sQ + pn * Tr::kQPanelBytes), &map_q, pn * 64, static_cast<int>(i0),
                          static_cast<int>(h), static_cast<int>(b), smem_addr(bar_q));
        cuda::tma_load_4d(smem_addr(sdO + pn * Tr::kQPanelBytes), &map_do, pn * 64, static_cast<int>(i0),
                          static_cast<int>(h), static_cast<int>(b), smem_addr(bar_q));
      }
    }
    TileClass tc;
    int it = 0;
    for (int tile = walk.next(walk.begin, tc, lane); tile < walk.end; tile = walk.next(tile + 1, tc, lane), ++it) {
      const int s = it % kStages;
      if (lane == 0) {
        cuda::mbar_wait(smem_addr(&empty[s]), ((it / kStages) & 1) ^ 1);
        unsigned char* const st = sKV + s * Tr::kStageBytes;
        const uint32_t bar = smem_addr(&full[s]);
        cuda::mbar_arrive_expect_tx(bar, 2 * Tr::kKVBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
          cuda::tma_load_4d(smem_addr(st + pn * Tr::kKVPanelBytes), &map_k, pn * 64, tile * kBN, hk,
                            static_cast<int>(b), bar);
          cuda::tma_load_4d(smem_addr(st + Tr::kKVBytes + pn * Tr::kKVPanelBytes), &map_v, pn * 64, tile * kBN, hk,
                            static_cast<int>(b), bar);
        }
      }
      __syncwarp();
    }
    return;
  }

  cuda::setmaxnreg_inc<240>();
  const int half = wg - 1, g = lane / 4;
  const int64_t row0 = i0 + half * 64 + warp * 16;
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row0 + g + 8 * r, row = (b * p.heads + h) * a.lse2_ld + (i < pat.sq ? i : 0);
    lse2[r] = a.lse2[row];
    delta[r] = a.delta[row];
  }
  float dq[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  cuda::mbar_wait(smem_addr(bar_q), 0);
  const unsigned char* q_rows = sQ + half * 64 * 128;
  const unsigned char* do_rows = sdO + half * 64 * 128;
  TileClass tc;
  int it = 0;
  for (int tile = walk.next(walk.begin, tc, lane); tile < walk.end; ++it) {
    const int s = it % kStages;
    const unsigned char* sK = sKV + s * Tr::kStageBytes;
    const unsigned char* sV = sK + Tr::kKVBytes;
    float sc[kNT][4], dp[kNT][4];
    cuda::mbar_wait(smem_addr(&full[s]), (it / kStages) & 1);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int pn = kk / 4, off = (kk % 4) * 32;
      cuda::Wgmma<T, kBN>::template mma<0>(&sc[0][0], cuda::smem_desc_k_major(q_rows + pn * Tr::kQPanelBytes + off),
                                           cuda::smem_desc_k_major(sK + pn * Tr::kKVPanelBytes + off), kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int pn = kk / 4, off = (kk % 4) * 32;
      cuda::Wgmma<T, kBN>::template mma<0>(&dp[0][0], cuda::smem_desc_k_major(do_rows + pn * Tr::kQPanelBytes + off),
                                           cuda::smem_desc_k_major(sV + pn * Tr::kKVPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
    uint32_t mask_rows[2];  // a partial block-mask tile's bits, read while S and dP are computed
    if (tc.mask) mask_rows_ahead<kBN>(pat, b, h, row0, int64_t{tile} * kBN, lane, mask_rows);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(sc);
    cuda::fence_operands(dp);
    TileClass tn_class;
    const int tn = walk.next(tile + 1, tn_class, lane);

    scores_log2(sc, a);
    if (tc.kind == BlockKind::kPartial) {
      mask_tile<false, kBN>(sc, pat, tc, b, h, row0, int64_t{tile} * kBN, lane, mask_rows);
    }
    score_grads_by_row(sc, dp, lse2, delta, a);
    uint32_t ads[kBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) acc_to_a<T>(ads[kk], dp, kk);
    cuda::fence_operands(dq);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {  // 16 keys = 16 rows of 128 bytes of K
      cuda::WgmmaRS<T, kD>::template mma<1>(&dq[0][0], ads[kk],
                                            cuda::smem_desc_mn_major(sK + kk * 2048, Tr::kKVPanelBytes), 1);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();
    cuda::fence_operands(dq);
    if (t == 0) cuda::mbar_arrive(smem_addr(&empty[s]));
    tile = tn;
    tc = tn_class;
  }

  // dQ through this warpgroup's own rows of the Q tile (16-byte stores).
  const float one[2] = {1.f, 1.f};
  store_accumulator_rows<kD, T>(dq, one, sQ + half * 64 * 128, Tr::kQPanelBytes,
                                static_cast<T*>(a.g.dq) + b * a.g.dq_bs + h * a.g.dq_hs, a.g.dq_ss, i0 + half * 64,
                                pat.sq, t, 1 + half);
#else
  __trap();
#endif
}

// ---- launch ---------------------------------------------------------------------------------

template <typename Tr, typename T>
cudaError_t launch_hopper_bwd_kv(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  const cudaError_t err = prepare_hopper(attention_bwd_kv_hopper_kernel<Tr, T>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  CUtensorMap mq, mk, mv, mdo;
  if (!make_attention_maps(a, Tr::kD, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv, &mdo)) return cudaErrorInvalidValue;
  const AttentionParams& p = a.g.fwd;
  const dim3 grid(static_cast<unsigned>((p.pattern.sk + Tr::kBlockN - 1) / Tr::kBlockN),
                  static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.batch));
  attention_bwd_kv_hopper_kernel<Tr, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, mdo, a);
  return cudaGetLastError();
}

template <typename Tr, typename T>
cudaError_t launch_hopper_bwd_q(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  const cudaError_t err = prepare_hopper(attention_bwd_q_hopper_kernel<Tr, T>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  CUtensorMap mq, mk, mv, mdo;
  if (!make_attention_maps(a, Tr::kD, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv, &mdo)) return cudaErrorInvalidValue;
  const AttentionParams& p = a.g.fwd;
  const dim3 grid(static_cast<unsigned>((p.pattern.sq + Tr::kBlockM - 1) / Tr::kBlockM),
                  static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  attention_bwd_q_hopper_kernel<Tr, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, mdo, a);
  return cudaGetLastError();
}

template <typename Tr, template <typename, typename> class Launch>
int run_hopper_pass(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16: return Launch<Tr, __nv_bfloat16>::run(a, s);
    case DType::kFloat16: return Launch<Tr, __half>::run(a, s);
    default: return cudaErrorInvalidValue;
  }
}
template <typename Tr, typename T>
struct LaunchBwdKV {
  static cudaError_t run(const AttentionCudaArgs& a, cudaStream_t s) { return launch_hopper_bwd_kv<Tr, T>(a, s); }
};
template <typename Tr, typename T>
struct LaunchBwdQ {
  static cudaError_t run(const AttentionCudaArgs& a, cudaStream_t s) { return launch_hopper_bwd_q<Tr, T>(a, s); }
};

}  // namespace attention_cuda
}  // namespace opforge
