// attention CUDA forward for Hopper: the producer warp's K and V loads (a paged cache's page runs, a
// tile by TMA: a box a panel or a box a page run, the KV-cache form's V tile with the rows past a
// sequence's count zeroed).
#pragma once

#include "attention/cuda/attention_fwd_hopper_traits.cuh"

namespace opforge {
namespace attention_cuda {

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

// A K or V tile of kBlockN rows from the key tile `tile` into dst (kPanels boxes of 64 columns: K's
// Tr::kPanels, V's Tr::kPanelsV)
// through map, completing on the mbarrier at bar (which expects the tile's bytes): one box a panel
// (lane 0), or for a paged cache (the KV-cache form; map: (D, page_size, Hkv, num_pages)) a box a
// page run, lane r issuing run r (its FwdPageRun). The paged page size divides kBlockN or is a
// multiple of it (attention_hopper_fwd_pages_at), so a box never crosses a page. (The one-item kernel's K
// tiles of every form and the KV-cache form's V tiles come through here.)
template <typename Tr, int kPanels = Tr::kPanels>
__device__ __forceinline__ void fwd_load_kv_tile(const CUtensorMap* map, unsigned char* dst,
                                                 const AttentionParams& p, int tile, int row0, int hk, int tb,
                                                 uint32_t bar, FwdPageRun run, int lane) {
  constexpr int kBN = Tr::kBlockN;
  if (!Tr::kKvCache || !p.block_table) {
    if (lane == 0) {
#pragma unroll
      for (int pn = 0; pn < kPanels; ++pn) {
        cuda::tma_load_4d(cuda::smem_addr(dst + pn * Tr::kKVPanelBytes), map, pn * Tr::kPanelCols,
                          row0 + tile * kBN, hk, tb, bar);
      }
    }
    return;
  }
  const int ps = static_cast<int>(p.page_size), box = ps < kBN ? ps : kBN;
  if (lane < kBN / box) {
#pragma unroll
    for (int pn = 0; pn < kPanels; ++pn) {
      cuda::tma_load_4d(cuda::smem_addr(dst + pn * Tr::kKVPanelBytes + lane * box * 128), map,
                        pn * Tr::kPanelCols, run.slot, hk, run.page, bar);
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
// fwd_v_tile_ragged says needs it lands on the producer's own barrier (v_own, a one-stage ring
// whose state own_pass advances here), has its rows from the sequence's count on zeroed (whole
// 128-byte rows of every panel: the 128-byte swizzle permutes 16-byte chunks within a row), made
// visible to the async proxy (the consumers' wgmma) and only then released to the consumers (an
// arrival without bytes); other tiles complete on the stage's full barrier as they land. Lane 0 has
// acquired the stage.
template <typename Tr>
__device__ __forceinline__ void fwd_load_v_tile(const FwdSmem<Tr>& sm, const CUtensorMap* map,
                                                unsigned char* dst, const AttentionParams& p,
                                                const AttentionPattern& pat, int tile, int row0, int hk,
                                                int tb, FwdPageRun run,
                                                const cuda::PipelineState<Tr::kStages>& w,
                                                cuda::PipelineState<1>& own_pass, int lane) {
  constexpr int kBN = Tr::kBlockN;
  if (!fwd_v_tile_ragged<Tr>(p, pat, tile)) {
    if (lane == 0) sm.pv.producer_commit(w, Tr::kVBytes);
    __syncwarp();
    fwd_load_kv_tile<Tr, Tr::kPanelsV>(map, dst, p, tile, row0, hk, tb, cuda::smem_addr(&sm.pv.full[w.index]),
                                       run, lane);
    return;
  }
  const uint32_t own = cuda::smem_addr(sm.v_own);
  if (lane == 0) cuda::mbar_arrive_expect_tx(own, Tr::kVBytes);
  __syncwarp();
  fwd_load_kv_tile<Tr, Tr::kPanelsV>(map, dst, p, tile, row0, hk, tb, own, run, lane);
  cuda::mbar_wait(own, own_pass.phase);
  own_pass.advance();
  const int keep =
      static_cast<int>(pat.sk - int64_t{tile} * kBN);  // (rows [keep, kBN) are zeroed; keep >= 1)
  const int chunks = (kBN - keep) * 8;                 // 16-byte chunks a panel
  for (int idx = lane; idx < Tr::kPanelsV * chunks; idx += 32) {
    const int pn = idx / chunks, c = idx % chunks;
    *reinterpret_cast<int4*>(dst + pn * Tr::kKVPanelBytes + keep * 128 + c * 16) = make_int4(0, 0, 0, 0);
  }
  cuda::fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) sm.pv.producer_arrive(w);
}

}  // namespace attention_cuda
}  // namespace opforge
