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
// Tiles are 128-byte swizzled boxes of 64 columns (TMA writes them, wgmma descriptors read them);
// rows past the sequence come in as zeros. Without sm_90a device code the kernel traps; the
// launcher's rule (attention_heuristics.h) asks hopper_status() first and takes the mma.sync kernel
// there.
#pragma once

#include <cuda.h>

#include <algorithm>

#include "attention/cuda/attention_hopper_common.cuh"
#include "attention/cuda/attention_mma_common.cuh"
#include "common/cuda/mbarrier.cuh"
#include "common/cuda/pipeline.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/tile_order.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPFORGE_ATTENTION_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace attention_cuda {

template <int kD_, int kBlockN_, int kStages_, int kConsumers_ = 2, bool kPingPong_ = true, bool kStageMask_ = false>
struct HopperFwdTraits {
  static constexpr int kD = kD_, kBlockN = kBlockN_, kStages = kStages_, kConsumers = kConsumers_;
  // The consumer warpgroups take turns to issue their products (named barriers of 256 threads: the
  // warpgroup whose turn it is and the one before it).
  static constexpr bool kPingPong = kPingPong_;
  // The block-mask form (launched for patterns with a block mask): a partial mask tile's bits staged
  // into the K stage by the producer (kMaskWords: kBlockM rows of kBlockN / 32 words), the stage
  // handed back by every consumer warp (each reads the bits), a partial tile's visibility computed
  // before the warpgroup's turn to issue.
  static constexpr bool kStageMask = kStageMask_;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumer warpgroups
  // Registers a thread after setmaxnreg (FA3's split: the launch's 65536 / kThreads, rounded down to
  // 8, moved from the producer warpgroup to the consumers).
  static constexpr int kProducerRegs = kConsumers == 2 ? 40 : 32, kConsumerRegs = kConsumers == 2 ? 232 : 160;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (65536 / kThreads / 8 * 8) * (1 + kConsumers),
                "register split");
  static constexpr int kPanels = kD / 64;    // 64-column (128-byte) boxes a row
  static constexpr int kQPanelBytes = kBlockM * 128, kKVPanelBytes = kBlockN * 128;
  static constexpr int kQBytes = kPanels * kQPanelBytes, kKVBytes = kPanels * kKVPanelBytes;
  static constexpr int kStageBytes = 2 * kKVBytes;  // K then V
  static constexpr int kMaskWords = kStageMask ? kBlockM * kBlockN / 32 : 0;
  // Q, the stages, their mask bits, a tile's (index, class, staged) per stage, the barriers (Q; K
  // full / empty; V full / empty).
  static constexpr int kSmemBytes = 1024 /* alignment */ + kQBytes + kStages * (kStageBytes + kMaskWords * 4) +
                                    kStages * 16 + (1 + 4 * kStages) * 8;
  static_assert(kBlockN <= 256 && kSmemBytes <= 227 * 1024, "TMA box rows / shared memory");
};
using HopperFwdTraitsD64 = HopperFwdTraits<64, 128, 2, 2>;  // (three consumers, 192 x 128: 2% faster causal, 11% slower sliding 512)
using HopperFwdTraitsD128 = HopperFwdTraits<128, 128, 2>;
using HopperFwdTraitsD256 = HopperFwdTraits<256, 64, 2, 2, false>;  // (no ping-pong: 3% faster, as FA4 above D 128)
using HopperFwdTraitsMaskD64 = HopperFwdTraits<64, 128, 2, 2, true, true>;
using HopperFwdTraitsMaskD128 = HopperFwdTraits<128, 128, 2, 2, true, true>;
using HopperFwdTraitsMaskD256 = HopperFwdTraits<256, 64, 2, 2, false, true>;

// Named barriers (0 is __syncthreads's; 1 + c consumer warpgroup c's epilogue): + c, consumer
// warpgroup c's turn to issue its products.
constexpr int kFwdBarTurn = 4;

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_fwd_hopper_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                                const __grid_constant__ CUtensorMap map_v, const AttentionCudaArgs a,
                                const int group_pairs) {
#ifdef OPFORGE_ATTENTION_WGMMA_DEVICE
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kNT = kBN / 8, kDT = kD / 8;
  using cuda::smem_addr;
  using State = cuda::PipelineState<kStages>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = cuda::align_shared<1024>(smem_raw);
  unsigned char* const sQ = smem;
  unsigned char* const sKV = smem + Tr::kQBytes;
  uint32_t* const smask = reinterpret_cast<uint32_t*>(sKV + kStages * Tr::kStageBytes);  // a stage's mask bits
  int4* const info = reinterpret_cast<int4*>(smask + kStages * Tr::kMaskWords);  // (tile, class bits, staged) a stage
  uint64_t* bars = reinterpret_cast<uint64_t*>(info + kStages);
  uint64_t* const bar_q = bars;
  const cuda::Pipeline<kStages> pk{bars + 1, bars + 1 + kStages};
  const cuda::Pipeline<kStages> pv{bars + 1 + 2 * kStages, bars + 1 + 3 * kStages};
  const AttentionParams& p = a.g.fwd;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  // The block's (batch row, head, query block). Without varlen the blocks go in groups of
  // group_pairs (batch row, head) pairs, each group's query blocks last to first across its pairs
  // (with causal, the most keys first: the longest blocks of a group start first and the last
  // blocks to start are short); varlen: the padded tiles of the packed queries last to first, a
  // head each grid row.
  int64_t b, h, qb;
  if (group_pairs > 0) {
    const int blocks = static_cast<int>((p.pattern.sq + kBM - 1) / kBM);
    int pair, w;
    cuda::grouped_tile(static_cast<int>(blockIdx.x), group_pairs, static_cast<int>(p.batch * p.heads), blocks, false,
                       pair, w);
    b = pair / p.heads, h = pair % p.heads, qb = blocks - 1 - w;
  } else {
    h = blockIdx.y;
    if (!padded_tile_warp(p.pattern.cu_seqlens_q, p.pattern.total_q, p.batch, kBM, gridDim.x - 1 - blockIdx.x, b, qb)) {
      return;
    }
  }
  const AttentionPattern pat = p.pattern.at(b);
  const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(bar_q), 1);
    pk.init(Tr::kStageMask ? 4 * Tr::kConsumers : Tr::kConsumers);  // one arrival per consumer warp / warpgroup
    pv.init(Tr::kConsumers);
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
    const int q_row0 = static_cast<int>(p.pattern.q_start(b)), k_row0 = static_cast<int>(p.pattern.k_start(b));
    if (lane == 0) {
      cuda::mbar_arrive_expect_tx(smem_addr(bar_q), Tr::kQBytes);
#pragma unroll
      for (int pn = 0; pn < Tr::kPanels; ++pn) {
        cuda::tma_load_4d(smem_addr(sQ + pn * Tr::kQPanelBytes), &map_q, pn * 64, q_row0 + static_cast<int>(i0),
                          static_cast<int>(h), tb, smem_addr(bar_q));
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
    for (int tile = walk.next(walk.begin, tc, lane); tile < walk.end;
         tile = walk.next(tile + 1, tc, lane), w.advance()) {
      unsigned char* const sK = sKV + w.index * Tr::kStageBytes;
      const auto load_k = [&](uint32_t bar) {
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
          cuda::tma_load_4d(smem_addr(sK + pn * Tr::kKVPanelBytes), &map_k, pn * 64, k_row0 + tile * kBN, hk, tb,
                            bar);
        }
      };
      if constexpr (Tr::kStageMask) {
        // The K copies first (their bytes expected without an arrival), then the lanes' bits
        // (cp.async, counted on the same barrier), then lane 0's arrival: the copies are in flight
        // while the lanes read where the bits are.
        if (lane == 0) {
          pk.producer_acquire(w);
          load_k(pk.producer_expect(w, Tr::kKVBytes));
        }
        __syncwarp();
        int staged = 0;
        if (stage_bits && tc.mask) {
          staged = stage_mask_bits<kBM, kBN>(pat, b, h, i0, int64_t{tile} * kBN, smask + w.index * Tr::kMaskWords,
                                             &pk.full[w.index], lane);
        }
        __syncwarp();  // (the lanes' arrivals counted before lane 0's can complete the phase)
        if (lane == 0) {
          info[w.index] = make_int4(tile, tile_class_bits(tc), staged, 0);
          pk.producer_arrive(w);
        }
      } else if (lane == 0) {
        pk.producer_acquire(w);
        info[w.index] = make_int4(tile, tile_class_bits(tc), 0, 0);
        load_k(pk.producer_commit(w, Tr::kKVBytes));
      }
      if (lane == 0) {
        pv.producer_acquire(w);
        const uint32_t bar = pv.producer_commit(w, Tr::kKVBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
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
  uint32_t pa[kBN / 16][4];  // the previous tile's P, the A operand of its P V product
  cuda::mbar_wait(smem_addr(bar_q), 0);
  const unsigned char* q_rows = sQ + half * 64 * 128;
  if (Tr::kPingPong && half == Tr::kConsumers - 1) cuda::named_barrier_arrive<256>(kFwdBarTurn);  // warpgroup 1 issues first
  // S = Q K^T of the tile in K stage rk (its index and class in ti), issued in this warpgroup's turn.
  const auto issue_s = [&](float (&sc)[kNT][4], const State& st) {
    // (the descriptors: one encoding each, then an add a step; at D 256 ptxas hoists Q's sixteen,
    // loop-invariant, out of the loop and spills: there they are encoded from the pointer each time)
    const uint64_t k_desc = cuda::smem_desc_k_major(sKV + st.index * Tr::kStageBytes);
    const uint64_t q_desc = cuda::smem_desc_k_major(q_rows);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {  // 16 deep = 32 bytes along the swizzled 128-byte rows
      const int pn = kk / 4, off = (kk % 4) * 32;
      const uint64_t qd = kD <= 128 ? cuda::desc_advance(q_desc, pn * Tr::kQPanelBytes + off)
                                    : cuda::smem_desc_k_major(q_rows + pn * Tr::kQPanelBytes + off);
      cuda::Wgmma<T, kBN>::template mma<0>(&sc[0][0], qd, cuda::desc_advance(k_desc, pn * Tr::kKVPanelBytes + off),
                                           kk > 0);
    }
    cuda::wgmma_commit();
  };
  // O += P V for the tile in V stage st.
  const auto issue_pv = [&](const State& st) {
    const uint64_t v_desc = cuda::smem_desc_mn_major(sKV + st.index * Tr::kStageBytes + Tr::kKVBytes, Tr::kKVPanelBytes);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {  // 16 keys = 16 rows of 128 bytes
      cuda::WgmmaRS<T, kD>::template mma<1>(&o[0][0], pa[kk], cuda::desc_advance(v_desc, kk * 2048), 1);
    }
    cuda::wgmma_commit();
  };
  // Once S of the tile in K stage st is done: the stage handed back, the scores (raw or in the log2
  // domain) with a partial tile's elements masked (softmax_tile_masked; mask_rows: a partial block-mask
  // tile's bits, read ahead), the softmax step (corr: O's rescale factors). The masked and the
  // unmasked forms are separate code, so that registers are allocated for each on its own: the
  // unmasked one runs while the previous tile's P V is in flight (its P operand live), the masked
  // one after that product is done.
  // Raw scores go into the softmax with the scale in its exponent (k); a softcap or a non-positive
  // scale (the max of raw scores would not be the max of scaled ones) takes them to the log2 domain
  // first (k = 1).
  const bool raw_scores = a.cap_log2 == 0.f && a.scale_log2 > 0.f;
  const float k = raw_scores ? a.scale_log2 : 1.f;
  const auto scores_done = [&](float (&sc)[kNT][4], const State& st) {
    cuda::fence_operands(sc);
    if (Tr::kStageMask ? lane == 0 : t == 0) pk.consumer_release(st);
    if (!raw_scores) scores_log2(sc, a);
  };
  const auto softmax_tile = [&](float (&sc)[kNT][4], const State& st, float (&corr)[2]) {
    scores_done(sc, st);
    softmax_step(sc, m_run, l_run, corr, k);
  };
  const auto softmax_tile_masked = [&](float (&sc)[kNT][4], const State& st, int tile, const TileClass& tc,
                                       const uint32_t (&mask_rows)[2], float (&corr)[2]) {
    scores_done(sc, st);
    mask_tile<false, kBN>(sc, pat, tc, b, h, row0, int64_t{tile} * kBN, lane, mask_rows);
    softmax_step(sc, m_run, l_run, corr, k);
  };
  // The block-mask form's: a partial tile's visibility sets of the thread's two rows (band, segments,
  // block mask: its bits from the stage where the producer staged them, else from global memory);
  // then the softmax of a tile so masked.
  const auto tile_visibility = [&](const int4& ti, const TileClass& tc, const State& st, uint32_t (&vis)[2]) {
    uint32_t mask_rows[2] = {0u, 0u};
    if (tc.mask) {
      if (ti.z) {
        const uint32_t* rows = smask + st.index * Tr::kMaskWords + (half * 64 + warp * 16 + lane / 4) * (kBN / 32);
        mask_rows[0] = mask_row_bits_staged<kBN>(rows, lane % 4);
        mask_rows[1] = mask_row_bits_staged<kBN>(rows + 8 * (kBN / 32), lane % 4);
      } else {
        mask_rows_ahead<kBN>(pat, b, h, row0, int64_t{ti.x} * kBN, lane, mask_rows);
      }
    }
    mask_tile_bits<false, kBN>(vis, pat, tc, b, h, row0, int64_t{ti.x} * kBN, lane, mask_rows);
  };
  const auto softmax_tile_visible = [&](float (&sc)[kNT][4], const State& st, const uint32_t (&vis)[2],
                                        float (&corr)[2]) {
    scores_done(sc, st);
    apply_visibility(sc, vis);
    softmax_step(sc, m_run, l_run, corr, k);
  };
  State rk, rv;
  pk.consumer_wait(rk);
  int4 ti = info[rk.index];
  if (ti.x >= 0) {
    {  // the first tile: S, softmax, P (nothing to rescale yet)
      const TileClass tc = tile_class_from_bits(ti.y);
      uint32_t vis[2];  // (the block-mask form: a partial tile's visibility, before this warpgroup's turn)
      if (Tr::kStageMask && tc.kind == BlockKind::kPartial) tile_visibility(ti, tc, rk, vis);
      float sc[kNT][4];
      if (Tr::kPingPong) cuda::named_barrier_sync<256>(kFwdBarTurn + half);
      cuda::wgmma_fence();
      issue_s(sc, rk);
      if (Tr::kPingPong) cuda::named_barrier_arrive<256>(kFwdBarTurn + next);
      float corr[2];
      if constexpr (Tr::kStageMask) {
        if (tc.kind == BlockKind::kPartial) {
          cuda::wgmma_wait<0>();
          softmax_tile_visible(sc, rk, vis, corr);
        } else {
          cuda::wgmma_wait<0>();
          softmax_tile(sc, rk, corr);
        }
      } else {
        uint32_t mask_rows[2];
        if (tc.mask) mask_rows_ahead<kBN>(pat, b, h, row0, int64_t{ti.x} * kBN, lane, mask_rows);
        cuda::wgmma_wait<0>();
        if (tc.kind == BlockKind::kPartial) {
          softmax_tile_masked(sc, rk, ti.x, tc, mask_rows, corr);
        } else {
          softmax_tile(sc, rk, corr);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) acc_to_a<T>(pa[kk], sc, kk);
      rk.advance();
    }
    for (;; rk.advance()) {  // S of this tile and the previous tile's P V, then this tile's softmax
      pk.consumer_wait(rk);
      ti = info[rk.index];
      if (ti.x < 0) break;
      const TileClass tc = tile_class_from_bits(ti.y);
      // The block-mask form: a partial tile's visibility, computed while the other warpgroup has
      // its turn (after the issue it would wait for S: ptxas hoists the wait above the branch).
      uint32_t vis[2];
      if (Tr::kStageMask && tc.kind == BlockKind::kPartial) tile_visibility(ti, tc, rk, vis);
      float sc[kNT][4];
      if (Tr::kPingPong) cuda::named_barrier_sync<256>(kFwdBarTurn + half);
      cuda::fence_operands(o);
      cuda::wgmma_fence();
      issue_s(sc, rk);
      pv.consumer_wait(rv);
      cuda::wgmma_fence();
      issue_pv(rv);
      if (Tr::kPingPong) cuda::named_barrier_arrive<256>(kFwdBarTurn + next);  // the next warpgroup's turn
      float corr[2];
      if constexpr (Tr::kStageMask) {
        if (tc.kind == BlockKind::kPartial) {
          cuda::wgmma_wait<1>();
          softmax_tile_visible(sc, rk, vis, corr);
        } else {
          cuda::wgmma_wait<1>();
          softmax_tile(sc, rk, corr);
        }
      } else {
        uint32_t mask_rows[2];  // a partial block-mask tile's bits, read while S is computed
        if (tc.mask) mask_rows_ahead<kBN>(pat, b, h, row0, int64_t{ti.x} * kBN, lane, mask_rows);
        // A partial tile's mask code needs more registers than the P V product in flight leaves
        // free: that product is awaited first (partial tiles are few: a band's edges).
        if (tc.kind == BlockKind::kPartial) {
          cuda::wgmma_wait<0>();
          softmax_tile_masked(sc, rk, ti.x, tc, mask_rows, corr);
        } else {
          cuda::wgmma_wait<1>();
          softmax_tile(sc, rk, corr);
        }
      }
      cuda::wgmma_wait<0>();
      cuda::fence_operands(o);
      if (t == 0) pv.consumer_release(rv);
      rv.advance();
      rescale_rows(o, corr);
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) acc_to_a<T>(pa[kk], sc, kk);
    }
    // the last tile's P V
    pv.consumer_wait(rv);
    cuda::fence_operands(o);
    cuda::wgmma_fence();
    issue_pv(rv);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(o);
  }
  if (Tr::kPingPong && half == 0) cuda::named_barrier_sync<256>(kFwdBarTurn);  // the last warpgroup's last hand-over (balanced)

  // Epilogue: O / l through this warpgroup's rows of the Q tile (only it reads them); the LSE by
  // the quad's first lane.
  float inv[2];
  finish_rows(m_run, l_run, inv, p, pat.sq, b, h, row0, lane, k);
  store_accumulator_rows<kD, T>(o, inv, sQ + half * 64 * 128, Tr::kQPanelBytes,
                                static_cast<T*>(p.out) + p.o_at(b, h), p.o_ss, i0 + half * 64, pat.sq, t,
                                1 + half);
#else
  __trap();
#endif
}

// The kernel's one-time setup on the current device (prepare_hopper).
template <typename Tr, typename T>
cudaError_t prepare_hopper_fwd() {
  static signed char state[64] = {};
  return prepare_hopper(attention_fwd_hopper_kernel<Tr, T>, Tr::kSmemBytes, state);
}

// cudaSuccess where this binary runs the Hopper kernels on the current GPU, else
// cudaErrorNoKernelImageForDevice (every Hopper kernel is built for the same arches, so one stands
// for all).
template <typename Tr>
int hopper_status() {
  return prepare_hopper_fwd<Tr, __nv_bfloat16>();
}

template <typename Tr, typename T>
cudaError_t launch_hopper_fwd(const AttentionCudaArgs& a, cudaStream_t stream) {
  const cudaError_t err = prepare_hopper_fwd<Tr, T>();
  if (err != cudaSuccess) return err;
  CUtensorMap mq, mk, mv;
  if (!make_attention_maps(a, Tr::kD, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv)) return cudaErrorInvalidValue;
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  dim3 grid;
  int group_pairs = 0;
  if (pat.varlen()) {
    int64_t x, z;
    tile_grid(p, false, Tr::kBlockM, x, z);
    if (x > 0x7fffffff) return cudaErrorInvalidValue;
    grid = dim3(static_cast<unsigned>(x), static_cast<unsigned>(p.heads), static_cast<unsigned>(z));
  } else {
    const int64_t pairs = p.batch * p.heads, blocks = (pat.sq + Tr::kBlockM - 1) / Tr::kBlockM;
    if (pairs * blocks > 0x7fffffff) return cudaErrorInvalidValue;
    // Pairs a group: where blocks see different numbers of keys (a band), as many as have their K
    // and V (shared by a GQA group's heads) within about a third of the H100 / H200's 50 MB L2, so
    // that each group's longest blocks start first; else one (the longest-first order gains
    // nothing and more pairs at once would share L2 among more K and V).
    const int64_t pair_bytes = pat.sk * Tr::kD * 4 / std::max<int64_t>(p.heads / p.kv_heads, 1);
    const int64_t fit = pat.has_band() ? (int64_t{16} << 20) / std::max<int64_t>(pair_bytes, 1) : 1;
    group_pairs = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pairs, fit)));
    grid = dim3(static_cast<unsigned>(pairs * blocks));
  }
  attention_fwd_hopper_kernel<Tr, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, a, group_pairs);
  return cudaGetLastError();
}

template <typename Tr>
int run_hopper_fwd(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16: return launch_hopper_fwd<Tr, __nv_bfloat16>(a, s);
    case DType::kFloat16: return launch_hopper_fwd<Tr, __half>(a, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace attention_cuda
}  // namespace opforge
