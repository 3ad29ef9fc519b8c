// attention CUDA forward for Hopper (sm_90a): warp-specialised, TMA + mbarrier + wgmma. One block
// per 128 queries of one (batch, head) and three warpgroups:
//   producer (warp 0 of warpgroup 0, few registers): TMA of the Q tile once, then of the K and V
//     tiles of every key tile the pattern leaves visible into a kStages ring (full_k / full_v
//     barriers count the bytes; empty barriers hand a stage back);
//   consumers (warpgroups 1 and 2, 64 query rows each): S = Q K^T by wgmma with both operands in
//     shared memory, the partial tiles' masked elements -inf, online softmax in registers
//     (attention_mma_common.cuh's, same accumulator layout as mma.sync), then O += P V by wgmma
//     with P from registers and V read MN-major; the two warpgroups' softmax and matrix products
//     overlap on the SM.
// Tiles are 128-byte swizzled boxes of 64 columns (TMA writes them, wgmma descriptors read them);
// rows past the sequence come in as zeros. Both roles walk the same visible tiles (KeyWalk).
// Without sm_90a device code the kernel traps; the launcher's rule (attention_heuristics.h) asks
// hopper_status() first and takes the mma.sync kernel there.
#pragma once

#include <cuda.h>

#include "attention/cuda/attention_hopper_common.cuh"
#include "attention/cuda/attention_mma_common.cuh"
#include "common/cuda/mbarrier.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPFORGE_ATTENTION_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace attention_cuda {

template <int kD_, int kBlockN_, int kStages_>
struct HopperFwdTraits {
  static constexpr int kD = kD_, kBlockM = 128, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kThreads = 384;       // producer warpgroup + 2 consumer warpgroups
  static constexpr int kPanels = kD / 64;    // 64-column (128-byte) boxes a row
  static constexpr int kQPanelBytes = kBlockM * 128, kKVPanelBytes = kBlockN * 128;
  static constexpr int kQBytes = kPanels * kQPanelBytes, kKVBytes = kPanels * kKVPanelBytes;
  static constexpr int kStageBytes = 2 * kKVBytes;  // K then V
  static constexpr int kSmemBytes = 1024 /* alignment */ + kQBytes + kStages * kStageBytes + (1 + 3 * kStages) * 8;
  static_assert(kBlockN <= 256 && kSmemBytes <= 227 * 1024, "TMA box rows / shared memory");
};
using HopperFwdTraitsD64 = HopperFwdTraits<64, 128, 3>;
using HopperFwdTraitsD128 = HopperFwdTraits<128, 128, 2>;
using HopperFwdTraitsD256 = HopperFwdTraits<256, 64, 2>;

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_fwd_hopper_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                                const __grid_constant__ CUtensorMap map_v, const AttentionCudaArgs a) {
#ifdef OPFORGE_ATTENTION_WGMMA_DEVICE
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kNT = kBN / 8, kDT = kD / 8;
  using cuda::smem_addr;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = cuda::align_shared<1024>(smem_raw);
  unsigned char* const sQ = smem;
  unsigned char* const sKV = smem + Tr::kQBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sKV + kStages * Tr::kStageBytes);
  uint64_t* const bar_q = bars;
  uint64_t* const full_k = bars + 1;
  uint64_t* const full_v = full_k + kStages;
  uint64_t* const empty = full_v + kStages;
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t qb = gridDim.x - 1 - blockIdx.x;  // the last query blocks (the most keys when causal) first
  const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(bar_q), 1);
    for (int s = 0; s < kStages; ++s) {
      cuda::mbar_init(smem_addr(&full_k[s]), 1);
      cuda::mbar_init(smem_addr(&full_v[s]), 1);
      cuda::mbar_init(smem_addr(&empty[s]), 2);  // one arrival per consumer warpgroup
    }
    cuda::fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    cuda::setmaxnreg_dec<40>();
    if (warp != 0) return;
    KeyWalk<kBN, kD, 32, T> walk(p, b, h, i0, i1);
    const int hk = static_cast<int>(h / (p.heads / p.kv_heads));
    if (lane == 0) {
      cuda::mbar_arrive_expect_tx(smem_addr(bar_q), Tr::kQBytes);
#pragma unroll
      for (int pn = 0; pn < Tr::kPanels; ++pn) {
        cuda::tma_load_4d(smem_addr(sQ + pn * Tr::kQPanelBytes), &map_q, pn * 64, static_cast<int>(i0),
                          static_cast<int>(h), static_cast<int>(b), smem_addr(bar_q));
      }
    }
    TileClass tc;
    int it = 0;
    for (int tile = walk.next(walk.begin, tc, lane); tile < walk.end; tile = walk.next(tile + 1, tc, lane), ++it) {
      const int s = it % kStages;
      if (lane == 0) {
        cuda::mbar_wait(smem_addr(&empty[s]), ((it / kStages) & 1) ^ 1);  // the first pass finds every stage free
        unsigned char* const sK = sKV + s * Tr::kStageBytes;
        cuda::mbar_arrive_expect_tx(smem_addr(&full_k[s]), Tr::kKVBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
          cuda::tma_load_4d(smem_addr(sK + pn * Tr::kKVPanelBytes), &map_k, pn * 64, tile * kBN, hk,
                            static_cast<int>(b), smem_addr(&full_k[s]));
        }
        cuda::mbar_arrive_expect_tx(smem_addr(&full_v[s]), Tr::kKVBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
          cuda::tma_load_4d(smem_addr(sK + Tr::kKVBytes + pn * Tr::kKVPanelBytes), &map_v, pn * 64, tile * kBN, hk,
                            static_cast<int>(b), smem_addr(&full_v[s]));
        }
      }
      __syncwarp();
    }
    return;
  }

  // consumers: warpgroup 1 takes query rows 0-63 of the block, warpgroup 2 rows 64-127
  cuda::setmaxnreg_inc<232>();
  const int half = wg - 1;
  const int64_t row0 = i0 + half * 64 + warp * 16;  // this warp's first query row
  KeyWalk<kBN, kD, 32, T> walk(p, b, h, i0, i1);
  float o[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.f, 0.f};
  cuda::mbar_wait(smem_addr(bar_q), 0);
  const unsigned char* q_rows = sQ + half * 64 * 128;

  TileClass tc;
  int it = 0;
  for (int tile = walk.next(walk.begin, tc, lane); tile < walk.end; ++it) {
    const int s = it % kStages;
    const uint32_t parity = (it / kStages) & 1;
    const unsigned char* sK = sKV + s * Tr::kStageBytes;
    const unsigned char* sV = sK + Tr::kKVBytes;
    float sc[kNT][4];
    cuda::mbar_wait(smem_addr(&full_k[s]), parity);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {  // 16 deep = 32 bytes along the swizzled 128-byte rows
      const int pn = kk / 4, off = (kk % 4) * 32;
      cuda::Wgmma<T, kBN>::template mma<0>(&sc[0][0], cuda::smem_desc_k_major(q_rows + pn * Tr::kQPanelBytes + off),
                                           cuda::smem_desc_k_major(sK + pn * Tr::kKVPanelBytes + off), kk > 0);
    }
    cuda::wgmma_commit();
    uint32_t mask_rows[2];  // a partial block-mask tile's bits, read while S is computed
    if (tc.mask) mask_rows_ahead<kBN>(pat, b, h, row0, int64_t{tile} * kBN, lane, mask_rows);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(sc);
    // The next visible tile (the producer finds the same), while nothing is in flight.
    TileClass tn_class;
    const int tn = walk.next(tile + 1, tn_class, lane);

    scores_log2(sc, a);
    if (tc.kind == BlockKind::kPartial) {
      mask_tile<false, kBN>(sc, pat, tc, b, h, row0, int64_t{tile} * kBN, lane, mask_rows);
    }
    online_softmax(sc, o, m_run, l_run);
    uint32_t pa[kBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) acc_to_a<T>(pa[kk], sc, kk);
    cuda::fence_operands(o);
    cuda::mbar_wait(smem_addr(&full_v[s]), parity);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {  // 16 keys = 16 rows of 128 bytes
      cuda::WgmmaRS<T, kD>::template mma<1>(&o[0][0], pa[kk], cuda::smem_desc_mn_major(sV + kk * 2048, Tr::kKVPanelBytes),
                                            1);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();
    cuda::fence_operands(o);
    if (t == 0) cuda::mbar_arrive(smem_addr(&empty[s]));
    tile = tn;
    tc = tn_class;
  }

  // Epilogue: O / l through this warpgroup's rows of the Q tile (only it reads them); the LSE by
  // the quad's first lane.
  float inv[2];
  finish_rows(m_run, l_run, inv, p, b, h, row0, lane);
  store_accumulator_rows<kD, T>(o, inv, sQ + half * 64 * 128, Tr::kQPanelBytes,
                                static_cast<T*>(p.out) + b * p.o_bs + h * p.o_hs, p.o_ss, i0 + half * 64, pat.sq, t,
                                1 + half);
#else
  __trap();
#endif
}

// The kernel's one-time setup on the current device (prepare_hopper).
template <typename Tr, typename T>
cudaError_t prepare_hopper_fwd() {
  static signed char state[64] = {};
  return prepare_hopper(attention_fwd_hopper_kernel<Tr, T>, Tr::kSmemBytes, state);
}

// cudaSuccess where this binary runs the Hopper kernels on the current GPU, else
// cudaErrorNoKernelImageForDevice (every Hopper kernel is built for the same arches, so one stands
// for all).
template <typename Tr>
int hopper_status() {
  return prepare_hopper_fwd<Tr, __nv_bfloat16>();
}

template <typename Tr, typename T>
cudaError_t launch_hopper_fwd(const AttentionCudaArgs& a, cudaStream_t stream) {
  const cudaError_t err = prepare_hopper_fwd<Tr, T>();
  if (err != cudaSuccess) return err;
  CUtensorMap mq, mk, mv;
  if (!make_attention_maps(a, Tr::kD, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv)) return cudaErrorInvalidValue;
  const AttentionParams& p = a.g.fwd;
  const dim3 grid(static_cast<unsigned>((p.pattern.sq + Tr::kBlockM - 1) / Tr::kBlockM),
                  static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
  attention_fwd_hopper_kernel<Tr, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, a);
  return cudaGetLastError();
}

template <typename Tr>
int run_hopper_fwd(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16: return launch_hopper_fwd<Tr, __nv_bfloat16>(a, s);
    case DType::kFloat16: return launch_hopper_fwd<Tr, __half>(a, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace attention_cuda
}  // namespace opforge
