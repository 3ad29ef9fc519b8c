// attention CUDA backward for Hopper: a consumer warpgroup's work over the block's stages, in either
// layout (HopperBwdTraits::kSplitHeadDim), then its dK and dV epilogue.
#pragma once

#include "attention/cuda/attention_bwd_hopper_traits.cuh"

namespace opforge {
namespace attention_cuda {

// Head-dim layout (head dim 256): S = Q K^T and dP = dO V^T over this warpgroup's 32 keys (queries as
// rows), P and dS through shared memory, then dV += P^T dO, dK += dS^T Q and dQ = dS K over this
// warpgroup's 128 head-dim columns. half: the consumer warpgroup (0, 1); t: its thread.
template <typename Tr, typename T>
__device__ __forceinline__ void bwd_consume_head_dim(const BwdSmem<Tr>& sm, const AttentionCudaArgs& a,
                                                     const AttentionPattern& pat, int64_t b, int64_t hk,
                                                     int64_t j0, int half, int t) {
  constexpr int kD = Tr::kD;
  constexpr int kBN = Tr::kBlockN;
  constexpr int kBM = Tr::kBlockM;
  constexpr int kInfoOffset = BwdSmem<Tr>::kInfoOffset;
  constexpr int kMaskOffset = BwdSmem<Tr>::kMaskOffset;
  using cuda::smem_addr;
  using State = cuda::PipelineState<Tr::kStages>;
  unsigned char* const sK = sm.k;
  unsigned char* const sV = sm.v;
  unsigned char* const sStages = sm.stages;
  unsigned char* const sDS = sm.ds;
  unsigned char* const sP = sm.p;
  unsigned char* const sDQ = sm.dq;
  unsigned char* const sStats = sm.stats;
  BwdTileInfo* const dq_info = sm.dq_info;
  uint64_t* const bar_kv = sm.kv_full;
  const cuda::Pipeline<Tr::kStages>& pipe = sm.pipe;
  const int warp = t / 32, lane = t % 32, g = lane / 4, t4 = lane % 4;
  // Head-dim layout: S = Q K^T and dP = dO V^T over this warpgroup's 32 keys (queries as rows),
  // P and dS (bf16, 64 queries x 64 keys, both warpgroups' halves) through shared memory, then
  // dV += P^T dO, dK += dS^T Q and dQ = dS K over this warpgroup's 128 head-dim columns.
  constexpr int kCols = kD / 2, kCT = kCols / 8;  // this warpgroup's head-dim columns
  const int64_t row0 = warp * 16;                 // this warp's first query row in a tile
  float dk[kCT][4], dv[kCT][4];
#pragma unroll
  for (int n = 0; n < kCT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  }
  cuda::mbar_wait(smem_addr(bar_kv), 0);
  const uint64_t k_desc = cuda::smem_desc_k_major(sK + half * 32 * 128);  // this warpgroup's 32 keys
  const uint64_t v_desc = cuda::smem_desc_k_major(sV + half * 32 * 128);
  // K as dQ's B (keys deep, this warpgroup's columns wide: two 64-column panels).
  const uint64_t k_mn_desc = cuda::smem_desc_mn_major(sK + 2 * half * Tr::kKPanelBytes, Tr::kKPanelBytes);
  for (State rd;; rd.advance()) {
    const unsigned char* sQ = sStages + rd.index * Tr::kStageBytes;
    const unsigned char* sdO = sQ + Tr::kQBytes;
    const unsigned char* stats = sStats + rd.index * Tr::kStatsBytes;
    const float* lse2s = reinterpret_cast<const float*>(stats);
    const float* deltas = lse2s + kBM;
    unsigned char* const ps = sP + (rd.count & 1) * Tr::kPBytes;
    unsigned char* const ds = sDS + (rd.count & 1) * Tr::kDSBytes;
    pipe.consumer_wait(rd);
    const int4 info = *reinterpret_cast<const int4*>(stats + kInfoOffset);
    const int tile = info.x;
    if (tile < 0) break;
    const int64_t h = info.y;
    const TileClass tc = tile_class_from_bits(info.z);
    const uint64_t q_desc = cuda::smem_desc_k_major(sQ), do_desc = cuda::smem_desc_k_major(sdO);
    float sc[4][4], dp[4][4];  // 16 queries x 32 keys a warp
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int pn = kk / 4, off = (kk % 4) * 32;
      cuda::Wgmma<T, 32>::template mma<0>(&sc[0][0], cuda::desc_advance(q_desc, pn * Tr::kQPanelBytes + off),
                                          cuda::desc_advance(k_desc, pn * Tr::kKPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int pn = kk / 4, off = (kk % 4) * 32;
      cuda::Wgmma<T, 32>::template mma<0>(&dp[0][0], cuda::desc_advance(do_desc, pn * Tr::kQPanelBytes + off),
                                          cuda::desc_advance(v_desc, pn * Tr::kKPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
    // The thread's two query rows' lse2 and delta.
    const float2 l2 = make_float2(lse2s[row0 + g], lse2s[row0 + g + 8]);
    const float2 dl = make_float2(deltas[row0 + g], deltas[row0 + g + 8]);
    cuda::wgmma_wait<1>();  // S (dP still running)
    cuda::fence_operands(sc);
    // log2(P) (element e of fragment n: row g + 8 (e / 2)), masked, then P. (The softcap's forms
    // through a generic lambda each: called directly, the PTX's virtual registers come numbered
    // otherwise and ptxas allocates the deterministic D256 kernel's producer differently, 8
    // instructions fewer; kept identical until measured on a GPU.)
    const auto log2_probs = [&](auto cap_tag) { log2_probs_by_row<decltype(cap_tag)::value>(sc, l2, a); };
    const auto score_grads = [&](auto cap_tag) {
      unscaled_score_grads_by_row<decltype(cap_tag)::value>(sc, dp, l2, dl, a);
    };
    const bool cap = a.cap_log2 != 0.f;
    if (cap) {
      log2_probs(std::true_type{});
    } else {
      log2_probs(std::false_type{});
    }
    uint32_t vis[2] = {~0u, ~0u};  // (every tile masked through its set, as in the keys layout)
    if (tc.kind == BlockKind::kPartial) {
      // The block mask's bits of the thread's two query rows over this warpgroup's 32 keys: from
      // the stage where the producer staged them, else from global memory.
      const uint32_t* words = reinterpret_cast<const uint32_t*>(stats + kMaskOffset);
      uint32_t mask_rows[2] = {0u, 0u};
      if (Tr::kStageMask && info.w)
        mask_rows_staged<32>(words + (row0 + g) * (kBN / 32) + half, kBN / 32, t4, mask_rows);
      mask_tile_bits<false, 32>(vis, pat, tc, b, h, int64_t{tile} * kBM + row0, j0 + half * 32, lane,
                                Tr::kStageMask && info.w ? mask_rows : nullptr);
    }
    apply_visibility(sc, vis);
    probs_from_log2(sc);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(dp);
    if (cap) {
      score_grads(std::true_type{});
    } else {
      score_grads(std::false_type{});
    }
    // P and dS into shared memory: row r (query) = row0 + g + 8 (e / 2), key column
    // 32 half + 8 n + 2 t4 (+ 1), 128-byte rows in the swizzle.
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = static_cast<int>(row0) + g + 8 * r;
        const uint32_t off = row * 128 + cuda::swizzle128_chunk(row, 4 * half + n) * 16 + t4 * 4;
        cuda::st_shared_u32(smem_addr(ps + off), cuda::pack2<T>(sc[n][2 * r], sc[n][2 * r + 1]));
        cuda::st_shared_u32(smem_addr(ds + off), cuda::pack2<T>(dp[n][2 * r], dp[n][2 * r + 1]));
      }
    }
    cuda::fence_proxy_async_shared();  // the stores, before wgmma reads them
    cuda::named_barrier_sync<256>(kBwdBarDS);
    float dq[kCT][4];
    cuda::wgmma_fence();
    const uint64_t ds_desc = cuda::smem_desc_k_major(ds);  // dS: query rows, keys deep
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {  // 16 keys = 32 bytes along dS's rows, 16 rows of K
      cuda::Wgmma<T, kCols>::template mma<1, 0>(&dq[0][0], cuda::desc_advance(ds_desc, kk * 32),
                                                cuda::desc_advance(k_mn_desc, kk * 2048), kk > 0);
    }
    cuda::wgmma_commit();
    cuda::fence_operands(dv);
    // P^T and dS^T as A read MN-major (rows of P: 64 keys wide, 16 queries a step).
    const uint64_t p_mn_desc = cuda::smem_desc_mn_major(ps, Tr::kPBytes);
    const uint64_t ds_mn_desc = cuda::smem_desc_mn_major(ds, Tr::kDSBytes);
    const uint64_t do_mn_desc = cuda::smem_desc_mn_major(sdO + 2 * half * Tr::kQPanelBytes, Tr::kQPanelBytes);
    const uint64_t q_mn_desc = cuda::smem_desc_mn_major(sQ + 2 * half * Tr::kQPanelBytes, Tr::kQPanelBytes);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      cuda::Wgmma<T, kCols>::template mma<1, 1>(&dv[0][0], cuda::desc_advance(p_mn_desc, kk * 2048),
                                                cuda::desc_advance(do_mn_desc, kk * 2048), 1);
    }
    cuda::wgmma_commit();
    cuda::fence_operands(dk);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      cuda::Wgmma<T, kCols>::template mma<1, 1>(&dk[0][0], cuda::desc_advance(ds_mn_desc, kk * 2048),
                                                cuda::desc_advance(q_mn_desc, kk * 2048), 1);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<2>();  // dQ (dV and dK still running)
    cuda::fence_operands(dq);
    if constexpr (Tr::kDQAtomic) {  // this warpgroup's part, in the workspace's register order
      float* const dst = a.dq_accum + dq_tile_offset<Tr>(a, b, h, tile) + half * Tr::kDQPartFloats;
#pragma unroll
      for (int n = 0; n < kCT; ++n)
        cuda::red_add_f32x4(dst + (n * 128 + t) * 4, dq[n][0], dq[n][1], dq[n][2], dq[n][3]);
    } else {
      cuda::named_barrier_sync<160>(kBwdBarDQEmpty + half);
      float4* const dq_part = reinterpret_cast<float4*>(sDQ + half * Tr::kDQPartBytes);
#pragma unroll
      for (int n = 0; n < kCT; ++n)
        dq_part[n * 128 + t] = make_float4(dq[n][0], dq[n][1], dq[n][2], dq[n][3]);
      if (t == 0) dq_info[half] = BwdTileInfo{tile, static_cast<int>(h), 0, 0};
      cuda::fence_proxy_async_shared();  // before the bulk reduction reads them
      cuda::named_barrier_arrive<160>(kBwdBarDQFull + half);
    }
    cuda::wgmma_wait<0>();
    cuda::fence_operands(dv);
    cuda::fence_operands(dk);
    if (t == 0) pipe.consumer_release(rd);
  }
  // Both warpgroups' last dQ products read every row of K: only then may the epilogue stage dK over it.
  cuda::named_barrier_sync<256>(kBwdBarDS);
  if constexpr (!Tr::kDQAtomic) {
    cuda::named_barrier_sync<160>(kBwdBarDQEmpty + half);  // the end, for warp 1
    if (t == 0) dq_info[half] = BwdTileInfo{-1, 0, 0, 0};
    cuda::named_barrier_arrive<160>(kBwdBarDQFull + half);
  }
  // dK and dV: the block's 64 keys, this warpgroup's columns, through its own two panels of the K
  // and V tiles.
  const float one[2] = {1.f, 1.f}, scale[2] = {a.scale, a.scale};  // (dS was left unscaled)
  store_accumulator_rows<kCols, T>(dk, scale, sK + 2 * half * Tr::kKPanelBytes, Tr::kKPanelBytes,
                                   static_cast<T*>(a.g.dk) + a.g.dk_at(b, hk) + half * kCols, a.g.dk_ss, j0,
                                   pat.sk, t, 1 + half);
  store_accumulator_rows<kCols, T>(dv, one, sV + 2 * half * Tr::kKPanelBytes, Tr::kKPanelBytes,
                                   static_cast<T*>(a.g.dv) + a.g.dv_at(b, hk) + half * kCols, a.g.dv_ss, j0,
                                   pat.sk, t, 1 + half);
}

// Keys layout (head dims 64, 128): warpgroup half owns keys 64 half.. of the block (S^T, dP^T with
// keys as rows), dS^T through shared memory for dQ.
template <typename Tr, typename T>
__device__ __forceinline__ void bwd_consume_keys(const BwdSmem<Tr>& sm, const AttentionCudaArgs& a,
                                                 const AttentionPattern& pat, int64_t b, int64_t hk,
                                                 int64_t j0, int half, int t) {
  constexpr int kD = Tr::kD;
  constexpr int kBN = Tr::kBlockN;
  constexpr int kBM = Tr::kBlockM;
  constexpr int kMT = kBM / 8;
  constexpr int kDT = kD / 8;
  constexpr int kInfoOffset = BwdSmem<Tr>::kInfoOffset;
  constexpr int kMaskOffset = BwdSmem<Tr>::kMaskOffset;
  using cuda::smem_addr;
  using State = cuda::PipelineState<Tr::kStages>;
  unsigned char* const sK = sm.k;
  unsigned char* const sV = sm.v;
  unsigned char* const sStages = sm.stages;
  unsigned char* const sDS = sm.ds;
  unsigned char* const sDQ = sm.dq;
  unsigned char* const sStats = sm.stats;
  BwdTileInfo* const dq_info = sm.dq_info;
  uint64_t* const bar_kv = sm.kv_full;
  const cuda::Pipeline<Tr::kStages>& pipe = sm.pipe;
  const int warp = t / 32, lane = t % 32, g = lane / 4, t4 = lane % 4;
  static_assert(!Tr::kDQAtomic, "the keys layout stages dQ for warp 1");
  const int64_t key0 = j0 + half * 64 + warp * 16;  // this warp's first key
  // This warpgroup's part of a tile's dQ: query rows 64 mrow.., head-dim columns 64 ncol...
  const int mrow = Tr::kDQSplitD ? 0 : half, ncol = Tr::kDQSplitD ? half : 0;
  float dk[kDT][4], dv[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  }
  cuda::mbar_wait(smem_addr(bar_kv), 0);
  const uint64_t k_desc = cuda::smem_desc_k_major(sK + half * 64 * 128);  // this warpgroup's key rows
  const uint64_t v_desc = cuda::smem_desc_k_major(sV + half * 64 * 128);
  const uint64_t k_mn_desc = cuda::smem_desc_mn_major(sK + ncol * Tr::kKPanelBytes, Tr::kKPanelBytes);
  for (State rd;; rd.advance()) {
    const unsigned char* sQ = sStages + rd.index * Tr::kStageBytes;
    const unsigned char* sdO = sQ + Tr::kQBytes;
    const unsigned char* stats = sStats + rd.index * Tr::kStatsBytes;
    const float* lse2s = reinterpret_cast<const float*>(stats);
    const float* deltas = lse2s + kBM;
    unsigned char* const ds = sDS + (rd.count & 1) * Tr::kDSBytes;
    pipe.consumer_wait(rd);
    const int4 info = *reinterpret_cast<const int4*>(stats + kInfoOffset);
    const int tile = info.x;
    if (tile < 0) break;
    const int64_t h = info.y;
    const TileClass tc = tile_class_from_bits(info.z);
    // The products' shared-memory descriptors, each GEMM's steps an offset from one base.
    const uint64_t q_desc = cuda::smem_desc_k_major(sQ), do_desc = cuda::smem_desc_k_major(sdO);
    const uint64_t q_mn_desc = cuda::smem_desc_mn_major(sQ, Tr::kQPanelBytes);
    const uint64_t do_mn_desc = cuda::smem_desc_mn_major(sdO, Tr::kQPanelBytes);
    const uint64_t ds_desc = cuda::smem_desc_mn_major(ds + mrow * Tr::kDSPanelBytes, Tr::kDSPanelBytes);
    float st[kMT][4], dpt[kMT][4];
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int pn = kk / 4, off = (kk % 4) * 32;
      cuda::Wgmma<T, kBM>::template mma<0>(&st[0][0], cuda::desc_advance(k_desc, pn * Tr::kKPanelBytes + off),
                                           cuda::desc_advance(q_desc, pn * Tr::kQPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int pn = kk / 4, off = (kk % 4) * 32;
      cuda::Wgmma<T, kBM>::template mma<0>(&dpt[0][0],
                                           cuda::desc_advance(v_desc, pn * Tr::kKPanelBytes + off),
                                           cuda::desc_advance(do_desc, pn * Tr::kQPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<1>();  // S^T (dP^T still running)
    cuda::fence_operands(st);
    // P^T, then (dP^T done) dS^T without the softmax scale (dK's epilogue and the dQ conversion
    // apply it, as FA3 does: one multiply a key row or a dQ element instead of one a score). The
    // softcap's forms are separate code: a runtime test inside the element loops is if-converted,
    // and the plain path would pay the softcap's log2 and selects on every element.
    // (The softcap's forms are separate instantiations, the masking shared.)
    const bool cap = a.cap_log2 != 0.f;
    if (cap) {
      log2_probs_by_column<true>(st, lse2s, a, t4);
    } else {
      log2_probs_by_column<false>(st, lse2s, a, t4);
    }
    // (Masked on every tile, all bits set on full ones: one path through the scores, so that the
    // register allocation need not reconcile two.)
    uint32_t vis[2] = {~0u, ~0u};
    if (tc.kind == BlockKind::kPartial) {
      // The block mask's bits of the thread's two key rows over the tile's queries: from the stage
      // where the producer staged them (query rows of kBN / 32 words), else from global memory.
      uint32_t mask_rows[2] = {0u, 0u};
      if (Tr::kStageMask && info.w) {  // (the thread's first key row in the block: half * 64 + warp * 16 + g)
        mask_key_rows_staged<kBM, kBN>(reinterpret_cast<const uint32_t*>(stats + kMaskOffset),
                                       half * 64 + warp * 16 + g, t4, mask_rows);
      }
      mask_tile_bits<true, kBM>(vis, pat, tc, b, h, key0, int64_t{tile} * kBM, lane,
                                Tr::kStageMask && info.w ? mask_rows : nullptr);
    }
    apply_visibility(st, vis);
    probs_from_log2(st);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(dpt);
    if (cap) {
      unscaled_score_grads_by_column<true>(st, dpt, lse2s, deltas, a, t4);
    } else {
      unscaled_score_grads_by_column<false>(st, dpt, lse2s, deltas, a, t4);
    }
    uint32_t ap[kBM / 16][4], ads[kBM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      acc_to_a<T>(ap[kk], st, kk);
      acc_to_a<T>(ads[kk], dpt, kk);
    }
    // dS^T rows (this warpgroup's 64 keys) into shared memory: A fragment word i of ads[kk] holds
    // row g + 8 (i % 2), columns 8 (2 kk + i / 2) + 2 t4 and + 1.
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = half * 64 + warp * 16 + g + 8 * (i % 2), n = 2 * kk + i / 2;
        cuda::st_shared_u32(smem_addr(ds + (n / 8) * Tr::kDSPanelBytes + row * 128 +
                                      cuda::swizzle128_chunk(row, n % 8) * 16 + t4 * 4),
                            ads[kk][i]);
      }
    }
    cuda::fence_operands(dv);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {  // 16 queries = 16 rows of 128 bytes of dO
      cuda::WgmmaRS<T, kD>::template mma<1>(&dv[0][0], ap[kk], cuda::desc_advance(do_mn_desc, kk * 2048), 1);
    }
    cuda::wgmma_commit();
    cuda::fence_proxy_async_shared();  // the dS^T stores, before wgmma reads them
    cuda::named_barrier_sync<256>(kBwdBarDS);
    float dq[8][4];
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {  // 16 keys = 16 rows of 128 bytes of dS^T and K
      cuda::Wgmma<T, 64>::template mma<1, 1>(&dq[0][0], cuda::desc_advance(ds_desc, kk * 2048),
                                             cuda::desc_advance(k_mn_desc, kk * 2048), kk > 0);
    }
    cuda::wgmma_commit();
    cuda::fence_operands(dk);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {  // 16 queries = 16 rows of 128 bytes of Q
      cuda::WgmmaRS<T, kD>::template mma<1>(&dk[0][0], ads[kk], cuda::desc_advance(q_mn_desc, kk * 2048), 1);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<1>();  // dV and dQ (dK still running)
    cuda::fence_operands(dq);
    cuda::named_barrier_sync<160>(kBwdBarDQEmpty + half);
    float4* const dq_part = reinterpret_cast<float4*>(sDQ + half * Tr::kDQPartBytes);
#pragma unroll
    for (int n = 0; n < 8; ++n) dq_part[n * 128 + t] = make_float4(dq[n][0], dq[n][1], dq[n][2], dq[n][3]);
    if (t == 0) dq_info[half] = BwdTileInfo{tile, static_cast<int>(h), 0, 0};
    cuda::fence_proxy_async_shared();  // before the bulk reduction reads them
    cuda::named_barrier_arrive<160>(kBwdBarDQFull + half);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(dv);
    cuda::fence_operands(dk);
    if (t == 0) pipe.consumer_release(rd);
  }
  // Both warpgroups' last dQ products read every row of K: only then may the epilogue stage dK over
  // it (the other warpgroup's rows included).
  cuda::named_barrier_sync<256>(kBwdBarDS);
  // The end, for warp 1 (after its last read of this warpgroup's buffer).
  cuda::named_barrier_sync<160>(kBwdBarDQEmpty + half);
  if (t == 0) dq_info[half] = BwdTileInfo{-1, 0, 0, 0};
  cuda::named_barrier_arrive<160>(kBwdBarDQFull + half);

  // dK and dV through this warpgroup's own rows of the K and V tiles (16-byte stores).
  const float one[2] = {1.f, 1.f}, scale[2] = {a.scale, a.scale};  // (dS^T was left unscaled)
  const int64_t first = j0 + half * 64;
  store_accumulator_rows<kD, T>(dk, scale, sK + half * 64 * 128, Tr::kKPanelBytes,
                                static_cast<T*>(a.g.dk) + a.g.dk_at(b, hk), a.g.dk_ss, first, pat.sk, t,
                                1 + half);
  store_accumulator_rows<kD, T>(dv, one, sV + half * 64 * 128, Tr::kKPanelBytes,
                                static_cast<T*>(a.g.dv) + a.g.dv_at(b, hk), a.g.dv_ss, first, pat.sk, t,
                                1 + half);
}

}  // namespace attention_cuda
}  // namespace opforge
