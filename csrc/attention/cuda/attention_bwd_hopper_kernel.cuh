// attention CUDA backward for Hopper (sm_90a): one pass over key blocks with five GEMMs a tile
// (FlashAttention-3's design). One block per key block (128 keys; 64 at head dims 192, 256) of one
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
//   consumers, head-dim layout (head dims 192 and 256, 64 x 64 tiles: FlashAttention-4's SM90 choice
//     at 256): S and dP over each warpgroup's 32 keys, P and dS of both through shared memory, then
//     each warpgroup's dV, dK and dQ over its half of the head dim (all operands in shared memory).
// dK and dV stay in registers until the block's last tile. Deterministic mode (a.dq_semaphore): the
// additions into each query tile's dQ come in a fixed order, from the last key block that sees the
// tile to the first, each block waiting for the later ones' additions to complete (a counter per
// (batch, head, query tile)). Later key blocks reach a query tile sooner (causal and windows walk
// query tiles from their diagonal on) and are launched first, so blocks rarely wait and never wait
// for one not yet launched. The prep kernel (delta, lse2, the workspace zeroed;
// attention_bwd_kernel.cuh) runs before, attention_bwd_hopper_dq_kernel (workspace -> dQ;
// attention_bwd_hopper_launch.cuh, with the host side) after.
// Query tiles: 128 at head dim 64, 64 at 128, 192 and 256. Without sm_90a device code the kernel traps;
// the launcher's rule asks attention_hopper_status() first.
#pragma once

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
  constexpr int kD = Tr::kD, kBN = Tr::kBlockN, kBM = Tr::kBlockM, kStages = Tr::kStages;
  constexpr int kMT = kBM / 8, kDT = kD / 8;
  constexpr int kInfoOffset = 2 * kBM * 4;       // in a stage's stats, after lse2 and delta
  constexpr int kMaskOffset = kInfoOffset + 16;  // then the mask bits
  using cuda::smem_addr;
  using State = cuda::PipelineState<kStages>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = cuda::align_shared<1024>(smem_raw);
  unsigned char* const sK = smem;
  unsigned char* const sV = smem + Tr::kKBytes;
  unsigned char* const sStages = sV + Tr::kVBytes;
  unsigned char* const sDS = sStages + kStages * Tr::kStageBytes;
  unsigned char* const sP = sDS + 2 * Tr::kDSBytes;  // (the head-dim layout's P; none in the keys layout)
  unsigned char* const sDQ = sP + 2 * Tr::kPBytes;
  unsigned char* const sStats = sDQ + Tr::kDQStageBytes;  // each stage's lse2, delta and tile info
  BwdTileInfo* const dq_info =
      reinterpret_cast<BwdTileInfo*>(sStats + kStages * Tr::kStatsBytes);  // one per part
  uint64_t* bars = reinterpret_cast<uint64_t*>(dq_info + 2);
  uint64_t* const bar_kv = bars;
  const cuda::Pipeline<kStages> pipe{bars + 1, bars + 1 + kStages};
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
    cuda::mbar_init(smem_addr(bar_kv), 1);
    pipe.init(2);  // one arrival per consumer warpgroup
    cuda::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    cuda::setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp == 0) {  // loads: K and V, then every visible (head, query tile), then the end
      QueryWalk<kBM, Tr::kStageMask> walk(pat, b, j0, j1, j1 - j0 < kBN);
      // TMA coordinates: the tensors' batch row, the sequence's first rows (varlen: in the packed dims).
      const int tb = static_cast<int>(p.pattern.tensor_batch(b));
      const int q_row0 = static_cast<int>(p.pattern.q_start(b)),
                k_row0 = static_cast<int>(p.pattern.k_start(b));
      if (lane == 0) {
        cuda::mbar_arrive_expect_tx(smem_addr(bar_kv), Tr::kKBytes + Tr::kVBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
          cuda::tma_load_4d(smem_addr(sK + pn * Tr::kKPanelBytes), &map_k, pn * 64,
                            k_row0 + static_cast<int>(j0), static_cast<int>(hk), tb, smem_addr(bar_kv));
          if (pn < Tr::kPanelsV) {
            cuda::tma_load_4d(smem_addr(sV + pn * Tr::kKPanelBytes), &map_v, pn * 64,
                              k_row0 + static_cast<int>(j0), static_cast<int>(hk), tb, smem_addr(bar_kv));
          }
        }
      }
      // A partial block-mask tile inside one mask block gets its bits copied into the stage by the
      // warp's lanes (cp.async, which the stage's full barrier waits for), as in the forward.
      const bool stage_bits = Tr::kStageMask && mask_stageable<kBM, kBN>(pat);
      State wr;
      for (int64_t gi = 0; gi < group; ++gi) {
        const int h = static_cast<int>(hk * group + gi);
        const float* lse2 = a.lse2 + a.ws_row(b, h);
        const float* delta = a.delta + a.ws_row(b, h);
        TileClass tc;
        for (int tile = walk.next(h, walk.begin, tc, lane); tile < walk.end;
             tile = walk.next(h, tile + 1, tc, lane), wr.advance()) {
          int staged = 0;
          if constexpr (Tr::kStageMask) {
            if (lane == 0) pipe.producer_acquire(wr);
            __syncwarp();
            if (stage_bits && tc.mask) {
              staged = stage_mask_bits<kBM, kBN>(
                  pat, b, h, int64_t{tile} * kBM, j0,
                  reinterpret_cast<uint32_t*>(sStats + wr.index * Tr::kStatsBytes + kMaskOffset),
                  &pipe.full[wr.index], lane);
            }
            __syncwarp();  // (the lanes' arrivals counted before lane 0's can complete the phase)
          }
          if (lane == 0) {
            if (!Tr::kStageMask) pipe.producer_acquire(wr);
            unsigned char* const st = sStages + wr.index * Tr::kStageBytes;
            unsigned char* const stats = sStats + wr.index * Tr::kStatsBytes;
            *reinterpret_cast<int4*>(stats + kInfoOffset) = make_int4(tile, h, tile_class_bits(tc), staged);
            const uint32_t bar = pipe.producer_commit(wr, Tr::kStageBytes + 2 * kBM * 4);
#pragma unroll
            for (int pn = 0; pn < Tr::kPanels; ++pn) {
              cuda::tma_load_4d(smem_addr(st + pn * Tr::kQPanelBytes), &map_q, pn * 64, q_row0 + tile * kBM,
                                h, tb, bar);
              if (pn < Tr::kPanelsV) {
                cuda::tma_load_4d(smem_addr(st + Tr::kQBytes + pn * Tr::kQPanelBytes), &map_do, pn * 64,
                                  q_row0 + tile * kBM, h, tb, bar);
              }
            }
            cuda::bulk_load(smem_addr(stats), lse2 + tile * kBM, kBM * 4, bar);
            cuda::bulk_load(smem_addr(stats + kBM * 4), delta + tile * kBM, kBM * 4, bar);
          }
          __syncwarp();
        }
      }
      if (lane == 0) {  // the end: a stage with no tile (an arrival without bytes)
        pipe.producer_acquire(wr);
        *reinterpret_cast<int4*>(sStats + wr.index * Tr::kStatsBytes + kInfoOffset) = make_int4(-1, 0, 0, 0);
        cuda::mbar_arrive(smem_addr(&pipe.full[wr.index]));
      }
    } else if (warp == 1 &&
               !Tr::kDQAtomic) {  // dQ: shared memory -> the workspace, one part a warpgroup, until the end
#pragma unroll
      for (int c = 0; c < 2; ++c) cuda::named_barrier_arrive<160>(kBwdBarDQEmpty + c);  // both buffers free
      for (;;) {
        cuda::named_barrier_sync<160>(kBwdBarDQFull);
        const int tile = dq_info[0].tile, h = dq_info[0].head;
        if (tile < 0) {
          cuda::named_barrier_sync<160>(kBwdBarDQFull + 1);  // (warpgroup 2's end)
          break;
        }
        float* const dst = a.dq_accum + dq_tile_offset<Tr>(a, b, h, tile);
        int* const sem = a.dq_semaphore && !(a.offsets_invalid && *a.offsets_invalid)
                             ? a.dq_semaphore + a.ws_row(b, h) / kBM + tile
                             : nullptr;
        if (sem) {  // deterministic: this block adds after every later key block that sees the tile
          const int turn =
              QueryWalk<kBM>(pat, b, j0, j1, false).template rank<kBN>(h, tile, kblock, blocks, lane);
          if (lane == 0) {
            while (cuda::ld_acquire_gpu(sem) < turn) {
            }
            cuda::fence_proxy_async_global();
          }
          __syncwarp();
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (c == 1) cuda::named_barrier_sync<160>(kBwdBarDQFull + 1);
          if (lane == 0) {
            cuda::bulk_reduce_add_f32(dst + c * Tr::kDQPartFloats, smem_addr(sDQ + c * Tr::kDQPartBytes),
                                      Tr::kDQPartBytes);
            cuda::bulk_commit_group();
            cuda::bulk_wait_group_read();
          }
          __syncwarp();
          cuda::named_barrier_arrive<160>(kBwdBarDQEmpty + c);
        }
        if (sem && lane == 0) {  // the next block's turn once both additions are complete
          cuda::bulk_wait_group();
          cuda::fence_proxy_async_global();
          cuda::red_release_gpu_add(sem, 1);
        }
        __syncwarp();
      }
      if (lane == 0) cuda::bulk_wait_group();
    }
    return;
  }

  cuda::setmaxnreg_inc<Tr::kConsumerRegs>();
  // (half through a shuffle: the compiler then knows it is warp-uniform and keeps what derives from
  // it, the descriptors, in uniform registers)
  const int half = __shfl_sync(0xffffffffu, wg, 0) - 1, g = lane / 4, t4 = lane % 4;
  if constexpr (Tr::kSplitHeadDim) {
    // Head-dim layout: S = Q K^T and dP = dO V^T over this warpgroup's 32 keys (queries as rows),
    // P and dS (bf16, 64 queries x 64 keys, both warpgroups' halves) through shared memory, then
    // dV += P^T dO, dK += dS^T Q and dQ = dS K over this warpgroup's half of the head dim.
    constexpr int kDV = Tr::kDV;
    constexpr int kCols = kD / 2, kCT = kCols / 8, kCTV = kDV / 16;  // this warpgroup's head-dim columns
    const int64_t row0 = warp * 16;                                  // this warp's first query row in a tile
    float dk[kCT][4], dv[kCTV][4];
#pragma unroll
    for (int n = 0; n < kCT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[n][e] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < kCTV; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dv[n][e] = 0.f;
    }
    cuda::mbar_wait(smem_addr(bar_kv), 0);
    const uint64_t k_desc = cuda::smem_desc_k_major(sK + half * 32 * 128);  // this warpgroup's 32 keys
    const uint64_t v_desc = cuda::smem_desc_k_major(sV + half * 32 * 128);
    uint64_t k_mn_desc, k_mn_desc1;  // K as dQ's B (keys deep)
    bwd_cols_desc<kD>(sK, Tr::kKPanelBytes, half, k_mn_desc, k_mn_desc1);
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
        cuda::Wgmma<T, 32>::template mma<0>(&sc[0][0],
                                            cuda::desc_advance(q_desc, pn * Tr::kQPanelBytes + off),
                                            cuda::desc_advance(k_desc, pn * Tr::kKPanelBytes + off), kk > 0);
      }
      cuda::wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kDV / 16; ++kk) {  // (dP: v's head dim deep)
        const int pn = kk / 4, off = (kk % 4) * 32;
        cuda::Wgmma<T, 32>::template mma<0>(&dp[0][0],
                                            cuda::desc_advance(do_desc, pn * Tr::kQPanelBytes + off),
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
        bwd_cols_mma<kD, T, 0>(dq, cuda::desc_advance(ds_desc, kk * 32),
                               cuda::desc_advance(k_mn_desc, kk * 2048),
                               cuda::desc_advance(k_mn_desc1, kk * 2048), kk > 0);
      }
      cuda::wgmma_commit();
      cuda::fence_operands(dv);
      // P^T and dS^T as A read MN-major (rows of P: 64 keys wide, 16 queries a step).
      const uint64_t p_mn_desc = cuda::smem_desc_mn_major(ps, Tr::kPBytes);
      const uint64_t ds_mn_desc = cuda::smem_desc_mn_major(ds, Tr::kDSBytes);
      uint64_t do_mn_desc, do_mn_desc1, q_mn_desc, q_mn_desc1;
      bwd_cols_desc<kDV>(sdO, Tr::kQPanelBytes, half, do_mn_desc, do_mn_desc1);
      bwd_cols_desc<kD>(sQ, Tr::kQPanelBytes, half, q_mn_desc, q_mn_desc1);
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        bwd_cols_mma<kDV, T, 1>(dv, cuda::desc_advance(p_mn_desc, kk * 2048),
                                cuda::desc_advance(do_mn_desc, kk * 2048),
                                cuda::desc_advance(do_mn_desc1, kk * 2048), 1);
      }
      cuda::wgmma_commit();
      cuda::fence_operands(dk);
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        bwd_cols_mma<kD, T, 1>(dk, cuda::desc_advance(ds_mn_desc, kk * 2048),
                               cuda::desc_advance(q_mn_desc, kk * 2048),
                               cuda::desc_advance(q_mn_desc1, kk * 2048), 1);
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
    // dK and dV: the block's 64 keys, this warpgroup's columns of each (bwd_store_cols), staged
    // through the K and V tiles (at 192 the N-32 part through panel 2 for warpgroup 0 and the dS
    // buffers, free by now, for warpgroup 1).
    const float one[2] = {1.f, 1.f}, scale[2] = {a.scale, a.scale};  // (dS was left unscaled)
    bwd_store_cols<kD, T>(dk, scale, sK, half ? sDS : sK + 2 * Tr::kKPanelBytes, Tr::kKPanelBytes,
                          static_cast<T*>(a.g.dk) + a.g.dk_at(b, hk), a.g.dk_ss, j0, pat.sk, half, t);
    bwd_store_cols<kDV, T>(dv, one, sV, half ? sDS + Tr::kDSBytes : sV + 2 * Tr::kKPanelBytes,
                           Tr::kKPanelBytes, static_cast<T*>(a.g.dv) + a.g.dv_at(b, hk), a.g.dv_ss, j0,
                           pat.sk, half, t);
  } else {
    static_assert(!Tr::kDQAtomic, "the keys layout stages dQ for warp 1");
    static_assert(Tr::kDV == kD, "the keys layout: one head dim");
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
        cuda::Wgmma<T, kBM>::template mma<0>(&st[0][0],
                                             cuda::desc_advance(k_desc, pn * Tr::kKPanelBytes + off),
                                             cuda::desc_advance(q_desc, pn * Tr::kQPanelBytes + off), kk > 0);
      }
      cuda::wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const int pn = kk / 4, off = (kk % 4) * 32;
        cuda::Wgmma<T, kBM>::template mma<0>(
            &dpt[0][0], cuda::desc_advance(v_desc, pn * Tr::kKPanelBytes + off),
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
        if (Tr::kStageMask &&
            info.w) {  // (the thread's first key row in the block: half * 64 + warp * 16 + g)
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
        cuda::WgmmaRS<T, kD>::template mma<1>(&dv[0][0], ap[kk], cuda::desc_advance(do_mn_desc, kk * 2048),
                                              1);
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
        cuda::WgmmaRS<T, kD>::template mma<1>(&dk[0][0], ads[kk], cuda::desc_advance(q_mn_desc, kk * 2048),
                                              1);
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
#else
  __trap();
#endif
}

}  // namespace attention_cuda
}  // namespace opforge
