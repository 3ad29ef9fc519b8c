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
// Where items are short (few key tiles: hopper_fwd_persistent, attention_cuda.h) the persistent form
// runs instead (attention_fwd_hopper_persistent_kernel): a block a multiprocessor taking items from
// a counter in that order, the next item's Q and first K / V loading while the last one finishes.
// Tiles are 128-byte swizzled boxes of 64 columns (TMA writes them, wgmma descriptors read them);
// rows past the tensor come in as zeros (the KV-cache form: rows past a sequence's count may hold
// anything; its masked scores drop K's, fwd_load_v_tile zeroes V's). Without sm_90a device code the kernel
// traps; the launcher's rule (attention_heuristics.h) asks hopper_status() first and takes the mma.sync
// kernel there.
#pragma once

#include <cuda.h>

#include <algorithm>

#include "attention/cuda/attention_hopper_common.cuh"
#include "attention/cuda/attention_mask.cuh"
#include "attention/cuda/attention_segment_runs.cuh"
#include "attention/cuda/attention_softmax.cuh"
#include "attention/cuda/attention_tile.cuh"
#include "attention/cuda/attention_walk.cuh"
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

template <int kD_, int kBlockN_, int kStages_, int kConsumers_ = 2, bool kPingPong_ = true,
          bool kStageMask_ = false, bool kPersistent_ = false, bool kKvCache_ = false>
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
  // The persistent form (attention_fwd_hopper_persistent_kernel): a block a multiprocessor, walking
  // the work items (FwdSchedule); the next item's Q tile loads once this one's S products are done,
  // its first K / V tiles while this one's last products and epilogue run, the output staged in its
  // own tile (the Q tile holds the next item's by then). No block mask.
  static constexpr bool kPersistent = kPersistent_;
  static_assert(!(kPersistent && kStageMask), "the persistent form takes no block mask");
  // The KV-cache form (launched for calls with per-sequence key counts, kv_lens, and paged caches):
  // K / V tiles through fwd_load_kv_tile (a paged cache's page runs, a box a lane) and
  // fwd_load_v_tile (a tile past a sequence's count has those rows zeroed before the consumers see
  // it). One-item kernel only.
  static constexpr bool kKvCache = kKvCache_;
  static_assert(!(kPersistent && kKvCache), "the KV-cache form is the one-item kernel's");
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumer warpgroups
  // Registers a thread after setmaxnreg (FA3's split: the launch's 65536 / kThreads, rounded down to
  // 8, moved from the producer warpgroup to the consumers). The persistent producer holds an item's
  // state across its loop (the pattern, the TMA coordinates, the next item): at 40 it spills, at 88
  // only the next item's counter value, once an item (and with segment ids' runs a few values at an
  // item's start); the consumers at 208 do not. The KV-cache form's producer (a page-table read and
  // the ragged V tile's zeroing) spills at 40 and not at 56; its consumers take 224 (no spills).
  static constexpr int kProducerRegs = kPersistent ? 88 : kConsumers == 2 ? (kKvCache_ ? 56 : 40) : 32;
  static constexpr int kConsumerRegs = kPersistent ? 208 : kConsumers == 2 ? (kKvCache_ ? 224 : 232) : 160;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (65536 / kThreads / 8 * 8) * (1 + kConsumers),
                "register split");
  static constexpr int kPanels = kD / 64;  // 64-column (128-byte) boxes a row
  static constexpr int kQPanelBytes = kBlockM * 128, kKVPanelBytes = kBlockN * 128;
  static constexpr int kQBytes = kPanels * kQPanelBytes, kKVBytes = kPanels * kKVPanelBytes;
  static constexpr int kStageBytes = 2 * kKVBytes;  // K then V
  static constexpr int kMaskWords = kStageMask ? kBlockM * kBlockN / 32 : 0;
  static constexpr int kOBytes = kPersistent ? kQBytes : 0;  // (persistent) the output's staging
  // Q, the stages, their mask bits, the output's staging, a tile's (index, class, staged) per stage,
  // (persistent) the Q tile's item, the barriers (Q full (/ empty); K full / empty; V full / empty).
  static constexpr int kSmemBytes = 1024 /* alignment */ + kQBytes +
                                    kStages * (kStageBytes + kMaskWords * 4) + kOBytes + kStages * 16 +
                                    (2 + 4 * kStages) * 8 + (kPersistent ? 32 + 8 : 0);
  static_assert(kBlockN <= 256 && kSmemBytes <= 227 * 1024, "TMA box rows / shared memory");
};
using HopperFwdTraitsD64 =
    HopperFwdTraits<64, 128, 2, 2>;  // (three consumers, 192 x 128: 2% faster causal, 11% slower sliding 512)
using HopperFwdTraitsD128 = HopperFwdTraits<128, 128, 2>;
using HopperFwdTraitsD256 =
    HopperFwdTraits<256, 64, 2, 2, false>;  // (no ping-pong: 3% faster, as FA4 above D 128)
// (persistent: chosen by hopper_fwd_persistent, attention_cuda.h)
using HopperFwdTraitsPersistentD64 = HopperFwdTraits<64, 128, 2, 2, true, false, true>;
using HopperFwdTraitsPersistentD128 = HopperFwdTraits<128, 128, 2, 2, true, false, true>;
using HopperFwdTraitsMaskD64 = HopperFwdTraits<64, 128, 2, 2, true, true>;
using HopperFwdTraitsMaskD128 = HopperFwdTraits<128, 128, 2, 2, true, true>;
using HopperFwdTraitsMaskD256 = HopperFwdTraits<256, 64, 2, 2, false, true>;
using HopperFwdTraitsCacheD64 = HopperFwdTraits<64, 128, 2, 2, true, false, false, true>;
using HopperFwdTraitsCacheD128 = HopperFwdTraits<128, 128, 2, 2, true, false, false, true>;
using HopperFwdTraitsCacheD256 = HopperFwdTraits<256, 64, 2, 2, false, false, false, true>;
using HopperFwdTraitsCacheMaskD64 = HopperFwdTraits<64, 128, 2, 2, true, true, false, true>;
using HopperFwdTraitsCacheMaskD128 = HopperFwdTraits<128, 128, 2, 2, true, true, false, true>;
using HopperFwdTraitsCacheMaskD256 = HopperFwdTraits<256, 64, 2, 2, false, true, false, true>;

// Named barriers (0 is __syncthreads's; 1 + c consumer warpgroup c's epilogue): + c, consumer
// warpgroup c's turn to issue its products.
constexpr int kFwdBarTurn = 4;

// A block's shared memory (Tr::kSmemBytes from a 1024-byte aligned base), in order: the Q tile, the
// K / V stages, their mask bits (block-mask form), the output's staging (persistent), a stage's tile
// (index, class bits, staged), the Q tile's item (persistent: batch row, head, query block, live;
// its first row and rows, a run's), the barriers (the last: the producer's own, for a V tile it
// finishes itself: fwd_load_v_tile).
template <typename Tr>
struct FwdSmem {
  static constexpr int kBars = Tr::kPersistent ? 2 : 1;  // Q full (and empty)
  unsigned char* q;
  unsigned char* kv;
  uint32_t* mask;
  unsigned char* o;
  int4* info;
  int4* q_info;
  uint64_t* q_full;
  uint64_t* q_empty;  // (persistent) the consumers' S products of the Q tile's item are done
  cuda::Pipeline<Tr::kStages> pk, pv;
  uint64_t* v_own;  // the producer's V tile landed (fwd_load_v_tile)

  __device__ __forceinline__ explicit FwdSmem(unsigned char* base)
      : q(base),
        kv(base + Tr::kQBytes),
        mask(reinterpret_cast<uint32_t*>(kv + Tr::kStages * Tr::kStageBytes)),
        o(reinterpret_cast<unsigned char*>(mask + Tr::kStages * Tr::kMaskWords)),
        info(reinterpret_cast<int4*>(o + Tr::kOBytes)),
        q_info(info + Tr::kStages),
        q_full(reinterpret_cast<uint64_t*>(q_info + (Tr::kPersistent ? 2 : 0))),
        q_empty(Tr::kPersistent ? q_full + 1 : nullptr),
        pk{q_full + kBars, q_full + kBars + Tr::kStages},
        pv{q_full + kBars + 2 * Tr::kStages, q_full + kBars + 3 * Tr::kStages},
        v_own(q_full + kBars + 4 * Tr::kStages) {}
};

// Per-sequence key counts (kv_lens) and paged caches in the producer. A paged cache's tile `tile`
// of batch row b is kBlockN / box page runs (boxes of min(page_size, kBlockN) rows); lane r < that
// looks up run r's page and first slot (runs past the table's entries, rows past the sequence's
// keys, read page 0). The producer looks a tile's runs up before it waits for the tile's stages
// (the table read overlaps the wait) and both the K and the V tile use them. Unpaged: nothing read.
struct FwdPageRun {
  int page = 0, slot = 0;
};

template <typename Tr>
__device__ __forceinline__ FwdPageRun fwd_page_run(const AttentionParams& p, int64_t b, int tile, int lane) {
  constexpr int kBN = Tr::kBlockN;
  FwdPageRun r;
  if (!p.block_table) return r;
  const int ps = static_cast<int>(p.page_size), box = ps < kBN ? ps : kBN;
  if (lane < kBN / box) {
    const int64_t j = int64_t{tile} * kBN + lane * box, lp = j / ps;
    if (lp < p.table_bs) {
      const int64_t e = p.block_table[b * p.table_bs + lp];
      r.page = static_cast<int>(e < 0 ? 0 : e >= p.num_pages ? p.num_pages - 1 : e);
      r.slot = static_cast<int>(j - lp * ps);
    }
  }
  return r;
}

// A K or V tile of kBlockN rows from the key tile `tile` into dst (kPanels boxes of 64 columns)
// through map, completing on the mbarrier at bar (which expects the tile's bytes): one box a panel
// (lane 0), or for a paged cache (the KV-cache form; map: (D, page_size, Hkv, num_pages)) a box a
// page run, lane r issuing run r (its FwdPageRun). The paged page size divides kBlockN or is a
// multiple of it (hopper_fwd_pages), so a box never crosses a page. (The one-item kernel's K tiles
// of every form and the KV-cache form's V tiles come through here.)
template <typename Tr>
__device__ __forceinline__ void fwd_load_kv_tile(const CUtensorMap* map, unsigned char* dst,
                                                 const AttentionParams& p, int tile, int row0, int hk, int tb,
                                                 uint32_t bar, FwdPageRun run, int lane) {
  constexpr int kBN = Tr::kBlockN;
  if (!Tr::kKvCache || !p.block_table) {
    if (lane == 0) {
#pragma unroll
      for (int pn = 0; pn < Tr::kPanels; ++pn) {
        cuda::tma_load_4d(cuda::smem_addr(dst + pn * Tr::kKVPanelBytes), map, pn * 64, row0 + tile * kBN, hk,
                          tb, bar);
      }
    }
    return;
  }
  const int ps = static_cast<int>(p.page_size), box = ps < kBN ? ps : kBN;
  if (lane < kBN / box) {
#pragma unroll
    for (int pn = 0; pn < Tr::kPanels; ++pn) {
      cuda::tma_load_4d(cuda::smem_addr(dst + pn * Tr::kKVPanelBytes + lane * box * 128), map, pn * 64,
                        run.slot, hk, run.page, bar);
    }
  }
}

// Whether the V tile `tile` needs its rows past the sequence's keys zeroed: with per-sequence key
// counts (a preallocated or paged cache), the rows past a count may hold anything (NaN, Inf), which
// P = 0 would not cancel in P V (the S of those rows is masked; K needs nothing).
template <typename Tr>
__device__ __forceinline__ bool fwd_v_tile_ragged(const AttentionParams& p, const AttentionPattern& pat,
                                                  int tile) {
  // (a contiguous cache's rows past its end come in as zeros: only the rows before it count)
  const int64_t end = int64_t{tile + 1} * Tr::kBlockN;
  return pat.kv_lens != nullptr && (p.block_table ? end : min(end, p.pattern.sk)) > pat.sk;
}

// The V tile `tile` into the stage of pipeline state w (producer warp, all lanes): a tile that
// fwd_v_tile_ragged says needs it lands on the producer's own barrier (v_own, its phase own_phase,
// flipped here), has its rows from the sequence's count on zeroed (whole 128-byte rows of every
// panel: the 128-byte swizzle permutes 16-byte chunks within a row), made visible to the async proxy
// (the consumers' wgmma) and only then released to the consumers (an arrival without bytes); other
// tiles complete on the stage's full barrier as they land. Lane 0 has acquired the stage.
template <typename Tr>
__device__ __forceinline__ void fwd_load_v_tile(const FwdSmem<Tr>& sm, const CUtensorMap* map,
                                                unsigned char* dst, const AttentionParams& p,
                                                const AttentionPattern& pat, int tile, int row0, int hk,
                                                int tb, FwdPageRun run,
                                                const cuda::PipelineState<Tr::kStages>& w,
                                                uint32_t& own_phase, int lane) {
  constexpr int kBN = Tr::kBlockN;
  if (!fwd_v_tile_ragged<Tr>(p, pat, tile)) {
    if (lane == 0) sm.pv.producer_commit(w, Tr::kKVBytes);
    __syncwarp();
    fwd_load_kv_tile<Tr>(map, dst, p, tile, row0, hk, tb, cuda::smem_addr(&sm.pv.full[w.index]), run, lane);
    return;
  }
  const uint32_t own = cuda::smem_addr(sm.v_own);
  if (lane == 0) cuda::mbar_arrive_expect_tx(own, Tr::kKVBytes);
  __syncwarp();
  fwd_load_kv_tile<Tr>(map, dst, p, tile, row0, hk, tb, own, run, lane);
  cuda::mbar_wait(own, own_phase);
  own_phase ^= 1u;
  const int keep =
      static_cast<int>(pat.sk - int64_t{tile} * kBN);  // (rows [keep, kBN) are zeroed; keep >= 1)
  const int chunks = (kBN - keep) * 8;                 // 16-byte chunks a panel
  for (int idx = lane; idx < Tr::kPanels * chunks; idx += 32) {
    const int pn = idx / chunks, c = idx % chunks;
    *reinterpret_cast<int4*>(dst + pn * Tr::kKVPanelBytes + keep * 128 + c * 16) = make_int4(0, 0, 0, 0);
  }
  cuda::fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) sm.pv.producer_arrive(w);
}

// A consumer warpgroup's part of one work item (its 64 query rows, the warp's first at row0): the
// K and V stages of the item's key tiles from rk / rv on, to the K stage with no tile that ends it;
// o, m_run, l_run (zeroed / -inf by the caller) hold the item's output and softmax state after it.
// Persistent: the end stage is handed back by each warp, and the Q tile once the item's S products
// are done (before its last P V product: the next item's Q loads meanwhile), the turns balanced
// there. One item a block: the turns balanced at the end.
template <typename Tr, typename T>
__device__ __forceinline__ void fwd_consumer_item(const FwdSmem<Tr>& sm, const AttentionCudaArgs& a,
                                                  const AttentionPattern& pat, int64_t b, int64_t h,
                                                  int64_t row0, int half, int next, int t,
                                                  cuda::PipelineState<Tr::kStages>& rk,
                                                  cuda::PipelineState<Tr::kStages>& rv,
                                                  float (&o)[Tr::kD / 8][4], float (&m_run)[2],
                                                  float (&l_run)[2], bool raw_scores, float k) {
  constexpr int kD = Tr::kD, kBN = Tr::kBlockN;
  constexpr int kNT = kBN / 8;
  constexpr bool kWarpRelease = Tr::kStageMask || Tr::kPersistent;  // (each warp reads a stage's info, bits)
  using State = cuda::PipelineState<Tr::kStages>;
  const int warp = t / 32, lane = t % 32;
  unsigned char* const sKV = sm.kv;
  const uint32_t* const smask = sm.mask;
  const int4* const info = sm.info;
  const cuda::Pipeline<Tr::kStages>& pk = sm.pk;
  const cuda::Pipeline<Tr::kStages>& pv = sm.pv;
  const unsigned char* q_rows = sm.q + half * 64 * 128;
  uint32_t pa[kBN / 16][4];  // the previous tile's P, the A operand of its P V product
  const auto item_end = [&]() {
    if (Tr::kPingPong && half == 0) cuda::named_barrier_sync<256>(kFwdBarTurn);
    if (lane == 0) {
      pk.consumer_release(rk);
      cuda::mbar_arrive(cuda::smem_addr(sm.q_empty));
    }
  };
  // S = Q K^T of the tile in K stage rk (its index and class in ti), issued in this warpgroup's turn.
  const auto issue_s = [&](float(&sc)[kNT][4], const State& st) {
    // (the descriptors: one encoding each, then an add a step; at D 256 ptxas hoists Q's sixteen,
    // loop-invariant, out of the loop and spills: there they are encoded from the pointer each time)
    const uint64_t k_desc = cuda::smem_desc_k_major(sKV + st.index * Tr::kStageBytes);
    const uint64_t q_desc = cuda::smem_desc_k_major(q_rows);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {  // 16 deep = 32 bytes along the swizzled 128-byte rows
      const int pn = kk / 4, off = (kk % 4) * 32;
      const uint64_t qd = kD <= 128 ? cuda::desc_advance(q_desc, pn * Tr::kQPanelBytes + off)
                                    : cuda::smem_desc_k_major(q_rows + pn * Tr::kQPanelBytes + off);
      cuda::Wgmma<T, kBN>::template mma<0>(&sc[0][0], qd,
                                           cuda::desc_advance(k_desc, pn * Tr::kKVPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
  };
  // O += P V for the tile in V stage st.
  const auto issue_pv = [&](const State& st) {
    const uint64_t v_desc =
        cuda::smem_desc_mn_major(sKV + st.index * Tr::kStageBytes + Tr::kKVBytes, Tr::kKVPanelBytes);
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
  const auto scores_done = [&](float(&sc)[kNT][4], const State& st) {
    cuda::fence_operands(sc);
    if (kWarpRelease ? lane == 0 : t == 0) pk.consumer_release(st);
    if (!raw_scores) scores_log2(sc, a);
  };
  const auto softmax_tile = [&](float(&sc)[kNT][4], const State& st, float(&corr)[2]) {
    scores_done(sc, st);
    softmax_step(sc, m_run, l_run, corr, k);
  };
  const auto softmax_tile_masked = [&](float(&sc)[kNT][4], const State& st, int tile, const TileClass& tc,
                                       const uint32_t(&mask_rows)[2], float(&corr)[2]) {
    scores_done(sc, st);
    mask_tile<false, kBN>(sc, pat, tc, b, h, row0, int64_t{tile} * kBN, lane, mask_rows);
    softmax_step(sc, m_run, l_run, corr, k);
  };
  // The block-mask form's: a partial tile's visibility sets of the thread's two rows (band, segments,
  // block mask: its bits from the stage where the producer staged them, else from global memory);
  // then the softmax of a tile so masked.
  const auto tile_visibility = [&](const int4& ti, const TileClass& tc, const State& st, uint32_t(&vis)[2]) {
    uint32_t mask_rows[2] = {0u, 0u};
    if (tc.mask) {
      if (ti.z) {
        mask_rows_staged<kBN>(
            smask + st.index * Tr::kMaskWords + (half * 64 + warp * 16 + lane / 4) * (kBN / 32), kBN / 32,
            lane % 4, mask_rows);
      } else {
        mask_rows_ahead<kBN>(pat, b, h, row0, int64_t{ti.x} * kBN, lane, mask_rows);
      }
    }
    mask_tile_bits<false, kBN>(vis, pat, tc, b, h, row0, int64_t{ti.x} * kBN, lane, mask_rows);
  };
  const auto softmax_tile_visible = [&](float(&sc)[kNT][4], const State& st, const uint32_t(&vis)[2],
                                        float(&corr)[2]) {
    scores_done(sc, st);
    apply_visibility(sc, vis);
    softmax_step(sc, m_run, l_run, corr, k);
  };
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
      if (ti.x < 0) {
        if constexpr (Tr::kPersistent) item_end();
        break;
      }
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
    if constexpr (Tr::kPersistent) {
      if (t == 0) pv.consumer_release(rv);
      rv.advance();
    }
  } else if constexpr (Tr::kPersistent) {
    item_end();
  }
  if constexpr (Tr::kPersistent) {
    rk.advance();  // (past the item's end stage)
  } else if (Tr::kPingPong && half == 0) {
    cuda::named_barrier_sync<256>(kFwdBarTurn);  // the last warpgroup's last hand-over (balanced)
  }
}

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_fwd_hopper_kernel(const __grid_constant__ CUtensorMap map_q,
                                const __grid_constant__ CUtensorMap map_k,
                                const __grid_constant__ CUtensorMap map_v, const AttentionCudaArgs a,
                                const int group_pairs) {
#ifdef OPFORGE_ATTENTION_WGMMA_DEVICE
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kDT = kD / 8;
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
  // The block's (batch row, head, query block). Without varlen the blocks go in groups of
  // group_pairs (batch row, head) pairs, each group's query blocks last to first across its pairs
  // (with causal, the most keys first: the longest blocks of a group start first and the last
  // blocks to start are short); varlen: the padded tiles of the packed queries last to first, a
  // head each grid row. (FwdSchedule::decode orders the persistent kernel's items the same way; as
  // this kernel's parameter it made the D256 and block-mask forms' producers spill: session 6.)
  int64_t b, h, qb;
  if (group_pairs > 0) {
    const int blocks = static_cast<int>((p.pattern.sq + kBM - 1) / kBM);
    int pair, w;
    cuda::grouped_tile(static_cast<int>(blockIdx.x), group_pairs, static_cast<int>(p.batch * p.heads), blocks,
                       false, pair, w);
    b = pair / p.heads, h = pair % p.heads, qb = blocks - 1 - w;
  } else {
    h = blockIdx.y;
    if (!padded_tile_warp(p.pattern.cu_seqlens_q, p.pattern.total_q, p.batch, kBM, gridDim.x - 1 - blockIdx.x,
                          b, qb)) {
      return;
    }
  }
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
        cuda::tma_load_4d(smem_addr(sQ + pn * Tr::kQPanelBytes), &map_q, pn * 64,
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
    uint32_t own_phase = 0;  // (kKvCache: fwd_load_v_tile's barrier)
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
        fwd_load_v_tile<Tr>(sm, &map_v, sK + Tr::kKVBytes, p, pat, tile, k_row0, hk, tb, run, w, own_phase,
                            lane);
      } else if (lane == 0) {
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
  store_accumulator_rows<kD, T>(o, inv, sQ + half * 64 * 128, Tr::kQPanelBytes,
                                static_cast<T*>(p.out) + p.o_at(b, h), p.o_ss, i0 + half * 64, pat.sq, t,
                                1 + half);
#else
  __trap();
#endif
}

// The work items of a persistent launch, in the one-item grid's order of its blocks: without varlen,
// groups of group_pairs (batch row, head) pairs, each group's query blocks last to first across its
// pairs; varlen, a head at a time, the padded tiles of the packed queries last to first (a padding
// tile is an item with nothing to do). Block x takes item x first, then the next from a zeroed
// counter: items go to whichever block is free.
struct FwdSchedule {
  int64_t total = 0, blocks = 0;  // items; query blocks a pair (varlen: padded tiles a head)
  int group_pairs = 1;            // (without varlen) pairs a group
  int* counter = nullptr;         // a zeroed int
  // Segment ids as documents (hopper_fwd_runs), or null: launch_segment_runs' output (valid
  // flag, run count R, R + 1 offsets into the batch x run_rows rows). Where valid the items are, a
  // head at a time, the runs' padded tiles last to first (as varlen's sequences), else the above.
  const int32_t* runs = nullptr;
  int64_t run_rows = 0;  // (the sequence length: a batch row's rows)

  // Item `item`'s batch row, head and query block of `rows` queries, and with runs (run_count >= 0
  // runs) the run's first row in the batch row and its rows (else 0, 0); false: a padding tile.
  // Every lane of the calling warp asks about the same item (the varlen search is warp-wide).
  __device__ __forceinline__ bool decode(const AttentionParams& p, int item, int rows, int run_count,
                                         int64_t& b, int64_t& h, int64_t& qb, int64_t& first,
                                         int64_t& len) const {
    first = 0, len = 0;
    if (run_count >= 0 || p.pattern.varlen()) {  // (varlen's sequences or the runs, a head at a time)
      const int64_t n = run_count >= 0 ? run_blocks(p, run_count, rows) : blocks;
      const int32_t* cu = run_count >= 0 ? runs + 2 : p.pattern.cu_seqlens_q;
      h = item / n;
      if (!padded_tile_warp(cu, run_count >= 0 ? p.batch * run_rows : p.pattern.total_q,
                            run_count >= 0 ? run_count : p.batch, rows, n - 1 - item % n, b, qb)) {
        return false;
      }
      if (run_count >= 0) {
        const int64_t start = cu[b];
        first = start % run_rows, len = cu[b + 1] - start, b = start / run_rows;
      }
      return true;
    }
    int pair, w;
    cuda::grouped_tile(item, group_pairs, static_cast<int>(p.batch * p.heads), static_cast<int>(blocks),
                       false, pair, w);
    b = pair / p.heads, h = pair % p.heads, qb = blocks - 1 - w;
    return true;
  }
  // The runs' padded tiles a head (fit an int: hopper_fwd_runs' check).
  __device__ __forceinline__ int run_blocks(const AttentionParams& p, int run_count, int rows) const {
    return static_cast<int>(padded_rows(p.batch * run_rows, run_count, rows) / rows);
  }
  // The runs' count where the device found segment ids to be runs, else -1 (read again at each item,
  // from L1: held in registers across an item the walk's state spills).
  __device__ __forceinline__ int run_count() const {
    return runs != nullptr && __ldg(runs) ? __ldg(runs + 1) : -1;
  }
};

// Item b's pattern: batch row (sequence) b's, or with runs (len: the run's rows) the call's band on
// the run's rows alone: its own queries and keys (Sq = Sk = len), no segments.
__device__ __forceinline__ AttentionPattern item_pattern(const AttentionPattern& pattern, int64_t b, bool run,
                                                         int64_t len) {
  AttentionPattern pat = pattern.at(b);
  if (run) {
    pat.sq = pat.sk = len;
    pat.q_segments = pat.kv_segments = nullptr;
    pat.q_seg_blocks = pat.kv_seg_blocks = nullptr;
  }
  return pat;
}

// The persistent form (Tr::kPersistent): a block a multiprocessor, walking FwdSchedule's items. The
// producer finds an item's first key tile (a round of loads) before it waits for the last item's S
// products to free the Q tile, then issues Q (the item written beside it for the consumers) and the
// first K / V at once; the counter's next value is fetched as an item begins and used at its end.
// The consumers run each item as the one-item kernel does (fwd_consumer_item) and stage the output
// in its own tile. kRuns: segment ids as documents where the device found them runs (items: the
// runs' padded tiles, each a dense item of its rows; FwdSchedule::runs), else the items above.
template <typename Tr, typename T, bool kRuns>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_fwd_hopper_persistent_kernel(const __grid_constant__ CUtensorMap map_q,
                                           const __grid_constant__ CUtensorMap map_k,
                                           const __grid_constant__ CUtensorMap map_v,
                                           const AttentionCudaArgs a, const FwdSchedule sched) {
#ifdef OPFORGE_ATTENTION_WGMMA_DEVICE
  static_assert(Tr::kPersistent, "the persistent form's traits");
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDT = kD / 8;
  using cuda::smem_addr;
  using State = cuda::PipelineState<Tr::kStages>;
  extern __shared__ unsigned char smem_raw[];
  const FwdSmem<Tr> sm(cuda::align_shared<1024>(smem_raw));
  const AttentionParams& p = a.g.fwd;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(sm.q_full), 1);
    cuda::mbar_init(smem_addr(sm.q_empty), 4 * Tr::kConsumers);
    sm.pk.init(4 * Tr::kConsumers);  // (each consumer warp reads a stage's info, so each hands it back)
    sm.pv.init(Tr::kConsumers);
    cuda::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    cuda::setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp != 0) return;
    State wk, wv;     // the K ring (tiles and each item's end) and the V ring (tiles)
    int n = 0;        // items begun
    int pending = 0;  // (lane 0) the counter's value for the item after this one
    // (Segment ids as documents where the device found them runs: the items from their count.)
    const auto total = [&]() {
      const int runs = kRuns ? sched.run_count() : -1;
      return runs >= 0 ? sched.run_blocks(p, runs, kBM) * static_cast<int>(p.heads)
                       : static_cast<int>(sched.total);
    };
    for (int item = blockIdx.x; item < total();) {
      if (lane == 0) pending = atomicAdd(sched.counter, 1);
      int64_t b, h, qb, first, len;  // (a run's first row in the batch row, its rows)
      const int runs = kRuns ? sched.run_count() : -1;
      if (sched.decode(p, item, kBM, runs, b, h, qb, first, len)) {
        const AttentionPattern pat = item_pattern(p.pattern, b, runs >= 0, len);
        const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
        KeyWalk<kBN, kD, 32, T, false> walk(p, pat, b, h, i0, i1);
        const int hk = static_cast<int>(h / (p.heads / p.kv_heads));
        // TMA coordinates: the tensors' batch row, the sequence's first rows (varlen: in the packed dims).
        const int tb = static_cast<int>(p.pattern.tensor_batch(b));
        const int q_row0 = static_cast<int>(p.pattern.q_start(b) + first);
        const int k_row0 = static_cast<int>(p.pattern.k_start(b) + first);
        TileClass tc;
        int tile = walk.next(walk.begin, tc, lane);
        if (lane == 0) {
          if (n > 0)
            cuda::mbar_wait(smem_addr(sm.q_empty), (n - 1) & 1);  // the last item's S products are done
          sm.q_info[0] = make_int4(static_cast<int>(b), static_cast<int>(h), static_cast<int>(qb), 1);
          sm.q_info[1] = make_int4(static_cast<int>(first), static_cast<int>(len), runs >= 0, 0);
          cuda::mbar_arrive_expect_tx(smem_addr(sm.q_full), Tr::kQBytes);
#pragma unroll
          for (int pn = 0; pn < Tr::kPanels; ++pn) {
            cuda::tma_load_4d(smem_addr(sm.q + pn * Tr::kQPanelBytes), &map_q, pn * 64,
                              q_row0 + static_cast<int>(i0), static_cast<int>(h), tb, smem_addr(sm.q_full));
          }
        }
        ++n;
        for (; tile < walk.end; tile = walk.next(tile + 1, tc, lane), wk.advance(), wv.advance()) {
          if (lane == 0) {
            unsigned char* const sK = sm.kv + wk.index * Tr::kStageBytes;
            sm.pk.producer_acquire(wk);
            sm.info[wk.index] = make_int4(tile, tile_class_bits(tc), 0, 0);
            const uint32_t kbar = sm.pk.producer_commit(wk, Tr::kKVBytes);
#pragma unroll
            for (int pn = 0; pn < Tr::kPanels; ++pn) {
              cuda::tma_load_4d(smem_addr(sK + pn * Tr::kKVPanelBytes), &map_k, pn * 64, k_row0 + tile * kBN,
                                hk, tb, kbar);
            }
            unsigned char* const sV = sm.kv + wv.index * Tr::kStageBytes + Tr::kKVBytes;
            sm.pv.producer_acquire(wv);
            const uint32_t vbar = sm.pv.producer_commit(wv, Tr::kKVBytes);
#pragma unroll
            for (int pn = 0; pn < Tr::kPanels; ++pn) {
              cuda::tma_load_4d(smem_addr(sV + pn * Tr::kKVPanelBytes), &map_v, pn * 64, k_row0 + tile * kBN,
                                hk, tb, vbar);
            }
          }
          __syncwarp();
        }
        if (lane == 0) {  // the item's end: a K stage with no tile (an arrival without bytes)
          sm.pk.producer_acquire(wk);
          sm.info[wk.index] = make_int4(-1, 0, 0, 0);
          cuda::mbar_arrive(smem_addr(&sm.pk.full[wk.index]));
        }
        wk.advance();
        __syncwarp();
      }
      item = static_cast<int>(gridDim.x) + __shfl_sync(0xffffffffu, pending, 0);
    }
    if (lane == 0) {  // no more items: a Q arrival without bytes, not live
      if (n > 0) cuda::mbar_wait(smem_addr(sm.q_empty), (n - 1) & 1);
      *sm.q_info = make_int4(0, 0, 0, 0);
      cuda::mbar_arrive(smem_addr(sm.q_full));
    }
    return;
  }

  // consumers: warpgroup 1 takes query rows 0-63 of an item, warpgroup 2 rows 64-127
  cuda::setmaxnreg_inc<Tr::kConsumerRegs>();
  const int half = __shfl_sync(0xffffffffu, wg, 0) - 1, next = (half + 1) % Tr::kConsumers;
  const bool raw_scores = a.cap_log2 == 0.f && a.scale_log2 > 0.f;  // (as the one-item kernel's)
  const float k = raw_scores ? a.scale_log2 : 1.f;
  State rk, rv;
  for (int n = 0;; ++n) {
    cuda::mbar_wait(smem_addr(sm.q_full), n & 1);      // (its acquire orders the item's read after the write)
    const int4 qi = sm.q_info[0], run = sm.q_info[1];  // (run: first row, rows, is a run)
    if (!qi.w) break;
    const int64_t b = qi.x, h = qi.y, i0 = int64_t{qi.z} * kBM, first = run.x;
    const AttentionPattern pat = item_pattern(p.pattern, b, kRuns && run.z, run.y);
    const int64_t row0 = i0 + half * 64 + warp * 16;  // this warp's first query row
    float o[kDT][4];
#pragma unroll
    for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.f, 0.f};
    if (Tr::kPingPong && half == Tr::kConsumers - 1)
      cuda::named_barrier_arrive<256>(kFwdBarTurn);  // warpgroup 1 issues first
    fwd_consumer_item<Tr, T>(sm, a, pat, b, h, row0, half, next, t, rk, rv, o, m_run, l_run, raw_scores, k);
    // Epilogue: as the one-item kernel's, through the output's staging once the warpgroup's reads
    // of it (the item before) are done.
    float inv[2];
    // (a run's rows from its first row on)
    finish_rows(m_run, l_run, inv, p, first + pat.sq, b, h, first + row0, lane, k);
    cuda::named_barrier_sync<128>(1 + half);
    store_accumulator_rows<kD, T>(o, inv, sm.o + half * 64 * 128, Tr::kQPanelBytes,
                                  static_cast<T*>(p.out) + p.o_at(b, h) + first * p.o_ss, p.o_ss,
                                  i0 + half * 64, pat.sq, t, 1 + half);
  }
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

// (batch row, head) pairs a group of the dense forward's order: where blocks see different numbers
// of keys (a band), as many as have their K and V (shared by a GQA group's heads) within about a
// third of the H100 / H200's 50 MB L2, so that each group's longest blocks start first; else one (the
// longest-first order gains nothing and more pairs at once would share L2 among more K and V).
template <typename Tr>
int fwd_group_pairs(const AttentionParams& p) {
  const AttentionPattern& pat = p.pattern;
  const int64_t pairs = p.batch * p.heads;
  const int64_t pair_bytes = pat.sk * Tr::kD * 4 / std::max<int64_t>(p.heads / p.kv_heads, 1);
  const int64_t fit = pat.has_band() ? (int64_t{16} << 20) / std::max<int64_t>(pair_bytes, 1) : 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pairs, fit)));
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
    group_pairs = fwd_group_pairs<Tr>(p);
    grid = dim3(static_cast<unsigned>(pairs * blocks));
  }
  attention_fwd_hopper_kernel<Tr, T>
      <<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, a, group_pairs);
  return cudaGetLastError();
}

// kRuns: the form that reads segment ids' runs (a.seg_runs, written by launch_segment_runs first; its
// walk's state spills a little at item boundaries), else without that code.
template <typename Tr, typename T, bool kRuns>
cudaError_t launch_hopper_fwd_persistent(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  cudaError_t err =
      prepare_hopper(attention_fwd_hopper_persistent_kernel<Tr, T, kRuns>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  if (a.fwd_counter == nullptr) return cudaErrorInvalidValue;
  CUtensorMap mq, mk, mv;
  if (!make_attention_maps(a, Tr::kD, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv)) return cudaErrorInvalidValue;
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  FwdSchedule sched;
  sched.counter = a.fwd_counter;
  sched.runs = a.seg_runs;
  sched.run_rows = pat.sq;
  if (pat.varlen()) {  // (the padded tiles of the packed queries, a head at a time)
    int64_t x, z;
    tile_grid(p, false, Tr::kBlockM, x, z);
    sched.blocks = x, sched.total = x * p.heads;
  } else {
    sched.blocks = (pat.sq + Tr::kBlockM - 1) / Tr::kBlockM, sched.total = p.batch * p.heads * sched.blocks;
    sched.group_pairs = fwd_group_pairs<Tr>(p);
  }
  // (items and the counter's values, up to items + blocks, in an int)
  if (sched.total > 0x7fffffff - (1 << 20)) return cudaErrorInvalidValue;
  if (sched.total == 0) return cudaSuccess;
  static int per_sm[64] = {};
  unsigned int blocks = 0;
  const auto kernel = attention_fwd_hopper_persistent_kernel<Tr, T, kRuns>;
  // (with runs the device's items may outnumber the host's count: a grid of their most, if fewer
  // than the GPU holds)
  const int64_t items =
      kRuns ? std::max(sched.total, hopper_fwd_run_items(p.batch, pat.sq, p.heads)) : sched.total;
  err = cuda::resident_grid(kernel, Tr::kThreads, Tr::kSmemBytes, items, a.num_sms, per_sm, blocks);
  if (err != cudaSuccess) return err;
  kernel<<<blocks, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, a, sched);
  return cudaGetLastError();
}

// The forward of traits Tr (its persistent form where Tr::kPersistent; kRuns: the segment runs'
// form, which first scans the segment ids into a.seg_runs) at the call's dtype.
template <typename Tr, bool kRuns = false>
int run_hopper_fwd(const AttentionCudaArgs& a, void* stream) {
  static_assert(Tr::kPersistent || !kRuns, "segment runs are the persistent form's");
  const auto s = static_cast<cudaStream_t>(stream);
  const DType dtype = a.g.fwd.dtype;
  if constexpr (Tr::kPersistent) {
    if constexpr (kRuns) {
      const cudaError_t err = launch_segment_runs(a.g.fwd, a.seg_runs, s);
      if (err != cudaSuccess) return err;
    }
    if (dtype == DType::kBFloat16) return launch_hopper_fwd_persistent<Tr, __nv_bfloat16, kRuns>(a, s);
    if (dtype == DType::kFloat16) return launch_hopper_fwd_persistent<Tr, __half, kRuns>(a, s);
  } else {
    if (dtype == DType::kBFloat16) return launch_hopper_fwd<Tr, __nv_bfloat16>(a, s);
    if (dtype == DType::kFloat16) return launch_hopper_fwd<Tr, __half>(a, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attention_cuda
}  // namespace opforge
