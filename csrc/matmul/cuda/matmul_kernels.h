// matmul CUDA: the launch functions of the rungs (one .cu file each, no torch). Every function
// computes c[b] = a[b] @ b[b] for b < p.batch with a (m, k), b (k, n) and c (m, n) row-major
// (column stride 1; p.a_cs == p.b_cs == 1), on `stream`, and returns a cudaError_t as int.
// The *_config functions select a tile configuration for tuning; warp_tiled and mma build every
// configuration only with OPFORGE_MATMUL_TUNING (benchmarks/micro/matmul_tune.py), else only
// their default (others return cudaErrorInvalidValue): a sixth of mma's compile time.
#pragma once

#include "matmul/matmul_params.h"

namespace opforge {

int matmul_naive_cuda(const GemmParams& p, void* stream);             // float32
int matmul_smem_tiled_cuda(const GemmParams& p, void* stream);        // float32
int matmul_register_blocked_cuda(const GemmParams& p, void* stream);  // float32
int matmul_warp_tiled_cuda(const GemmParams& p, void* stream);        // float32
// The same with a fixed configuration (for tuning; -1: the default, 6): 0: 16-deep tiles staged
// through registers, one block per SM; 1: 8-deep, two blocks; 2: 16-deep, two blocks (spills);
// 3: 8-deep, one block; 4: 128 x 256 tiles, 8-deep, one block; 5, 6: tiles 16 and 32 deep filled
// by cp.async, two blocks per SM (sm_80+ and vectorizable calls; else 0).
int matmul_warp_tiled_cuda_config(const GemmParams& p, void* stream, int config);
// float16/bfloat16, sm_80+; also needs k, p.a_rs, p.b_rs and the batch strides multiples of 8
// and a, b 16-byte aligned; b readable to the next multiple of 8 columns (ldb >= that).
int matmul_mma_cuda(const GemmParams& p, void* stream);
// The same with a fixed configuration (for tuning; -1: the default, 99 in builds with 9.0a code,
// else 74): block tile 128 x 128 or 128 x 256, cp.async ring of 3 or 4 stages, 32 or 64 deep:
// 0: 128/3/32; 1: 256/3/32;
// 2: 256/4/32; 3: 128/4/32; 4: 256/3/64; 5: 256/4/64; 6: 128/3/64; 7, 8: 4 and 6 with unchecked
// copies for tiles inside the matrices; 9, 10, 11: 256/3/64, 256/4/32, 256/4/64 unchecked, with
// fragment addresses precomputed, the next tile's first fragments read before the current
// tile's last mma, and the copies spread over the steps; 13, 14: 9 with 3 and 4 stages handed
// over by per-stage mbarriers instead of a block-wide barrier per tile; 20, 21: 9's tiles and
// loop with the stages filled by TMA, refilled by the last warp to read them, 3 and 4 stages
// (sm_90 and TMA-able strides: nonzero batch strides; else 9); 30: 20 with the tile stored by
// TMA (where c's base and strides are 16-byte multiples; else as 20); 40: 30 with blocks walking
// the tiles in groups of 16 tile rows; 39: 40 stamping a timeline (tuning builds:
// matmul_tune.py --trace); 74 (the default without 9.0a code): 40 with 96-deep k tiles, the
// last one's mma only over its data; 75: 74 traced; 79: 74 without refills (a diagnostic: wrong
// results); 85: 74's loop fed by a producer warpgroup (sm_90a: setmaxnreg), the warps releasing
// stages by mbarrier arrives; 88: 85 with a in a 64- and a 32-wide box and L2 fetches of 256
// bytes; 91: 85 persistent, 64 deep, the next tile's stages filled while the last one is
// stored; 92: 91 not persistent; 98: 91 with odd tile-row groups walking their columns right to
// left; 99 (the default with 9.0a code): 98 with odd m16 rows taking their n8 tiles in reverse.
// The other numbers up to 97: removed (no gain, could not launch, or diagnostics; launch_cfg's
// comment in matmul_mma.cu and the tuning README say what they were).
int matmul_mma_cuda_config(const GemmParams& p, void* stream, int config);
// float16/bfloat16, sm_90a (built only when the arch list has 9.0a: OPFORGE_HAS_SM90A). b either
// by rows (p.b_cs == 1: row stride p.b_rs) or by columns (p.b_rs == 1: the rows of b^T, row stride
// p.b_cs); a by rows. The row strides and batch strides multiples of 8 elements and not 0, bases
// 16-byte aligned (TMA descriptors).
int matmul_wgmma_cuda(const GemmParams& p, void* stream);
// The same with a fixed tile configuration (for tuning; -1 picks as matmul_wgmma_cuda does):
// 0: 128 x 128 tiles; 1: 128 x 256; 2: 128 x 256 in clusters of 2 sharing b; 3: 128 x 256 with
// the results stored by TMA while the next tile runs (where c's layout allows, else as 1).
int matmul_wgmma_cuda_config(const GemmParams& p, void* stream, int config);

}  // namespace opforge
