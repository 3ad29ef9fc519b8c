// attention CUDA forward for Hopper: a consumer warpgroup's part of a work item (S, the online
// softmax, P V, the stages handed back), for the one-item and the persistent kernels.
#pragma once

#include "attention/cuda/attention_fwd_hopper_producer.cuh"

namespace opforge {
namespace attention_cuda {

// A consumer warpgroup's part of one work item (its 64 query rows, the warp's first at row0): the
// K and V stages of the item's key tiles from rk / rv on, to the K stage with no tile that ends it;
// o, m_run, l_run (zeroed / -inf by the caller) hold the item's output and softmax state after it.
// Persistent: the end stage is handed back by each warp, and the Q tile once the item's S products
// are done (before its last P V product: the next item's Q loads meanwhile), the turns balanced
// there. One item a block: the turns balanced at the end. (FP8: descale_qk, q's and k's descale
// factors' product, multiplies the raw scores: the caller has folded it into k where k applies.)
template <typename Tr, typename T>
__device__ __forceinline__ void fwd_consumer_item(
    const FwdSmem<Tr>& sm, const AttentionCudaArgs& a, const AttentionPattern& pat, int64_t b, int64_t h,
    int64_t row0, int half, int next, int t, cuda::PipelineState<Tr::kStages>& rk,
    cuda::PipelineState<Tr::kStages>& rv, float (&o)[Tr::kDV / 8][4], float (&m_run)[2], float (&l_run)[2],
    bool raw_scores, float k, float descale_qk = 1.f) {
  constexpr int kD = Tr::kD, kDV = Tr::kDV, kBN = Tr::kBlockN;
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
  uint32_t pa[kBN / Tr::kK][4];  // the previous tile's P, the A operand of its P V product
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
    for (int kk = 0; kk < kD / Tr::kK; ++kk) {  // kK deep = 32 bytes along the swizzled 128-byte rows
      const int pn = kk / 4, off = (kk % 4) * 32;
      const uint64_t qd = kD <= 128 ? cuda::desc_advance(q_desc, pn * Tr::kQPanelBytes + off)
                                    : cuda::smem_desc_k_major(q_rows + pn * Tr::kQPanelBytes + off);
      cuda::Wgmma<T, kBN>::template mma<0>(&sc[0][0], qd,
                                           cuda::desc_advance(k_desc, pn * Tr::kKVPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
  };
  // O += P V for the tile in V stage st (V after K in the stage: kPanelsV panels of kBlockN rows;
  // FP8: V transposed, K-major, kPanelsV panels of kDV rows of 128 keys, in P's key order).
  const auto issue_pv = [&](const State& st) {
    unsigned char* const sV = sKV + st.index * Tr::kStageBytes + Tr::kKVBytes;
    if constexpr (Tr::kFp8) {
      const uint64_t v_desc = cuda::smem_desc_k_major(sV);
#pragma unroll
      for (int kk = 0; kk < kBN / Tr::kK; ++kk) {  // 32 keys = 32 bytes along the rows
        cuda::WgmmaRS<T, kDV>::mma(
            &o[0][0], pa[kk], cuda::desc_advance(v_desc, (kk / 4) * Tr::kVPanelBytes + (kk % 4) * 32), 1);
      }
    } else {
      const uint64_t v_desc = cuda::smem_desc_mn_major(sV, Tr::kKVPanelBytes);
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {  // 16 keys = 16 rows of 128 bytes
        cuda::WgmmaRS<T, kDV>::template mma<1>(&o[0][0], pa[kk], cuda::desc_advance(v_desc, kk * 2048), 1);
      }
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
    if (!raw_scores) {
      if constexpr (Tr::kFp8) {
#pragma unroll
        for (int n = 0; n < kNT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[n][e] *= descale_qk;
      }
      scores_log2(sc, a);
    }
  };
  const auto softmax_tile = [&](float(&sc)[kNT][4], const State& st, float(&corr)[2]) {
    scores_done(sc, st);
    softmax_step<Tr::kPOffset>(sc, m_run, l_run, corr, k);
  };
  const auto softmax_tile_masked = [&](float(&sc)[kNT][4], const State& st, int tile, const TileClass& tc,
                                       const uint32_t(&mask_rows)[2], float(&corr)[2]) {
    scores_done(sc, st);
    mask_tile<false, kBN>(sc, pat, tc, b, h, row0, int64_t{tile} * kBN, lane, mask_rows);
    softmax_step<Tr::kPOffset>(sc, m_run, l_run, corr, k);
  };
  // The block-mask form's: a partial tile's visibility sets of the thread's two rows (band, segments,
  // block mask: its bits from the stage where the producer staged them, else from global memory);
  // then the softmax of a tile so masked.
  // (compiled for the block-mask form only: its staged bits' code takes key tiles of 64 or 128)
  const auto tile_visibility = [&](const int4& ti, const TileClass& tc, const State& st, uint32_t(&vis)[2]) {
    if constexpr (Tr::kStageMask) {
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
    }
  };
  const auto softmax_tile_visible = [&](float(&sc)[kNT][4], const State& st, const uint32_t(&vis)[2],
                                        float(&corr)[2]) {
    scores_done(sc, st);
    apply_visibility(sc, vis);
    softmax_step<Tr::kPOffset>(sc, m_run, l_run, corr, k);
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
      for (int kk = 0; kk < kBN / Tr::kK; ++kk) acc_to_a<T>(pa[kk], sc, kk);
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
      for (int kk = 0; kk < kBN / Tr::kK; ++kk) acc_to_a<T>(pa[kk], sc, kk);
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

}  // namespace attention_cuda
}  // namespace opforge
