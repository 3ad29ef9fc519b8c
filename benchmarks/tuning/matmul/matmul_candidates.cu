// The matmul tuning library (benchmarks/tuning/matmul/matmul_tune.py builds it; no torch): the
// product's kernel headers instantiated with candidate traits, each by name. A candidate is the
// shipped traits of a kernel with named changes ("mma_ws.no_snake" = mma::WsTraits without the
// serpentine orders); LOG.md gives each one's measurements. The shipped configurations are here
// under the kernels' own names (wgmma's: "wgmma.wide_tma_store" from 2048^3 up, "wgmma.narrow"
// below), so a run times them next to their candidates.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "matmul/cuda/mma_cp_async_kernel.cuh"
#include "matmul/cuda/mma_tma_kernel.cuh"
#include "matmul/cuda/mma_ws_kernel.cuh"
#include "matmul/cuda/warp_tiled_kernel.cuh"
#include "matmul/cuda/wgmma_kernel.cuh"
#include "matmul/matmul_params.h"

namespace opforge {
namespace tuning {

// ---- the TMA kernel's timeline (matmul_tune.py --trace) --------------------------------------
// Per block (the first kTraceBlocks), warp and k tile: the SM clock when the warp released the
// tile's stage ([0]) and when the tile's data had landed for it ([1]); per k tile, when its fill
// was issued ([2], in warp 0's slot).
constexpr int kTraceBlocks = 16, kTraceTiles = 64;
__device__ unsigned long long g_timeline[kTraceBlocks][8][kTraceTiles][3];

struct TimelineHooks {
  static __device__ __forceinline__ void stamp(int warp, int tile, int event) {
    const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (block < kTraceBlocks && tile < kTraceTiles) g_timeline[block][warp][tile][event] = clock64();
  }
  static __device__ __forceinline__ void issued(int k_tile) { stamp(0, k_tile, 2); }
  static __device__ __forceinline__ void released(int warp, int k_tile) { stamp(warp, k_tile, 0); }
  static __device__ __forceinline__ void landed(int warp, int k_tile) { stamp(warp, k_tile, 1); }
};

// ---- candidates --------------------------------------------------------------------------------

namespace wt = warp_tiled;
struct StagedK8TwoBlocks : wt::StagedTraits {
  static constexpr int kBlockK = 8, kMinBlocksPerSm = 2;
};
struct StagedK16TwoBlocks : wt::StagedTraits {
  static constexpr int kMinBlocksPerSm = 2;  // spills
};
struct StagedK8 : wt::StagedTraits {
  static constexpr int kBlockK = 8;
};
struct StagedN256K8 : wt::StagedTraits {
  static constexpr int kBlockN = 256, kBlockK = 8;
};
struct CpAsyncK16 : wt::CpAsyncTraits {
  static constexpr int kBlockK = 16;
};

struct MmaCpAsyncStages4K32 : mma::CpAsyncTraits {
  static constexpr int kStages = 4, kBlockK = 32;
};
struct MmaCpAsyncStages4 : mma::CpAsyncTraits {
  static constexpr int kStages = 4;
};
struct MmaCpAsyncN128 : mma::CpAsyncTraits {
  static constexpr int kBlockN = 128;  // two blocks per SM
};

struct MmaTmaK64 : mma::TmaTraits {  // 64-deep k tiles, every step of the last one run
  static constexpr int kBlockK = 64;
  static constexpr bool kTrimLastTile = false;
};
struct MmaTmaK64RowOrder : MmaTmaK64 {
  static constexpr int kGroupRows = 0;
};
struct MmaTmaK64Stages4RowOrder : MmaTmaK64RowOrder {
  static constexpr int kStages = 4;
};
struct MmaTmaTraced : mma::TmaTraits {
  using Hooks = TimelineHooks;
};
struct MmaTmaK64Traced : MmaTmaK64 {
  using Hooks = TimelineHooks;
};

struct MmaWsNoSnake : mma::WsTraits {
  static constexpr bool kSnakeTiles = false, kSnakeMma = false;
};
struct MmaWsSnakeTiles : mma::WsTraits {
  static constexpr bool kSnakeMma = false;
};
struct MmaWsNotPersistent : MmaWsNoSnake {
  static constexpr bool kPersistent = false;
};
struct MmaWsK96 : MmaWsNotPersistent {  // 96-deep k tiles (three 32-wide a boxes), 128-byte L2 fetches
  static constexpr int kBlockK = 96;
  static constexpr bool kL2Fetch256 = false;
};
struct MmaWsK96SplitA : MmaWsK96 {  // a in a 64- and a 32-wide box, 256-byte L2 fetches
  static constexpr bool kSplitABox = true, kL2Fetch256 = true;
};

struct WgmmaWideCluster2 : wgmma::WideTraits {
  static constexpr int kCluster = 2;
};

// wgmma candidates read b by rows or by columns, as the call's strides say.
template <typename Traits, bool kTmaStore, typename T>
cudaError_t wgmma_layout(const GemmParams& p, cudaStream_t s) {
  if (p.b_cs == 1 && p.b_rs != 1) {
    if constexpr (Traits::kCluster > 1) return cudaErrorInvalidValue;  // multicast: rows of b^T only
    else return wgmma::launch<Traits, T, kTmaStore, true>(p, s);
  }
  if (p.b_rs == 1) return wgmma::launch<Traits, T, kTmaStore, false>(p, s);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t run_half(const std::string& name, const GemmParams& p, cudaStream_t s) {
  if (name == "mma_cp_async") return mma::launch_cp_async<mma::CpAsyncTraits, T>(p, s);
  if (name == "mma_cp_async.stages4_k32") return mma::launch_cp_async<MmaCpAsyncStages4K32, T>(p, s);
  if (name == "mma_cp_async.stages4") return mma::launch_cp_async<MmaCpAsyncStages4, T>(p, s);
  if (name == "mma_cp_async.n128") return mma::launch_cp_async<MmaCpAsyncN128, T>(p, s);
  if (name == "mma_tma") return mma::launch_tma<mma::TmaTraits, T>(p, s);
  if (name == "mma_tma.k64") return mma::launch_tma<MmaTmaK64, T>(p, s);
  if (name == "mma_tma.k64_row_order") return mma::launch_tma<MmaTmaK64RowOrder, T>(p, s);
  if (name == "mma_tma.k64_stages4_row_order") return mma::launch_tma<MmaTmaK64Stages4RowOrder, T>(p, s);
  if (name == "mma_tma.traced") return mma::launch_tma<MmaTmaTraced, T>(p, s);
  if (name == "mma_tma.k64_traced") return mma::launch_tma<MmaTmaK64Traced, T>(p, s);
  if (name == "mma_ws") return mma::launch_ws<mma::WsTraits, T>(p, s);
  if (name == "mma_ws.no_snake") return mma::launch_ws<MmaWsNoSnake, T>(p, s);
  if (name == "mma_ws.snake_tiles") return mma::launch_ws<MmaWsSnakeTiles, T>(p, s);
  if (name == "mma_ws.not_persistent") return mma::launch_ws<MmaWsNotPersistent, T>(p, s);
  if (name == "mma_ws.k96") return mma::launch_ws<MmaWsK96, T>(p, s);
  if (name == "mma_ws.k96_split_a") return mma::launch_ws<MmaWsK96SplitA, T>(p, s);
  if (name == "wgmma.narrow") return wgmma_layout<wgmma::NarrowTraits, false, T>(p, s);
  if (name == "wgmma.wide") return wgmma_layout<wgmma::WideTraits, false, T>(p, s);
  if (name == "wgmma.wide_tma_store") return wgmma_layout<wgmma::WideTraits, true, T>(p, s);
  if (name == "wgmma.wide_cluster2") return wgmma_layout<WgmmaWideCluster2, false, T>(p, s);
  return cudaErrorInvalidValue;
}

cudaError_t run_fp32(const std::string& name, const GemmParams& p, cudaStream_t s) {
  if (name == "warp_tiled_staged") return wt::launch_staged<wt::StagedTraits>(p, s);
  if (name == "warp_tiled_staged.k8_two_blocks") return wt::launch_staged<StagedK8TwoBlocks>(p, s);
  if (name == "warp_tiled_staged.k16_two_blocks") return wt::launch_staged<StagedK16TwoBlocks>(p, s);
  if (name == "warp_tiled_staged.k8") return wt::launch_staged<StagedK8>(p, s);
  if (name == "warp_tiled_staged.n256_k8") return wt::launch_staged<StagedN256K8>(p, s);
  if (name == "warp_tiled_cp_async") return wt::launch_cp_async<wt::CpAsyncTraits>(p, s);
  if (name == "warp_tiled_cp_async.k16") return wt::launch_cp_async<CpAsyncK16>(p, s);
  return cudaErrorInvalidValue;
}

}  // namespace tuning
}  // namespace opforge

// The candidates' names, comma-separated.
extern "C" const char* opforge_tune_candidates() {
  return "warp_tiled_staged,warp_tiled_staged.k8_two_blocks,warp_tiled_staged.k16_two_blocks,warp_tiled_staged.k8,"
         "warp_tiled_staged.n256_k8,warp_tiled_cp_async,warp_tiled_cp_async.k16,"
         "mma_cp_async,mma_cp_async.stages4_k32,mma_cp_async.stages4,mma_cp_async.n128,"
         "mma_tma,mma_tma.k64,mma_tma.k64_row_order,mma_tma.k64_stages4_row_order,mma_tma.traced,mma_tma.k64_traced,"
         "mma_ws,mma_ws.no_snake,mma_ws.snake_tiles,mma_ws.not_persistent,mma_ws.k96,mma_ws.k96_split_a,"
         "wgmma.narrow,wgmma.wide,wgmma.wide_tma_store,wgmma.wide_cluster2";
}

// Runs candidate `name` on row-major a (batch, m, k) and b (b_rs, b_cs: by rows or by columns),
// c (batch, m, n) contiguous; dtype: 0 float32, 2 float16, 3 bfloat16 (opforge::DType). Returns
// a cudaError_t.
extern "C" int opforge_tune_matmul(const char* name, const void* a, const void* b, void* c, int64_t batch, int64_t m,
                                   int64_t n, int64_t k, int64_t a_rs, int64_t b_rs, int64_t b_cs, int64_t c_rs,
                                   int64_t a_bs, int64_t b_bs, int64_t c_bs, int dtype, void* stream) {
  opforge::GemmParams p;
  p.a = a;
  p.b = b;
  p.c = c;
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a_rs = a_rs;
  p.a_cs = 1;
  p.b_rs = b_rs;
  p.b_cs = b_cs;
  p.c_rs = c_rs;
  p.a_bs = a_bs;
  p.b_bs = b_bs;
  p.c_bs = c_bs;
  p.dtype = static_cast<opforge::DType>(dtype);
  const auto s = static_cast<cudaStream_t>(stream);
  const std::string n_ = name;
  switch (p.dtype) {
    case opforge::DType::kFloat32: return opforge::tuning::run_fp32(n_, p, s);
    case opforge::DType::kBFloat16: return opforge::tuning::run_half<__nv_bfloat16>(n_, p, s);
    case opforge::DType::kFloat16: return opforge::tuning::run_half<__half>(n_, p, s);
    default: return cudaErrorInvalidValue;
  }
}

// Copies the last traced run's timeline to host memory.
extern "C" int opforge_tune_mma_trace(void* dst, size_t bytes) {
  if (bytes > sizeof(opforge::tuning::g_timeline)) return cudaErrorInvalidValue;
  return cudaMemcpyFromSymbol(dst, opforge::tuning::g_timeline, bytes);
}
