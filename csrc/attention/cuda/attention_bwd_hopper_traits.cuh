// attention CUDA backward for Hopper (sm_90a; the design: attention_bwd_hopper_kernel.cuh): its
// forms' traits (HopperBwdTraits: tiles, stages, the consumers' layout, how dQ reaches the workspace,
// shared memory; one alias a form, each instantiated by a generated .cu), the named barriers, the dQ
// workspace's layout, the tile info the roles pass each other, and the head-dim layout's products and
// epilogue over a warpgroup's columns.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <type_traits>

#include "attention/cuda/attention_hopper_common.cuh"
#include "attention/cuda/attention_mask.cuh"
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
#define OPFORGE_ATTENTION_BWD_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace attention_cuda {

template <int kD_, int kBlockM_, int kBlockN_, int kStages_, bool kDQAtomic_ = false, int kProducerRegs_ = 24,
          int kConsumerRegs_ = 240, bool kStageMask_ = false, int kDV_ = kD_>
struct HopperBwdTraits {
  static constexpr int kD = kD_, kBlockN = kBlockN_, kBlockM = kBlockM_, kStages = kStages_;
  // v's head dim (V, dO, dV; dP's depth): below kD in the head-dim layout only (DeepSeek's MLA, 192
  // with v 128: FlashAttention-4's hdim_v).
  static constexpr int kDV = kDV_;
  // How a tile's dQ reaches the float32 workspace: through shared memory and warp 1's bulk
  // reduce-add (false), or straight from the consumers' registers by vector reductions (true,
  // the head-dim layout's choice outside deterministic mode, as FA3's at head dim 256: the 64 KB (48 at 192)
  // of staging then hold a second Q / dO stage). The deterministic mode's ordered additions need
  // the staged form.
  static constexpr bool kDQAtomic = kDQAtomic_;
  static constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
  // How the two consumer warpgroups share a tile. Keys (kBlockN 128, head dims 64 and 128): each
  // owns 64 of the block's keys and all of the head dim (S^T, dP^T with keys as rows). Head dim
  // (kBlockN 64, head dims 192 and 256, FlashAttention-4's SM90 layout at 256): both work on all 64
  // keys, each owns half the head dim of dK, dV and dQ (128 columns: 64 accumulator registers each;
  // 96 at 192: kThirds), and S, dP (queries as rows) are split by keys, 32 a warpgroup, P and dS
  // exchanged through shared memory.
  static constexpr bool kSplitHeadDim = kBlockN == 64;
  static_assert(kBlockN == (kSplitHeadDim ? 64 : 128) && (!kSplitHeadDim || kBlockM == 64), "tile layout");
  static_assert(kDV == kD || (kSplitHeadDim && kDV % 128 == 0 && kDV < kD), "v's head dim");
  // Registers a thread after setmaxnreg (at 224 ptxas serialises the consumers' wgmmas; 40 / 232
  // measured slower at head dim 128: fwd+bwd 2.41 ms against 2.30).
  static constexpr int kProducerRegs = kProducerRegs_, kConsumerRegs = kConsumerRegs_;
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * (65536 / kThreads / 8 * 8), "register split");
  static constexpr int kPanels = kD / 64, kPanelsV = kDV / 64;
  static constexpr int kKPanelBytes = kBlockN * 128, kQPanelBytes = kBlockM * 128;
  static constexpr int kKBytes = kPanels * kKPanelBytes, kQBytes = kPanels * kQPanelBytes;
  static constexpr int kVBytes = kPanelsV * kKPanelBytes, kDOBytes = kPanelsV * kQPanelBytes;
  // A stage: Q and dO (whole swizzle atoms), and apart from them its stats: lse2 and delta (kBlockM
  // floats each), the tile's BwdTileInfo (16 bytes), and in the block-mask form (kStageMask: launched
  // for patterns with a block mask) a partial mask tile's bits, staged by the producer (kBlockM
  // query rows of kBlockN / 32 words).
  static constexpr bool kStageMask = kStageMask_;
  static constexpr int kStageBytes = kQBytes + kDOBytes;
  // dS^T (keys layout): kBlockN key rows of kBlockM queries in 64-query panels; dS and P (head-dim
  // layout): 64 query rows of 64 keys each. Two buffers, so that one warpgroup may write the next
  // tile's while the other still reads this one's.
  static constexpr int kDSPanelBytes = kBlockN * 128, kDSBytes = (kBlockM / 64) * kDSPanelBytes;
  static constexpr int kPBytes = kSplitHeadDim ? kDSBytes : 0;
  // A tile's dQ (kBlockM x kD) in two parts of 64 rows x kDQPartCols, one per consumer warpgroup:
  // split along the head dim (kBlockM 64) or along the queries (kBlockM 128).
  static constexpr int kDQPartCols = kBlockM * kD / 128;
  static_assert(kDQPartCols == 64 || kDQPartCols == 96 || kDQPartCols == 128,
                "two dQ parts a tile, 64 rows each");
  static constexpr bool kDQSplitD = kBlockM == 64;
  // The head-dim layout at head dim 192 (three 64-column panels for two warpgroups): warpgroup c owns
  // panel c (an N-64 product) and columns 128 + 32 c.. of panel 2 (an N-32 product, its B operand
  // starting half a swizzle row in for c = 1), so that both warpgroups' products and fragments have
  // one shape. The head-dim column of fragment n (8 columns) of part c: part_col.
  static constexpr bool kThirds = kSplitHeadDim && kD == 192;
  static __host__ __device__ constexpr int part_col(int c, int n) {
    return kThirds ? (n < 8 ? 64 * c + 8 * n : 128 + 32 * c + 8 * (n - 8))
                   : (kDQSplitD ? c * kDQPartCols : 0) + 8 * n;
  }
  static constexpr int kDQPartFloats = 64 * kDQPartCols, kDQPartBytes = kDQPartFloats * 4;
  static constexpr int kDQStageBytes = kDQAtomic ? 0 : 2 * kDQPartBytes;
  static constexpr int kBaseSmemBytes =
      1024 + kKBytes + kVBytes + kStages * (kStageBytes + 2 * kBlockM * 4 + 16) + 2 * (kDSBytes + kPBytes) +
      kDQStageBytes + 2 * 16 + (1 + 2 * kStages) * 8;
  static constexpr int kMaskWords = kStageMask ? kBlockM * kBlockN / 32 : 0;
  static constexpr int kStatsBytes = 2 * kBlockM * 4 + 16 + kMaskWords * 4;
  static constexpr int kSmemBytes = kBaseSmemBytes + kStages * kMaskWords * 4;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

using HopperBwdTraitsD64 = HopperBwdTraits<64, 128, 128, 2>;

using HopperBwdTraitsD128 = HopperBwdTraits<128, 64, 128, 2>;

using HopperBwdTraitsD192 = HopperBwdTraits<192, 64, 64, 2, true>;

using HopperBwdTraitsD192Deterministic = HopperBwdTraits<192, 64, 64, 1>;

using HopperBwdTraitsD192V128 = HopperBwdTraits<192, 64, 64, 2, true, 24, 240, false, 128>;

using HopperBwdTraitsD192V128Deterministic = HopperBwdTraits<192, 64, 64, 1, false, 24, 240, false, 128>;

using HopperBwdTraitsD256 = HopperBwdTraits<256, 64, 64, 2, true>;

using HopperBwdTraitsD256Deterministic = HopperBwdTraits<256, 64, 64, 1>;

// The block-mask forms (head dim 256's two stages leave no room for the bits: its kernels read them
// from global memory).
using HopperBwdTraitsMaskD64 = HopperBwdTraits<64, 128, 128, 2, false, 24, 240, true>;

using HopperBwdTraitsMaskD128 = HopperBwdTraits<128, 64, 128, 2, false, 24, 240, true>;

// Named barriers (0 is __syncthreads's; 1 and 2 are the epilogue's, store_accumulator_rows).
constexpr int kBwdBarDS =

    3;  // both consumer warpgroups' dS^T (head-dim layout: P and dS) are in shared memory
constexpr int kBwdBarDQFull = 4;  // + c: warpgroup c's dQ part is in shared memory

constexpr int kBwdBarDQEmpty = 6;  // + c: warp 1 has read it (the buffer is free)

// The float32 workspace of dQ: (B, Hq, lse2_ld, kD) values, a query tile's kBlockM x kD as two
// parts of 64 x kDQPartCols in the wgmma accumulator's register order (float4 n * 128 + t holds thread t's
// fragment n: rows 16 (t / 32) + (t % 32) / 4 and + 8, columns 8 n + 2 (t % 4) and + 1), so that
// both the consumers' shared-memory writes and the post kernel's reads are whole 16-byte vectors.
template <typename Tr>
__device__ __forceinline__ int64_t dq_tile_offset(const AttentionCudaArgs& a, int64_t b, int64_t h,
                                                  int64_t tile) {
  return (a.ws_row(b, h) + tile * Tr::kBlockM) * Tr::kD;
}

// What the producer tells the consumers about the tile in a stage (written into the stage before
// its arrival, read after the wait), and the consumers tell warp 1 with a dQ part: the query tile
// (-1: no more tiles), its head, its class (tile_class_bits), and whether the stage holds its
// block-mask bits.
struct BwdTileInfo {
  int tile, head, bits, staged;
};

// The head-dim layout's acc += A B over a warpgroup's half of a kW-column operand, 16 deep (A through
// a_desc, kTransA its major-ness; B MN-major: b0, and at 192 b1 for the N-32 part: bwd_cols_desc).
template <int kW, typename T, int kTransA>
__device__ __forceinline__ void bwd_cols_mma(float (&acc)[kW / 16][4], uint64_t a_desc, uint64_t b0,
                                             uint64_t b1, int scale_d) {
  if constexpr (kW == 192) {
    cuda::Wgmma<T, 64>::template mma<1, kTransA>(&acc[0][0], a_desc, b0, scale_d);
    cuda::Wgmma<T, 32>::template mma<1, kTransA>(&acc[8][0], a_desc, b1, scale_d);
  } else {
    cuda::Wgmma<T, kW / 2>::template mma<1, kTransA>(&acc[0][0], a_desc, b0, scale_d);
  }
}

// Warpgroup `half`'s half of a kW-column tile (64-column panels of `panel` bytes) as MN-major B
// operands: at 256 panels 2 half and 2 half + 1 (one product, b0); at 128 panel `half`; at 192 panel
// `half` (b0) and the 32 columns 128 + 32 half.. of panel 2 (b1; Tr::part_col).
template <int kW>
__device__ __forceinline__ void bwd_cols_desc(const unsigned char* tile, int panel, int half, uint64_t& b0,
                                              uint64_t& b1) {
  b0 = cuda::smem_desc_mn_major(tile + (kW == 256 ? 2 * half : half) * panel, panel);
  b1 = cuda::smem_desc_mn_major(tile + 2 * panel + half * 64, panel);
}

// The head-dim layout's epilogue of dK or dV (kW columns, scaled by sc): warpgroup `half`'s columns
// (bwd_cols_desc's) of the block's keys [first, end) into dst, staged through `tile`'s panels
// (2 half and 2 half + 1 at 256, `half` at 128 and, at 192, for the N-64 part; the N-32 part through
// rows_b).
template <int kW, typename T>
__device__ __forceinline__ void bwd_store_cols(const float (&acc)[kW / 16][4], const float (&sc)[2],
                                               unsigned char* tile, unsigned char* rows_b, int panel, T* dst,
                                               int64_t ld, int64_t first, int64_t end, int half, int t) {
  if constexpr (kW == 192) {
    store_accumulator_rows<64, T>(*reinterpret_cast<const float(*)[8][4]>(&acc[0][0]), sc,
                                  tile + half * panel, panel, dst + 64 * half, ld, first, end, t, 1 + half);
    store_accumulator_rows<32, T>(*reinterpret_cast<const float(*)[4][4]>(&acc[8][0]), sc, rows_b, panel,
                                  dst + 128 + 32 * half, ld, first, end, t, 1 + half);
  } else {
    store_accumulator_rows<kW / 2, T>(acc, sc, tile + (kW == 256 ? 2 * half : half) * panel, panel,
                                      dst + half * (kW / 2), ld, first, end, t, 1 + half);
  }
}

}  // namespace attention_cuda
}  // namespace opforge
