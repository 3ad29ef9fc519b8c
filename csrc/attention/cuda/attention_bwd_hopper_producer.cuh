// attention CUDA backward for Hopper: the producer warpgroup's roles. Warp 0 loads K and V once, then
// for every q head of the GQA group and every query tile its walk finds visible, Q, dO, lse2 and
// delta (and the block-mask form's bits) into a stage, then a stage with no tile; warp 1 (unless
// Tr::kDQAtomic) adds each tile's staged dQ parts into the float32 workspace.
#pragma once

#include "attention/cuda/attention_bwd_hopper_traits.cuh"

namespace opforge {
namespace attention_cuda {

// Warp 0: the loads. (Maps: the kernel's grid constants; b, hk, j0, j1: the block's batch row, kv
// head and keys; group: the q heads a kv head serves.)
template <typename Tr>
__device__ __forceinline__ void bwd_load_tiles(const BwdSmem<Tr>& sm, const CUtensorMap* map_q,
                                               const CUtensorMap* map_k, const CUtensorMap* map_v,
                                               const CUtensorMap* map_do, const AttentionCudaArgs& a,
                                               const AttentionPattern& pat, int64_t b, int64_t hk, int64_t j0,
                                               int64_t j1, int64_t group, int lane) {
  constexpr int kBN = Tr::kBlockN;
  constexpr int kBM = Tr::kBlockM;
  constexpr int kInfoOffset = BwdSmem<Tr>::kInfoOffset;
  constexpr int kMaskOffset = BwdSmem<Tr>::kMaskOffset;
  using cuda::smem_addr;
  using State = cuda::PipelineState<Tr::kStages>;
  unsigned char* const sK = sm.k;
  unsigned char* const sV = sm.v;
  unsigned char* const sStages = sm.stages;
  unsigned char* const sStats = sm.stats;
  uint64_t* const bar_kv = sm.kv_full;
  const cuda::Pipeline<Tr::kStages>& pipe = sm.pipe;
  const AttentionParams& p = a.g.fwd;
  QueryWalk<kBM, Tr::kStageMask> walk(pat, b, j0, j1, j1 - j0 < kBN);
  // TMA coordinates: the tensors' batch row, the sequence's first rows (varlen: in the packed dims).
  const int tb = static_cast<int>(p.pattern.tensor_batch(b));
  const int q_row0 = static_cast<int>(p.pattern.q_start(b)), k_row0 = static_cast<int>(p.pattern.k_start(b));
  if (lane == 0) {
    cuda::mbar_arrive_expect_tx(smem_addr(bar_kv), 2 * Tr::kKBytes);
#pragma unroll
    for (int pn = 0; pn < Tr::kPanels; ++pn) {
      cuda::tma_load_4d(smem_addr(sK + pn * Tr::kKPanelBytes), map_k, pn * 64, k_row0 + static_cast<int>(j0),
                        static_cast<int>(hk), tb, smem_addr(bar_kv));
      cuda::tma_load_4d(smem_addr(sV + pn * Tr::kKPanelBytes), map_v, pn * 64, k_row0 + static_cast<int>(j0),
                        static_cast<int>(hk), tb, smem_addr(bar_kv));
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
        const uint32_t bar = pipe.producer_commit(wr, 2 * Tr::kQBytes + 2 * kBM * 4);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
          cuda::tma_load_4d(smem_addr(st + pn * Tr::kQPanelBytes), map_q, pn * 64, q_row0 + tile * kBM, h, tb,
                            bar);
          cuda::tma_load_4d(smem_addr(st + Tr::kQBytes + pn * Tr::kQPanelBytes), map_do, pn * 64,
                            q_row0 + tile * kBM, h, tb, bar);
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
}

// Warp 1: each tile's dQ parts, as the consumer warpgroups stage them, added into the workspace by
// bulk reductions until the end (deterministic mode: after every later key block that sees the tile,
// QueryWalk::rank). kblock of blocks: the block's key block.
template <typename Tr>
__device__ __forceinline__ void bwd_add_dq(const BwdSmem<Tr>& sm, const AttentionCudaArgs& a,
                                           const AttentionPattern& pat, int64_t b, int64_t j0, int64_t j1,
                                           int kblock, int blocks, int lane) {
  constexpr int kBN = Tr::kBlockN;
  constexpr int kBM = Tr::kBlockM;
  using cuda::smem_addr;
  unsigned char* const sDQ = sm.dq;
  BwdTileInfo* const dq_info = sm.dq_info;
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

}  // namespace attention_cuda
}  // namespace opforge
