// attention CUDA forward for Hopper (sm_90a): FlashAttention-3's design. One block per 64 x kConsumers
// queries of one (batch, head), a producer warpgroup and kConsumers consumer warpgroups:
//   producer (warp 0 of warpgroup 0, 40 registers: its tile walk spills at 24): TMA of the Q tile
//     once, then of the K and V tiles of every key tile the pattern leaves visible, each through its
//     own ring
//     (cuda::Pipeline), with the tile's index and class written into the K stage; an empty stage
//     ends the walk;
//   consumers (warpgroups 1.., 64 query rows each; 232 registers with 2): per key tile, S = Q K^T by
//     wgmma with both operands in shared memory, then O += P V for the previous tile's P (from
//     registers, V read MN-major), both issued before the softmax of this tile runs, so that the
//     softmax overlaps the P V product (intra-warpgroup overlap); the K stage is handed back as soon
//     as S is done, the V stage when P V is. The warpgroups take turns to issue their products
//     (named barriers: ping-pong), so one's softmax runs while another's products occupy the
//     tensor cores.
// With a block mask the kernel's block-mask form runs (kStageMask): the producer's lanes also copy
// each partial mask tile's bits into the K stage (stage_mask_bits, after the K tile's copy is
// issued), and the consumers compute a partial tile's visibility from them while the other
// warpgroup has its turn.
// Blocks take their query blocks in groups of (batch row, head) pairs whose K and V fit in L2
// together, longest first across a group's pairs where a band makes lengths differ (so that the
// grid's last blocks are short ones); varlen blocks find their sequence by a warp-wide search.
// Where items are short (few key tiles: hopper_fwd_persistent, attention_heuristics.h) the persistent
// form runs instead (attention_fwd_hopper_persistent.cuh): a block a multiprocessor taking items from
// a counter in that order, the next item's Q and first K / V loading while the last one finishes.
// The pieces: attention_fwd_hopper_traits.cuh (traits, shared memory), _producer.cuh (K / V loads),
// _consumer.cuh (a consumer warpgroup's work item), this header (the one-item kernel),
// _persistent.cuh, _launch.cuh (host side).
// Tiles are 128-byte swizzled boxes of 64 columns (TMA writes them, wgmma descriptors read them);
// rows past the tensor come in as zeros (the KV-cache form: rows past a sequence's count may hold
// anything; its masked scores drop K's, fwd_load_v_tile zeroes V's). Without sm_90a device code the kernel
// traps; the launcher's rule (attention_heuristics.h) asks hopper_status() first and takes the mma.sync
// kernel there.
#pragma once

#include "attention/cuda/attention_fwd_hopper_consumer.cuh"

namespace opforge {
namespace attention_cuda {

// The one-item kernels' (batch row, head, query block) for this block; false for a varlen grid's
// block past the packed queries' tiles. Without varlen the blocks go in groups of group_pairs
// (batch row, head) pairs, each group's query blocks last to first across its pairs (with causal,
// the most keys first: the longest blocks of a group start first and the last blocks to start are
// short); varlen: the padded tiles of the packed queries last to first, a head each grid row.
// (FwdSchedule::decode orders the persistent kernel's items the same way; as the kernel's
// parameter it made the D256 and block-mask forms' producers spill: session 6.)
template <typename Tr>
__device__ __forceinline__ bool fwd_block_item(const AttentionParams& p, int group_pairs, int64_t& b,
                                               int64_t& h, int64_t& qb) {
  constexpr int kBM = Tr::kBlockM;
  if (group_pairs > 0) {
    const int blocks = static_cast<int>((p.pattern.sq + kBM - 1) / kBM);
    int pair, w;
    cuda::grouped_tile(static_cast<int>(blockIdx.x), group_pairs, static_cast<int>(p.batch * p.heads), blocks,
                       false, pair, w);
    b = pair / p.heads, h = pair % p.heads, qb = blocks - 1 - w;
    return true;
  }
  h = blockIdx.y;
  return padded_tile_warp(p.pattern.cu_seqlens_q, p.pattern.total_q, p.batch, kBM, gridDim.x - 1 - blockIdx.x,
                          b, qb);
}

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_fwd_hopper_kernel(const __grid_constant__ CUtensorMap map_q,
                                const __grid_constant__ CUtensorMap map_k,
                                const __grid_constant__ CUtensorMap map_v, const AttentionCudaArgs a,
                                const int group_pairs) {
#ifdef OPFORGE_ATTENTION_WGMMA_DEVICE
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kDT = Tr::kDV / 8;  // (the output's 8-column groups)
  using cuda::smem_addr;
  using State = cuda::PipelineState<kStages>;
  extern __shared__ unsigned char smem_raw[];
  const FwdSmem<Tr> sm(cuda::align_shared<1024>(smem_raw));
  unsigned char* const sQ = sm.q;
  unsigned char* const sKV = sm.kv;
  uint32_t* const smask = sm.mask;
  int4* const info = sm.info;
  uint64_t* const bar_q = sm.q_full;
  const cuda::Pipeline<kStages>& pk = sm.pk;
  const cuda::Pipeline<kStages>& pv = sm.pv;
  const AttentionParams& p = a.g.fwd;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  int64_t b, h, qb;
  if (!fwd_block_item<Tr>(p, group_pairs, b, h, qb)) return;
  const AttentionPattern pat = p.pattern.at(b);
  const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(bar_q), 1);
    pk.init(Tr::kStageMask ? 4 * Tr::kConsumers
                           : Tr::kConsumers);  // one arrival per consumer warp / warpgroup
    pv.init(Tr::kConsumers);
    cuda::mbar_init(smem_addr(sm.v_own), 1);
    cuda::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    cuda::setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp != 0) return;
    KeyWalk<kBN, kD, 32, T, Tr::kStageMask> walk(p, pat, b, h, i0, i1);
    const int hk = static_cast<int>(h / (p.heads / p.kv_heads));
    // TMA coordinates: the tensors' batch row, the sequence's first rows (varlen: in the packed dims).
    const int tb = static_cast<int>(p.pattern.tensor_batch(b));
    const int q_row0 = static_cast<int>(p.pattern.q_start(b)),
              k_row0 = static_cast<int>(p.pattern.k_start(b));
    if (lane == 0) {
      cuda::mbar_arrive_expect_tx(smem_addr(bar_q), Tr::kQBytes);
#pragma unroll
      for (int pn = 0; pn < Tr::kPanels; ++pn) {
        cuda::tma_load_4d(smem_addr(sQ + pn * Tr::kQPanelBytes), &map_q, pn * Tr::kPanelCols,
                          q_row0 + static_cast<int>(i0), static_cast<int>(h), tb, smem_addr(bar_q));
      }
    }
    // The block-mask form: a partial mask tile inside one mask block gets its bits (the block's rows
    // of the Q tile, the tile's columns) copied into the stage by the warp's lanes (cp.async, which
    // the K stage's full barrier waits for), and the consumers read them from shared memory; other
    // block masks' bits (blocks smaller than the tile, an unaligned bit table) they read from global
    // memory.
    const bool stage_bits = Tr::kStageMask && mask_stageable<kBM, kBN>(pat);
    TileClass tc;
    State w;
    cuda::PipelineState<1> v_own;  // (kKvCache: fwd_load_v_tile's own barrier, a one-stage ring)
    for (int tile = walk.next(walk.begin, tc, lane); tile < walk.end;
         tile = walk.next(tile + 1, tc, lane), w.advance()) {
      unsigned char* const sK = sKV + w.index * Tr::kStageBytes;
      const uint32_t k_full = smem_addr(&pk.full[w.index]);
      // (kKvCache: a paged tile's page runs, read before the stage waits)
      const FwdPageRun run = Tr::kKvCache ? fwd_page_run<Tr>(p, b, tile, lane) : FwdPageRun{};
      const auto load_k = [&](uint32_t bar) {
        if constexpr (Tr::kKvCache) __syncwarp();  // (every lane may issue a box)
        fwd_load_kv_tile<Tr>(&map_k, sK, p, tile, k_row0, hk, tb, bar, run, lane);
      };
      if constexpr (Tr::kStageMask) {
        // The K copies first (their bytes expected without an arrival), then the lanes' bits
        // (cp.async, counted on the same barrier), then lane 0's arrival: the copies are in flight
        // while the lanes read where the bits are. (kKvCache: every lane may issue a box.)
        if (lane == 0) {
          pk.producer_acquire(w);
          pk.producer_expect(w, Tr::kKVBytes);
        }
        load_k(k_full);
        __syncwarp();
        int staged = 0;
        if (stage_bits && tc.mask) {
          staged = stage_mask_bits<kBM, kBN>(pat, b, h, i0, int64_t{tile} * kBN,
                                             smask + w.index * Tr::kMaskWords, &pk.full[w.index], lane);
        }
        __syncwarp();  // (the lanes' arrivals counted before lane 0's can complete the phase)
        if (lane == 0) {
          info[w.index] = make_int4(tile, tile_class_bits(tc), staged, 0);
          pk.producer_arrive(w);
        }
      } else {
        if (lane == 0) {
          pk.producer_acquire(w);
          info[w.index] = make_int4(tile, tile_class_bits(tc), 0, 0);
          pk.producer_commit(w, Tr::kKVBytes);
        }
        load_k(k_full);
      }
      if constexpr (Tr::kKvCache) {
        if (lane == 0) pv.producer_acquire(w);
        __syncwarp();
        fwd_load_v_tile<Tr>(sm, &map_v, sK + Tr::kKVBytes, p, pat, tile, k_row0, hk, tb, run, w, v_own, lane);
      } else if (lane == 0) {
        pv.producer_acquire(w);
        const uint32_t bar = pv.producer_commit(w, Tr::kVBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanelsV; ++pn) {
          cuda::tma_load_4d(smem_addr(sK + Tr::kKVBytes + pn * Tr::kKVPanelBytes), &map_v, pn * 64,
                            k_row0 + tile * kBN, hk, tb, bar);
        }
      }
      __syncwarp();
    }
    if (lane == 0) {  // the end: a K stage with no tile (an arrival without bytes)
      pk.producer_acquire(w);
      info[w.index] = make_int4(-1, 0, 0, 0);
      cuda::mbar_arrive(smem_addr(&pk.full[w.index]));
    }
    return;
  }

  // consumers: warpgroup 1 takes query rows 0-63 of the block, warpgroup 2 rows 64-127
  cuda::setmaxnreg_inc<Tr::kConsumerRegs>();
  // this warpgroup and the one after it (the index through a shuffle: the compiler then knows it is
  // the same across the warp and keeps the descriptors built from it in uniform registers)
  const int half = __shfl_sync(0xffffffffu, wg, 0) - 1, next = (half + 1) % Tr::kConsumers;
  const int64_t row0 = i0 + half * 64 + warp * 16;  // this warp's first query row
  float o[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.f, 0.f};
  cuda::mbar_wait(smem_addr(bar_q), 0);
  if (Tr::kPingPong && half == Tr::kConsumers - 1)
    cuda::named_barrier_arrive<256>(kFwdBarTurn);  // warpgroup 1 issues first
  // Raw scores go into the softmax with the scale in its exponent (k); a softcap or a non-positive
  // scale (the max of raw scores would not be the max of scaled ones) takes them to the log2 domain
  // first (k = 1).
  const bool raw_scores = a.cap_log2 == 0.f && a.scale_log2 > 0.f;
  const float k = raw_scores ? a.scale_log2 : 1.f;
  State rk, rv;
  fwd_consumer_item<Tr, T>(sm, a, pat, b, h, row0, half, next, t, rk, rv, o, m_run, l_run, raw_scores, k);

  // Epilogue: O / l through this warpgroup's rows of the Q tile (only it reads them); the LSE by
  // the quad's first lane.
  float inv[2];
  finish_rows(m_run, l_run, inv, p, pat.sq, b, h, row0, lane, k);
  store_accumulator_rows<Tr::kDV, T>(o, inv, sQ + half * 64 * 128, Tr::kQPanelBytes,
                                     static_cast<T*>(p.out) + p.o_at(b, h), p.o_ss, i0 + half * 64, pat.sq, t,
                                     1 + half);
#else
  __trap();
#endif
}

}  // namespace attention_cuda
}  // namespace opforge
