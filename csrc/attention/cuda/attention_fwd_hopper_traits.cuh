// attention CUDA forward for Hopper (sm_90a; the design: attention_fwd_hopper_kernel.cuh): its forms'
// traits (HopperFwdTraits: tiles, stages, consumer warpgroups, the register split, shared memory;
// one alias a form, each instantiated by a generated .cu), the named barriers, and a block's shared
// memory (FwdSmem).
#pragma once

#include <cuda.h>

#include <algorithm>

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
#define OPFORGE_ATTENTION_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace attention_cuda {

template <int kD_, int kBlockN_, int kStages_, int kConsumers_ = 2, bool kPingPong_ = true,
          bool kStageMask_ = false, bool kPersistent_ = false, bool kKvCache_ = false, int kDV_ = kD_,
          bool kFp8_ = false>
struct HopperFwdTraits {
  static constexpr int kD = kD_, kBlockN = kBlockN_, kStages = kStages_, kConsumers = kConsumers_;
  // v's head dim (P V's N, the output and its epilogue, V's tiles and TMA boxes); q and k read kD
  // (DeepSeek's MLA: 192 with v 128, FlashAttention-3's hdim_v).
  static constexpr int kDV = kDV_;
  static_assert(kDV <= kD, "the output is staged through the Q tile");
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
  // The FP8 form (attention_fwd_hopper_fp8.cuh: q, k, v in float8_e4m3fn, the output bfloat16): 8-bit
  // wgmma (k 32 a step) reads both operands K-major, so V's tile is transposed in shared memory by
  // the producer warpgroup's other warps (kTransposeWarps) from a raw V tile the TMA lands in a ring
  // of its own (kVRawBytes a stage), into the stage's V slot (kDV rows of kBlockN keys, 128-key
  // panels of kVPanelBytes). P is rounded to e4m3 in registers, scaled by 2^kPOffset (the row max
  // offset: P in [0, 256] under e4m3's 448, FA3's choice) so that small probabilities keep their
  // precision. The plain form only.
  static constexpr bool kFp8 = kFp8_;
  static_assert(!kFp8 || (!kStageMask && !kPersistent && !kKvCache && kDV == kD && kBlockN % 128 == 0),
                "the FP8 form: the plain form, one head dim, 128-key panels");
  static constexpr int kElemBytes = kFp8 ? 1 : 2;
  static constexpr int kPanelCols = 128 / kElemBytes;  // a 128-byte row's elements (a TMA box's columns)
  static constexpr int kK = 32 / kElemBytes;           // a wgmma's depth (32 bytes of a row)
  static constexpr int kPOffset = kFp8 ? 8 : 0;
  static constexpr int kTransposeWarps = kFp8 ? 3 : 0;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumer warpgroups
  // Registers a thread after setmaxnreg (FA3's split: the launch's 65536 / kThreads, rounded down to
  // 8, moved from the producer warpgroup to the consumers). The persistent producer holds an item's
  // state across its loop (the pattern, the TMA coordinates, the next item): at 40 it spills, at 88
  // only the next item's counter value, once an item (and with segment ids' runs a few values at an
  // item's start); the consumers at 208 do not. The KV-cache form's producer (a page-table read and
  // the ragged V tile's zeroing) spills at 40 and not at 56; its consumers take 224 (no spills).
  // The head-dim-192 producer (three K panels, two or three V panels a tile) spills at 40 too.
  // The FP8 form's producer (the tile walk and two rings in warp 0, the transposes in warps 1-3)
  // spilled at 56: it takes 72, its consumers 216.
  static constexpr bool kWideProducer = kKvCache_ || kD_ == 192;
  static constexpr int kProducerRegs = kPersistent || kFp8 ? (kFp8 ? 72 : 88)
                                       : kConsumers == 2   ? (kWideProducer ? 56 : 40)
                                                           : 32;
  static constexpr int kConsumerRegs = kPersistent       ? 208
                                       : kFp8            ? 216
                                       : kConsumers == 2 ? (kWideProducer ? 224 : 232)
                                                         : 160;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (65536 / kThreads / 8 * 8) * (1 + kConsumers),
                "register split");
  // 128-byte boxes a row (64 16-bit or 128 8-bit columns); V's: of its rows (16-bit: kBlockN rows
  // of 128 bytes a panel) or of its transposed tile's (FP8: kDV rows of 128 keys a panel). Head dim
  // 96 takes two (TMA fills the columns past the tensors' 96 with zeros): S is 96 deep (six of the
  // eight k steps) and P V 96 wide, the output 96 columns.
  static constexpr int kPanels = (kD + kPanelCols - 1) / kPanelCols;
  static constexpr int kPanelsV = kFp8 ? kBlockN / 128 : (kDV + kPanelCols - 1) / kPanelCols;
  static_assert(kFp8 ? kD % kPanelCols == 0 && kDV % kPanelCols == 0 : kD % 32 == 0 && kDV % 32 == 0,
                "whole 128-byte panels (FP8), whole 32-column halves of a panel (16-bit)");
  static constexpr int kQPanelBytes = kBlockM * 128, kKVPanelBytes = kBlockN * 128;
  static constexpr int kVPanelBytes = kFp8 ? kDV * 128 : kKVPanelBytes;
  static constexpr int kQBytes = kPanels * kQPanelBytes, kKVBytes = kPanels * kKVPanelBytes;
  static constexpr int kVBytes = kPanelsV * kVPanelBytes;
  static constexpr int kStageBytes = kKVBytes + kVBytes;  // K then V
  // (FP8) the raw V tile a stage (kBlockN rows of kDV bytes), which the epilogue reuses to stage the
  // bfloat16 output (64 rows of 2 kDV bytes a consumer warpgroup: the transposes are all done then)
  static constexpr int kVRawBytes = kFp8 ? kBlockN * kDV : 0;
  static_assert(!kFp8 || kStages * kVRawBytes >= kConsumers * 64 * kDV * 2, "the output's staging");
  static constexpr int kMaskWords = kStageMask ? kBlockM * kBlockN / 32 : 0;
  static constexpr int kOBytes = kPersistent ? kQBytes : 0;  // (persistent) the output's staging
  // Q, the stages, their mask bits, the output's staging, a tile's (index, class, staged) per stage,
  // (persistent) the Q tile's item, the barriers (Q full (/ empty); K full / empty; V full / empty).
  // (FP8: the raw V ring's tiles after the output's staging, its tile flags after the stages', its
  // full / empty barriers last)
  static constexpr int kSmemBytes =
      1024 /* alignment */ + kQBytes + kStages * (kStageBytes + kMaskWords * 4) + kOBytes +
      kStages * kVRawBytes + kStages * 16 * (kFp8 ? 2 : 1) +
      (2 + 4 * kStages + (kFp8 ? 2 * kStages : 0)) * 8 + (kPersistent ? 32 + 8 : 0);
  static_assert(kBlockN <= 256 && kBlockN % 32 == 0 && kSmemBytes <= 227 * 1024,
                "TMA box rows, mask words / shared memory");
};

using HopperFwdTraitsD64 =

    HopperFwdTraits<64, 128, 2, 2>;  // (three consumers, 192 x 128: 2% faster causal, 11% slower sliding 512)
using HopperFwdTraitsD128 = HopperFwdTraits<128, 128, 2>;

using HopperFwdTraitsD256 =

    HopperFwdTraits<256, 64, 2, 2, false>;  // (no ping-pong: 3% faster, as FA4 above D 128)
// Head dim 192 (FlashAttention-3's tiles): with v 128 (DeepSeek's MLA) key tiles of 128 (Q 48 KB, a
// stage 80 KB: 208 KB); with v 192 of 96 (a stage 72 KB: 192 KB; 128 would need 240 KB). The
// block-mask forms are not instantiated here: such calls run at 256 (the rule, hopper_fwd_dims).
using HopperFwdTraitsD192V128 = HopperFwdTraits<192, 128, 2, 2, true, false, false, false, 128>;

using HopperFwdTraitsD192 = HopperFwdTraits<192, 96, 2, 2, true, false, false, false, 192>;

using HopperFwdTraitsCacheD192V128 = HopperFwdTraits<192, 128, 2, 2, true, false, false, true, 128>;

using HopperFwdTraitsCacheD192 = HopperFwdTraits<192, 96, 2, 2, true, false, false, true, 192>;

// Head dim 96 (Phi-3's, FlashAttention-3's 96): the head-dim-128 tiles, S and P V at 96.
using HopperFwdTraitsD96 = HopperFwdTraits<96, 128, 2>;

using HopperFwdTraitsMaskD96 = HopperFwdTraits<96, 128, 2, 2, true, true>;

using HopperFwdTraitsCacheD96 = HopperFwdTraits<96, 128, 2, 2, true, false, false, true>;

using HopperFwdTraitsCacheMaskD96 = HopperFwdTraits<96, 128, 2, 2, true, true, false, true>;

// FP8 (float8_e4m3fn q, k, v; narrower head dims zero-padded to 128 by the launcher): 128 x 128 tiles,
// two stages (Q 16 KB, a stage 32 KB, the raw V ring 32 KB: 112 KB).
using HopperFwdTraitsFp8D128 = HopperFwdTraits<128, 128, 2, 2, true, false, false, false, 128, true>;

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
  unsigned char* vraw;  // (FP8) the raw V ring's tiles
  int4* info;
  int4* vinfo;  // (FP8) a raw V stage's flag (x: 1 a tile, -1 the end)
  int4* q_info;
  uint64_t* q_full;
  uint64_t* q_empty;  // (persistent) the consumers' S products of the Q tile's item are done
  cuda::Pipeline<Tr::kStages> pk, pv;
  uint64_t* v_own;                  // the producer's V tile landed (fwd_load_v_tile)
  cuda::Pipeline<Tr::kStages> pvr;  // (FP8) the raw V ring: TMA fills, the transposing warps drain

  __device__ __forceinline__ explicit FwdSmem(unsigned char* base)
      : q(base),
        kv(base + Tr::kQBytes),
        mask(reinterpret_cast<uint32_t*>(kv + Tr::kStages * Tr::kStageBytes)),
        o(reinterpret_cast<unsigned char*>(mask + Tr::kStages * Tr::kMaskWords)),
        vraw(o + Tr::kOBytes),
        info(reinterpret_cast<int4*>(vraw + Tr::kStages * Tr::kVRawBytes)),
        vinfo(info + Tr::kStages),
        q_info(vinfo + (Tr::kFp8 ? Tr::kStages : 0)),
        q_full(reinterpret_cast<uint64_t*>(q_info + (Tr::kPersistent ? 2 : 0))),
        q_empty(Tr::kPersistent ? q_full + 1 : nullptr),
        pk{q_full + kBars, q_full + kBars + Tr::kStages},
        pv{q_full + kBars + 2 * Tr::kStages, q_full + kBars + 3 * Tr::kStages},
        v_own(q_full + kBars + 4 * Tr::kStages),
        pvr{v_own + 1, v_own + 1 + Tr::kStages} {}
};

}  // namespace attention_cuda
}  // namespace opforge
