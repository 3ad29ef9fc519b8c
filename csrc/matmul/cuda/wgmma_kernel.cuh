// matmul rung 6, "wgmma" (float16/bfloat16, sm_90a: H100/H200): Hopper's warpgroup MMA fed by
// the tensor memory accelerator, warp-specialised, persistent (no torch).
//  - Persistent: as many blocks as fit (one per SM) loop over 128 x kBlockN output tiles, taken in
//    groups of 8 tile rows so that the blocks running at once share a and b panels in L2.
//  - Warpgroup 0 is the producer: one thread issues TMA copies of the next 64-deep tiles of a and
//    of b into a ring of shared buffers (128-byte swizzle, zero-filled outside the matrices),
//    each stage guarded by a "full" and an "empty" mbarrier. It gives most of its registers away
//    (setmaxnreg).
//  - kCluster > 1 (tuning only: it gained nothing): clusters of blocks on tiles in the same
//    columns, each loading 1 / kCluster of the b tile and multicasting it into every block of the
//    cluster; a stage is free again once the consumers of every block have released it.
//  - Warpgroups 1 and 2 are consumers, 64 rows of the tile each: per stage 4 wgmma.m64nNk16
//    reading both operands from shared memory through matrix descriptors, accumulating in
//    kBlockN / 2 float registers a thread. One stage's wgmmas stay in flight while the next
//    stage's are issued (wait_group 1); the stage before is released then. After the last k tile
//    they round the tile to 16 bits and store it: by TMA from shared staging buffers while the
//    next tile runs (kTmaStore, where c's layout allows), else pairs from registers.
// a is read by rows (K-major). b either by rows too (kBNMajor, MN-major: a @ b with b row-major,
// 64 x 64 boxes of b, wgmma told to transpose) or by columns (K-major: rows of b^T, as x @ w.t()
// gives them). TMA needs 16-byte global strides: the launcher pads what does not have them.
// Without sm_90a device code the kernel traps and matmul_wgmma_available() says false.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/launch.cuh"
#include "common/cuda/mbarrier.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/pipeline.cuh"
#include "common/cuda/swizzle.cuh"
#include "common/cuda/tile_order.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"
#include "matmul/matmul_params.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPFORGE_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace wgmma {

constexpr int kBM = 128, kBK = 64;
constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kGroupRows = 8;  // tile rows (of clusters) per group of the tile order

// The shipped configurations (the launcher takes Wide where there are at least half as many
// 128 x 256 tiles as SMs: measured faster from 2048^3 up); benchmarks/tuning/matmul/ derives candidates.
struct WideTraits {
  static constexpr int kBlockN = 256;  // 128 x 256 tiles: wgmma.m64n256k16, a 4-stage ring
  static constexpr int kCluster = 1;   // blocks sharing b by multicast
};
struct NarrowTraits {
  static constexpr int kBlockN = 128;  // 128 x 128 tiles: a 6-stage ring
  static constexpr int kCluster = 1;
};

template <int BN, int kCluster>
struct Config {
  static constexpr int kTileBytesA = kBM * kBK * 2, kTileBytesB = BN * kBK * 2;
  static constexpr int kStageBytes = kTileBytesA + kTileBytesB;
  static constexpr int kStages =
      196608 / kStageBytes;  // a 192 KB ring: 4 stages of 128 x 256, 6 of 128 x 128
  static constexpr int kSmemBytes =
      kStages * kStageBytes + 1024 /* alignment */ + 2 * kStages * 8 /* barriers */;
  static constexpr int kRowsB = BN / kCluster;          // rows of the b^T tile each block of a cluster loads
  static constexpr int kStoreBytes = 2 * 64 * 128 * 2;  // the TMA-store epilogue's buffers
  static_assert(kRowsB <= 256 && kTileBytesA % 1024 == 0 && (kRowsB * kBK * 2) % 1024 == 0,
                "TMA box / swizzle atoms");
};

// kTmaStore: the epilogue writes each consumer's results, 64 x 128 at a time, into its own
// 16 KB shared buffer (128-byte swizzle, as TMA reads it) and one thread sends them to c with bulk
// tensor stores that complete while the next tile's wgmmas run; needs c's strides in multiples
// of 8 elements and a 16-byte aligned base. Otherwise each thread stores its pairs of columns.
// kBNMajor: b read by rows (64 x 64 boxes, BN / 64 of them a stage) instead of rows of b^T.
template <typename Traits, typename T, bool kTmaStore, bool kBNMajor>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_bt,
                        const __grid_constant__ CUtensorMap map_c, T* __restrict__ c, int m, int n, int k,
                        int batch, int64_t ldc, int64_t c_bs) {
#ifdef OPFORGE_WGMMA_DEVICE
  constexpr int BN = Traits::kBlockN, kCluster = Traits::kCluster;
  using C = Config<BN, kCluster>;
  static_assert(!kBNMajor || kCluster == 1, "b by rows is not multicast");
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes;
  using cuda::smem_addr;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = cuda::align_shared<1024>(smem_raw);
  unsigned char* const c_stage = smem + kStages * kStageBytes;  // kTmaStore: 2 x 16 KB
  uint64_t* full = reinterpret_cast<uint64_t*>(c_stage + (kTmaStore ? C::kStoreBytes : 0));
  const cuda::Pipeline<kStages> pipe{full, full + kStages};
  using State = cuda::PipelineState<kStages>;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const uint32_t rank = kCluster > 1 ? cuda::cluster_ctarank() : 0;
  if (threadIdx.x == 0) {
    pipe.init(2 * kCluster);  // one arrival per consumer warpgroup of the cluster
    cuda::fence_mbarrier_init();
  }
  if constexpr (kCluster > 1)
    cuda::cluster_sync();  // no block multicasts into barriers not yet set up
  else
    __syncthreads();

  const int tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + BN - 1) / BN;
  const int groups_m = (tiles_m + kCluster - 1) / kCluster;
  const int units = groups_m * tiles_n * batch, k_tiles = (k + kBK - 1) / kBK;
  const int first_unit = blockIdx.x / kCluster, unit_step = gridDim.x / kCluster;
  if (wg == 0) {  // producer
    cuda::setmaxnreg_dec<40>();
    if (t == 0) {
      State w;
      for (int u = first_unit; u < units; u += unit_step) {
        int b, gm, nt;
        cuda::batched_grouped_tile<kGroupRows>(u, groups_m, tiles_n, b, gm, nt);
        const int m0 = (gm * kCluster + static_cast<int>(rank)) * kBM, n0 = nt * BN;
        for (int kt = 0; kt < k_tiles; ++kt, w.advance()) {
          pipe.producer_acquire(w);  // (the first pass finds every stage free)
          const uint32_t stage = smem_addr(smem + w.index * kStageBytes);
          const uint32_t bar =
              pipe.producer_commit(w, kStageBytes);  // a, and all of b (part from the other blocks)
          cuda::tma_load_3d(stage, &map_a, kt * kBK, m0, b, bar);
          if constexpr (kBNMajor) {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)  // (64 k x 64 n) boxes of b, 8 KB apart
              cuda::tma_load_3d(stage + C::kTileBytesA + j * 8192, &map_bt, n0 + j * 64, kt * kBK, b, bar);
          } else if constexpr (kCluster == 1) {
            cuda::tma_load_3d(stage + C::kTileBytesA, &map_bt, kt * kBK, n0, b, bar);
          } else {
            cuda::tma_load_3d_multicast(stage + C::kTileBytesA + rank * (C::kRowsB * kBK * 2), &map_bt,
                                        kt * kBK, n0 + static_cast<int>(rank) * C::kRowsB, b, bar,
                                        static_cast<uint16_t>((1u << kCluster) - 1));
          }
        }
      }
    }
    __syncwarp();
  } else {
    // consumers: warpgroup 1 takes rows 0-63 of the tile, warpgroup 2 rows 64-127
    cuda::setmaxnreg_inc<232>();
    const int half = wg - 1, warp = t / 32, lane = t % 32;
    auto release = [&](const State& st) {
      if (t != 0) return;
      if constexpr (kCluster == 1) {
        pipe.consumer_release(st);
      } else {
        pipe.template consumer_release_cluster<kCluster>(st);
      }
    };
    float d[BN / 2];
    State r, prev;  // the stage read now, and the one before it
    for (int u = first_unit; u < units; u += unit_step) {
      int b, gm, nt;
      cuda::batched_grouped_tile<kGroupRows>(u, groups_m, tiles_n, b, gm, nt);
      const int m0 = (gm * kCluster + static_cast<int>(rank)) * kBM, n0 = nt * BN;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
      for (int kt = 0; kt < k_tiles; ++kt, r.advance()) {
        pipe.consumer_wait(r);
        const unsigned char* stage = smem + r.index * kStageBytes;
        const unsigned char* a_tile = stage + half * (64 * kBK * 2);
        const unsigned char* b_tile = stage + C::kTileBytesA;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) cuda::fence_operand(d[i]);
        cuda::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {  // a: 16 deep = 32 bytes along the swizzled 128-byte rows
          if constexpr (kBNMajor)                // b: 16 rows of 128 bytes
            cuda::Wgmma<T, BN>::template mma<1>(d, cuda::smem_desc_k_major(a_tile + kk * 32),
                                                cuda::smem_desc_mn_major(b_tile + kk * 2048), 1);
          else
            cuda::Wgmma<T, BN>::template mma<0>(d, cuda::smem_desc_k_major(a_tile + kk * 32),
                                                cuda::smem_desc_k_major(b_tile + kk * 32), 1);
        }
        cuda::wgmma_commit();
        cuda::wgmma_wait<1>();  // this stage's wgmmas may still run; the previous stage's are done
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) cuda::fence_operand(d[i]);
        if (kt > 0) release(prev);
        prev = r;
      }
      cuda::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) cuda::fence_operand(d[i]);
      if (k_tiles > 0) release(prev);
      // d[4j..4j+3]: rows (warp*16 + lane/4) and +8, columns 8j + 2*(lane%4) + {0, 1}
      if constexpr (kTmaStore) {
        unsigned char* const buf = c_stage + half * 16384;
#pragma unroll
        for (int part = 0; part < BN / 128; ++part) {
          if (t == 0) cuda::bulk_wait_group_read();  // the previous store has read the buffer
          cuda::named_barrier_sync<128>(1 + half);
#pragma unroll
          for (int jj = 0; jj < 16; ++jj) {  // 8-column groups; two 64 x 64 boxes of 128-byte rows
            const int j = part * 16 + jj, box = jj / 8, chunk = jj % 8;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int row = warp * 16 + lane / 4 + h * 8;
              cuda::stage_pair_swizzle128(smem_addr(buf + box * 8192), row, chunk, lane,
                                          cuda::pack2<T>(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]));
            }
          }
          cuda::fence_proxy_async_shared();
          cuda::named_barrier_sync<128>(1 + half);
          if (t == 0) {
            cuda::tma_store_3d(&map_c, smem_addr(buf), n0 + part * 128, m0 + half * 64, b);
            cuda::tma_store_3d(&map_c, smem_addr(buf + 8192), n0 + part * 128 + 64, m0 + half * 64, b);
            cuda::bulk_commit_group();
          }
        }
        continue;
      }
      T* out = c + static_cast<int64_t>(b) * c_bs;
      const bool pairs = ((ldc | c_bs) & 1) == 0 && reinterpret_cast<uintptr_t>(c) % 4 == 0;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = n0 + j * 8 + (lane % 4) * 2;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + half * 64 + warp * 16 + lane / 4 + h * 8;
          if (row < m && col < n) {
            cuda::store_pair<T>(out + row * ldc + col, d[4 * j + 2 * h], d[4 * j + 2 * h + 1],
                                pairs && col + 1 < n);
            if (!pairs && col + 1 < n)
              cuda::store_pair<T>(out + row * ldc + col + 1, d[4 * j + 2 * h + 1], 0.f, false);
          }
        }
      }
    }
  }
  if constexpr (kTmaStore) {
    if (wg > 0 && t == 0) cuda::bulk_wait_group();
  }
  // No block leaves while another may still arrive on its barriers or write into its ring.
  if constexpr (kCluster > 1) cuda::cluster_sync();
#else
  __trap();  // no sm_90a code in this binary: never return an unwritten output
#endif  // OPFORGE_WGMMA_DEVICE
}

template <typename Traits, bool kTmaStore>
constexpr int smem_bytes() {
  using C = Config<Traits::kBlockN, Traits::kCluster>;
  return C::kSmemBytes + (kTmaStore ? C::kStoreBytes : 0);
}

// Sets the kernel up for the current device: cudaSuccess, or cudaErrorNoKernelImageForDevice when
// the binary has no sm_90a code for it (setmaxnreg moves registers between the warpgroups of a
// block: 128 x 40 + 256 x 232 needs the block to start with at least 168 a thread, or the
// consumers wait for ever; the trap-only kernel of another build has far fewer).
template <typename Traits, typename T, bool kTmaStore, bool kBNMajor>
cudaError_t prepare() {
  static signed char configured[64] = {};
  const cudaError_t err = cuda::configure_once(
      matmul_wgmma_kernel<Traits, T, kTmaStore, kBNMajor>, smem_bytes<Traits, kTmaStore>(), configured,
      [](const cudaFuncAttributes& a) { return a.ptxVersion >= 90 && (a.numRegs + 7) / 8 * 8 >= 168; });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

// A (rows x k) row-major operand per batch as a 3-D map (k, rows, batch), boxes of 64 x box_rows.
inline bool make_map(CUtensorMap* map, const void* base, DType dtype, int64_t rows, int64_t k, int64_t batch,
                     int64_t ld, int64_t bs, uint32_t box_rows) {
  return cuda::make_tma_map_16bit(map, base, dtype, rows, k, batch, ld, bs, kBK, box_rows);
}

template <typename Traits, typename T, bool kTmaStore, bool kBNMajor>
cudaError_t launch(const GemmParams& p, cudaStream_t stream) {
  constexpr int BN = Traits::kBlockN, kCluster = Traits::kCluster;
  using C = Config<BN, kCluster>;
  CUtensorMap map_a{}, map_bt{}, map_c{};
  if (!make_map(&map_a, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, kBM)) return cudaErrorInvalidValue;
  // b by rows: (k, n) with row stride b_rs; else b^T's rows: (n, k) with row stride b_cs.
  if (kBNMajor ? !make_map(&map_bt, p.b, p.dtype, p.k, p.n, p.batch, p.b_rs, p.b_bs, 64)
               : !make_map(&map_bt, p.b, p.dtype, p.n, p.k, p.batch, p.b_cs, p.b_bs, C::kRowsB))
    return cudaErrorInvalidValue;
  // c as (n, m, batch) in 64 x 64 boxes (the same shape of map as the operands': columns inner).
  if (kTmaStore && !make_map(&map_c, p.c, p.dtype, p.m, p.n, p.batch, p.c_rs, p.c_bs, 64))
    return cudaErrorInvalidValue;
  const auto kernel = matmul_wgmma_kernel<Traits, T, kTmaStore, kBNMajor>;
  cudaError_t err = prepare<Traits, T, kTmaStore, kBNMajor>();
  if (err != cudaSuccess) return err;
  const int64_t tiles_m = (p.m + kBM - 1) / kBM, tiles_n = (p.n + BN - 1) / BN;
  const int64_t units = (tiles_m + kCluster - 1) / kCluster * tiles_n * p.batch;
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes<Traits, kTmaStore>();
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  int slots = 0;  // clusters that fit at once
  if (kCluster > 1) {
    config.gridDim = dim3(kCluster);
    err = cudaOccupancyMaxActiveClusters(&slots, kernel, &config);
    if (err != cudaSuccess) return err;
  } else {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&slots, cudaDevAttrMultiProcessorCount, dev);
  }
  if (slots < 1) return cudaErrorInvalidConfiguration;
  config.gridDim = dim3(static_cast<unsigned>((units < slots ? units : slots) * kCluster));
  return cudaLaunchKernelEx(&config, kernel, map_a, map_bt, map_c, static_cast<T*>(p.c),
                            static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k),
                            static_cast<int>(p.batch), p.c_rs, p.c_bs);
}

}  // namespace wgmma
}  // namespace opforge
