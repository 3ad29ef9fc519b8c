// matmul rung 6, "wgmma" (float16/bfloat16, sm_90a: H100/H200): Hopper's warpgroup MMA fed by
// the tensor memory accelerator, warp-specialised, persistent, in clusters that share b.
//  - Persistent: as many blocks as fit (one per SM) loop over 128 x BN output tiles, taken in
//    groups of 8 tile rows so that the blocks running at once share a and b panels in L2.
//  - Warpgroup 0 is the producer: one thread issues TMA copies of the next 64-deep tiles of a and
//    of b^T into a ring of shared buffers (128-byte swizzle, zero-filled outside the matrices),
//    each stage guarded by a "full" and an "empty" mbarrier. It gives most of its registers away
//    (setmaxnreg).
//  - Clusters of kCluster blocks work on tiles in the same columns (rows m0, m0 + 128, ...): each
//    block loads 1 / kCluster of the b tile and multicasts it into every block of the cluster,
//    which cuts b's traffic from L2 by kCluster. A stage is free again only when the consumers of
//    every block of the cluster have released it (remote mbarrier arrivals).
//  - Warpgroups 1 and 2 are consumers, 64 rows of the tile each: per stage 4 wgmma.m64nBNk16
//    reading both operands from shared memory through matrix descriptors, accumulating in BN / 2
//    float registers a thread. One stage's wgmmas stay in flight while the next stage's are
//    issued (wait_group 1); the stage before is released then. After the last k tile they round
//    the tile to 16 bits and store it.
// a is read by rows (K-major). b either by rows too (MN-major: a @ b with b row-major, 64 x 64
// boxes of b, wgmma told to transpose) or by columns (K-major: rows of b^T, as x @ w.t() gives
// them). TMA needs 16-byte global strides: the launcher pads what does not have them.
// Without sm_90a device code (a build for another arch list) the kernel traps and the launcher
// does not offer the variant (OPFORGE_HAS_SM90A).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#ifdef OPFORGE_MATMUL_TUNING
#include <cstdio>
#include <utility>
#endif

#include "matmul/cuda/matmul_kernels.h"
#include "matmul/cuda/tensor_core_common.cuh"
#include "matmul/cuda/tma_map.cuh"
#include "matmul/cuda/wgmma_ops.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPFORGE_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace {

constexpr int kBM = 128, kBK = 64;
constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
[[maybe_unused]] constexpr int kGroupRows = 8;  // tile rows (of clusters) per group of the tile order
#ifndef OPFORGE_WGMMA_WIDE_CONFIG
#define OPFORGE_WGMMA_WIDE_CONFIG 3
#endif
constexpr int kWideConfig = OPFORGE_WGMMA_WIDE_CONFIG;  // see matmul_wgmma_cuda_config; 3 measured fastest

template <int BN, int kCluster>
struct Config {
  static constexpr int kTileBytesA = kBM * kBK * 2, kTileBytesB = BN * kBK * 2;
  static constexpr int kStageBytes = kTileBytesA + kTileBytesB;
  static constexpr int kStages = 196608 / kStageBytes;  // a 192 KB ring: 4 stages of 128 x 256, 6 of 128 x 128
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024 /* alignment */ + 2 * kStages * 8 /* barriers */;
  static constexpr int kRowsB = BN / kCluster;  // rows of the b^T tile each block of a cluster loads
  static constexpr int kStoreBytes = 2 * 64 * 128 * 2;  // the TMA-store epilogue's buffers
  static_assert(kRowsB <= 256 && kTileBytesA % 1024 == 0 && (kRowsB * kBK * 2) % 1024 == 0, "TMA box / swizzle atoms");
};

#ifdef OPFORGE_WGMMA_DEVICE
using tc::smem_addr;
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrival on the barrier at the same place in block `cta` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster (whole warps).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// 3-D TMA copy (k, row, batch) of one box into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int k, int row, int batch, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(k), "r"(row), "r"(batch)
      : "memory");
}
// The same box written at the same place in every block of `mask`, completing on each one's `bar`.
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, int k, int row, int batch,
                                                   uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(k), "r"(row), "r"(batch), "h"(mask)
      : "memory");
}
// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  const uint64_t addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
// MN-major, 128-byte swizzle: rows of 64 n-values; groups of 8 k-rows 1024 bytes apart (stride
// offset), 64-column boxes 8 KB apart (leading offset).
__device__ __forceinline__ uint64_t smem_desc_mn(const void* p) {
  const uint64_t addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{8192 >> 4} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Bulk tensor store of one box from shared memory (the output epilogue), and its completion.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int col, int row, int batch) {
  tc::tma_store3(map, smem_addr(src), col, row, batch);
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Makes this thread's shared-memory writes visible to the bulk copies (the async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Keeps the compiler from moving accumulators that an asynchronous wgmma still owns.
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }

// Tile `u` of the persistent loop: batch, tile row of the cluster, tile column, in groups of
// kGroupRows cluster rows that sweep all columns before the next group.
__device__ __forceinline__ void tile_coords(int u, int groups_m, int tiles_n, int& b, int& gm, int& nt) {
  const int per = groups_m * tiles_n;
  b = u / per;
  const int r = u % per, group = r / (kGroupRows * tiles_n), first = group * kGroupRows;
  const int size = min(kGroupRows, groups_m - first), w = r % (kGroupRows * tiles_n);
  gm = first + w % size;
  nt = w / size;
}
#endif  // OPFORGE_WGMMA_DEVICE

// kTmaStore: the epilogue writes each consumer's results, 64 x 128 at a time, into its own
// 16 KB shared buffer (128-byte swizzle, as TMA reads it) and one thread sends them to c with bulk
// tensor stores that complete while the next tile's wgmmas run; needs c's strides in multiples
// of 8 elements and a 16-byte aligned base. Otherwise each thread stores its pairs of columns.
// kBNMajor: b read by rows (64 x 64 boxes, BN / 64 of them a stage) instead of rows of b^T.
template <typename T, int BN, int kCluster, bool kTmaStore, bool kBNMajor>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_bt,
                        const __grid_constant__ CUtensorMap map_c, T* __restrict__ c, int m, int n, int k, int batch,
                        int64_t ldc, int64_t c_bs) {
#ifdef OPFORGE_WGMMA_DEVICE
  using C = Config<BN, kCluster>;
  static_assert(!kBNMajor || kCluster == 1, "b by rows is not multicast");
  constexpr int kStages = C::kStages, kStageBytes = C::kStageBytes;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* const c_stage = smem + kStages * kStageBytes;  // kTmaStore: 2 x 16 KB
  uint64_t* full = reinterpret_cast<uint64_t*>(c_stage + (kTmaStore ? C::kStoreBytes : 0));
  uint64_t* empty = full + kStages;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const uint32_t rank = kCluster > 1 ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * kCluster);  // one arrival per consumer warpgroup of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (kCluster > 1) cluster_sync();  // no block multicasts into barriers not yet set up
  else __syncthreads();

  const int tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + BN - 1) / BN;
  const int groups_m = (tiles_m + kCluster - 1) / kCluster;
  const int units = groups_m * tiles_n * batch, k_tiles = (k + kBK - 1) / kBK;
  const int first_unit = blockIdx.x / kCluster, unit_step = gridDim.x / kCluster;
  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (t == 0) {
      int it = 0;
      for (int u = first_unit; u < units; u += unit_step) {
        int b, gm, nt;
        tile_coords(u, groups_m, tiles_n, b, gm, nt);
        const int m0 = (gm * kCluster + static_cast<int>(rank)) * kBM, n0 = nt * BN;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % kStages;
          mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);  // the first pass finds every stage free
          unsigned char* stage = smem + s * kStageBytes;
          mbar_arrive_expect_tx(&full[s], kStageBytes);  // a, and all of b (part of it from the other blocks)
          tma_load(stage, &map_a, kt * kBK, m0, b, &full[s]);
          if constexpr (kBNMajor) {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)  // (64 k x 64 n) boxes of b, 8 KB apart
              tma_load(stage + C::kTileBytesA + j * 8192, &map_bt, n0 + j * 64, kt * kBK, b, &full[s]);
          } else if constexpr (kCluster == 1) {
            tma_load(stage + C::kTileBytesA, &map_bt, kt * kBK, n0, b, &full[s]);
          } else {
            tma_load_multicast(stage + C::kTileBytesA + rank * (C::kRowsB * kBK * 2), &map_bt, kt * kBK,
                               n0 + static_cast<int>(rank) * C::kRowsB, b, &full[s],
                               static_cast<uint16_t>((1u << kCluster) - 1));
          }
        }
      }
    }
    __syncwarp();
  } else {
    // consumers: warpgroup 1 takes rows 0-63 of the tile, warpgroup 2 rows 64-127
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int half = wg - 1, warp = t / 32, lane = t % 32;
    auto release = [&](int s) {
      if (t != 0) return;
      if constexpr (kCluster == 1) {
        mbar_arrive(&empty[s]);
      } else {
#pragma unroll
        for (int q = 0; q < kCluster; ++q) mbar_arrive_cluster(&empty[s], q);
      }
    };
    float d[BN / 2];
    int it = 0;
    for (int u = first_unit; u < units; u += unit_step) {
      int b, gm, nt;
      tile_coords(u, groups_m, tiles_n, b, gm, nt);
      const int m0 = (gm * kCluster + static_cast<int>(rank)) * kBM, n0 = nt * BN;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        mbar_wait(&full[s], (it / kStages) & 1);
        const unsigned char* stage = smem + s * kStageBytes;
        const unsigned char* a_tile = stage + half * (64 * kBK * 2);
        const unsigned char* b_tile = stage + C::kTileBytesA;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) fence_operand(d[i]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {  // a: 16 deep = 32 bytes along the swizzled 128-byte rows
          if constexpr (kBNMajor)  // b: 16 rows of 128 bytes
            tc::Wgmma<T, BN>::template mma<1>(d, smem_desc(a_tile + kk * 32), smem_desc_mn(b_tile + kk * 2048), 1);
          else
            tc::Wgmma<T, BN>::template mma<0>(d, smem_desc(a_tile + kk * 32), smem_desc(b_tile + kk * 32), 1);
        }
        wgmma_commit();
        wgmma_wait<1>();  // this stage's wgmmas may still run; the previous stage's are done
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) fence_operand(d[i]);
        if (kt > 0) release((it - 1) % kStages);
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) fence_operand(d[i]);
      if (k_tiles > 0) release((it - 1) % kStages);
      // d[4j..4j+3]: rows (warp*16 + lane/4) and +8, columns 8j + 2*(lane%4) + {0, 1}
      if constexpr (kTmaStore) {
        unsigned char* const buf = c_stage + half * 16384;
#pragma unroll
        for (int part = 0; part < BN / 128; ++part) {
          if (t == 0) bulk_wait_read();  // the previous store has read the buffer
          named_barrier(1 + half, 128);
#pragma unroll
          for (int jj = 0; jj < 16; ++jj) {  // 8-column groups; two 64 x 64 boxes of 128-byte rows
            const int j = part * 16 + jj, box = jj / 8, chunk = jj % 8;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int row = warp * 16 + lane / 4 + h * 8;
              const uint32_t v = tc::pack2<T>(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
              const uint32_t addr = smem_addr(buf + box * 8192 + row * 128 + ((chunk ^ (row & 7)) * 16) + (lane % 4) * 4);
              asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
            }
          }
          fence_proxy_async();
          named_barrier(1 + half, 128);
          if (t == 0) {
            tma_store(&map_c, buf, n0 + part * 128, m0 + half * 64, b);
            tma_store(&map_c, buf + 8192, n0 + part * 128 + 64, m0 + half * 64, b);
            bulk_commit();
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
            tc::store_pair<T>(out + row * ldc + col, d[4 * j + 2 * h], d[4 * j + 2 * h + 1], pairs && col + 1 < n);
            if (!pairs && col + 1 < n) tc::store_pair<T>(out + row * ldc + col + 1, d[4 * j + 2 * h + 1], 0.f, false);
          }
        }
      }
    }
  }
  if constexpr (kTmaStore) {
    if (wg > 0 && t == 0) bulk_wait_all();
  }
  // No block leaves while another may still arrive on its barriers or write into its ring.
  if constexpr (kCluster > 1) cluster_sync();
#else
  __trap();  // no sm_90a code in this binary: never return an unwritten output
#endif  // OPFORGE_WGMMA_DEVICE
}

// A (rows x k) row-major operand per batch as a 3-D map (k, rows, batch), boxes of 64 x box_rows.
bool make_map(CUtensorMap* map, const void* base, DType dtype, int64_t rows, int64_t k, int64_t batch, int64_t ld,
              int64_t bs, uint32_t box_rows) {
  return tc::make_tma_map(map, base, dtype, rows, k, batch, ld, bs, kBK, box_rows);
}

template <typename T, int BN, int kCluster, bool kTmaStore, bool kBNMajor>
cudaError_t launch(const GemmParams& p, cudaStream_t stream) {
  using C = Config<BN, kCluster>;
  CUtensorMap map_a{}, map_bt{}, map_c{};
  if (!make_map(&map_a, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, kBM)) return cudaErrorInvalidValue;
  // b by rows: (k, n) with row stride b_rs; else b^T's rows: (n, k) with row stride b_cs.
  if (kBNMajor ? !make_map(&map_bt, p.b, p.dtype, p.k, p.n, p.batch, p.b_rs, p.b_bs, 64)
               : !make_map(&map_bt, p.b, p.dtype, p.n, p.k, p.batch, p.b_cs, p.b_bs, C::kRowsB))
    return cudaErrorInvalidValue;
  // c as (n, m, batch) in 64 x 64 boxes (the same shape of map as the operands': columns inner).
  if (kTmaStore && !make_map(&map_c, p.c, p.dtype, p.m, p.n, p.batch, p.c_rs, p.c_bs, 64)) return cudaErrorInvalidValue;
  const auto kernel = matmul_wgmma_kernel<T, BN, kCluster, kTmaStore, kBNMajor>;
  constexpr int kSmemBytes = C::kSmemBytes + (kTmaStore ? C::kStoreBytes : 0);
  // setmaxnreg moves registers between the warpgroups of a block: 128 x 40 + 256 x 232 needs
  // the block to start with at least 168 a thread, or the consumers wait for ever.
  static signed char configured[64] = {};
  cudaError_t err = tc::configure_once(kernel, kSmemBytes, configured,
                                       [](const cudaFuncAttributes& a) { return (a.numRegs + 7) / 8 * 8 >= 168; });
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
  config.dynamicSmemBytes = kSmemBytes;
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
#ifdef OPFORGE_MATMUL_TUNING
  static bool told = false;  // once per configuration: the timing loops launch it thousands of times
  if (!std::exchange(told, true))
    std::fprintf(stderr, "wgmma %dx%d cluster %d: %d blocks (%d slots), %lld tiles\n", kBM, BN, kCluster,
                 config.gridDim.x, slots, static_cast<long long>(units));
#endif
  err = cudaLaunchKernelEx(&config, kernel, map_a, map_bt, map_c, static_cast<T*>(p.c), static_cast<int>(p.m),
                           static_cast<int>(p.n), static_cast<int>(p.k), static_cast<int>(p.batch), p.c_rs, p.c_bs);
  return err;
}

template <typename T, bool kBNMajor>
cudaError_t launch_config(const GemmParams& p, cudaStream_t stream, int config) {
  switch (config) {
    case 0: return launch<T, 128, 1, false, kBNMajor>(p, stream);
    case 1: return launch<T, 256, 1, false, kBNMajor>(p, stream);
    case 2:
      if constexpr (kBNMajor) return cudaErrorInvalidValue;  // multicast: b^T's rows only
      else return launch<T, 256, 2, false, false>(p, stream);
    case 3:
      return tc::tma_storable(p) ? launch<T, 256, 1, true, kBNMajor>(p, stream)
                             : launch<T, 256, 1, false, kBNMajor>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t launch_layout(const GemmParams& p, cudaStream_t stream, int config) {
  if (p.b_cs == 1 && p.b_rs != 1) return launch_config<T, true>(p, stream, config);
  if (p.b_rs == 1) return launch_config<T, false>(p, stream, config);
  return cudaErrorInvalidValue;
}

// The configuration for a call: 128 x 256 tiles where there are at least half as many as SMs
// (measured faster from 2048^3 up), else 128 x 128 tiles.
int pick_config(const GemmParams& p) {
  static int sms = [] {
    int dev = 0, n = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n;
  }();
  const int64_t wide_tiles = (p.m + kBM - 1) / kBM * ((p.n + 255) / 256) * p.batch;
  return 2 * wide_tiles >= sms ? kWideConfig : 0;
}

}  // namespace

int matmul_wgmma_cuda_config(const GemmParams& p, void* stream, int config) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (config < 0) {
    config = pick_config(p);
    if (config == 2 && p.b_cs == 1) config = 1;  // clusters multicast rows of b^T only
  }
  switch (p.dtype) {
    case DType::kBFloat16: return launch_layout<__nv_bfloat16>(p, s, config);
    case DType::kFloat16: return launch_layout<__half>(p, s, config);
    default: return cudaErrorInvalidValue;
  }
}

int matmul_wgmma_cuda(const GemmParams& p, void* stream) { return matmul_wgmma_cuda_config(p, stream, -1); }

}  // namespace opforge
