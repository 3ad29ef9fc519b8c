// attention CUDA forward for Hopper: the persistent form (HopperFwdForm::persistent): its work items
// (FwdSchedule, in the one-item grid's order) and its kernel, a block a multiprocessor.
#pragma once

#include "attention/cuda/attention_fwd_hopper_kernel.cuh"

namespace opforge {
namespace attention_cuda {

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
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDT = Tr::kDV / 8;
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
            const uint32_t vbar = sm.pv.producer_commit(wv, Tr::kVBytes);
#pragma unroll
            for (int pn = 0; pn < Tr::kPanelsV; ++pn) {
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
    store_accumulator_rows<Tr::kDV, T>(o, inv, sm.o + half * 64 * 128, Tr::kQPanelBytes,
                                       static_cast<T*>(p.out) + p.o_at(b, h) + first * p.o_ss, p.o_ss,
                                       i0 + half * 64, pat.sq, t, 1 + half);
  }
#else
  __trap();
#endif
}

}  // namespace attention_cuda
}  // namespace opforge
