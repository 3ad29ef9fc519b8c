// matmul rung 6, "wgmma" (float16/bfloat16, sm_90a: H100/H200): Hopper's warpgroup MMA fed by
// the tensor memory accelerator, warp-specialised and persistent.
//  - One block per SM loops over 128 x 128 output tiles (persistent: the grid is the SM count).
//  - Warpgroup 0 is the producer: one thread issues TMA copies of the next 64-deep tiles of a and
//    of b^T into a 4-stage ring of shared buffers (128-byte swizzle, zero-filled outside the
//    matrices), each stage guarded by a "full" and an "empty" mbarrier. It gives most of its
//    registers away (setmaxnreg).
//  - Warpgroups 1 and 2 are consumers, 64 rows of the tile each: per stage 4 wgmma.m64n128k16
//    reading both operands straight from shared memory through matrix descriptors, accumulating
//    in 64 float registers a thread; then they release the stage and, after the last k tile,
//    round the tile to 16 bits and store it.
// Operands are K-major (rows of a, rows of b^T): the launcher passes b transposed and zero-pads k
// to a multiple of 8 (TMA needs 16-byte global strides).
// Without sm_90a device code (a build for another arch list) the kernel is empty and the
// launcher does not offer the variant (OPFORGE_HAS_SM90A).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "matmul/cuda/matmul_kernels.h"
#include "matmul/cuda/tensor_core_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OPFORGE_WGMMA_DEVICE 1
#endif

namespace opforge {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 4;
constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kTileBytesA = kBM * kBK * 2, kTileBytesB = kBN * kBK * 2;
constexpr int kStageBytes = kTileBytesA + kTileBytesB;
constexpr int kSmemBytes = kStages * kStageBytes + 1024 /* alignment */ + 2 * kStages * 8 /* barriers */;

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
// 3-D TMA copy (k, row, batch) of one box into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int k, int row, int batch, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(k), "r"(row), "r"(batch)
      : "memory");
}
// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  const uint64_t addr = smem_addr(p);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate);
template <>
__device__ __forceinline__ void wgmma_m64n128k16<__nv_bfloat16>(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_m64n128k16<__half>(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

#endif  // OPFORGE_WGMMA_DEVICE

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_bt,
                        T* __restrict__ c, int m, int n, int k, int batch, int64_t ldc, int64_t c_bs) {
#ifdef OPFORGE_WGMMA_DEVICE
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2);  // one arrival per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;
  const int tiles = tiles_m * tiles_n * batch, k_tiles = (k + kBK - 1) / kBK;
  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (t != 0) return;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int b = tile / (tiles_m * tiles_n), r = tile % (tiles_m * tiles_n);
      const int m0 = (r / tiles_n) * kBM, n0 = (r % tiles_n) * kBN;
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);  // the first pass finds every stage free
        unsigned char* stage = smem + s * kStageBytes;
        mbar_arrive_expect_tx(&full[s], kStageBytes);
        tma_load(stage, &map_a, kt * kBK, m0, b, &full[s]);
        tma_load(stage + kTileBytesA, &map_bt, kt * kBK, n0, b, &full[s]);
      }
    }
    return;
  }
  // consumers: warpgroup 1 takes rows 0-63 of the tile, warpgroup 2 rows 64-127
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int half = wg - 1, warp = t / 32, lane = t % 32;
  float d[64];
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int b = tile / (tiles_m * tiles_n), r = tile % (tiles_m * tiles_n);
    const int m0 = (r / tiles_n) * kBM, n0 = (r % tiles_n) * kBN;
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const unsigned char* stage = smem + s * kStageBytes;
      const unsigned char* a_tile = stage + half * (64 * kBK * 2);
      const unsigned char* b_tile = stage + kTileBytesA;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)  // 16 deep = 32 bytes along the swizzled 128-byte rows
        wgmma_m64n128k16<T>(d, smem_desc(a_tile + kk * 32), smem_desc(b_tile + kk * 32), 1);
      wgmma_commit();
      wgmma_wait_all();
      if (t == 0) mbar_arrive(&empty[s]);
    }
    // d[4j..4j+3]: rows (warp*16 + lane/4) and +8, columns 8j + 2*(lane%4) + {0, 1}
    T* out = c + static_cast<int64_t>(b) * c_bs;
    const bool pairs = ((ldc | c_bs) & 1) == 0 && reinterpret_cast<uintptr_t>(c) % 4 == 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
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
#else
  __trap();  // no sm_90a code in this binary: never return an unwritten output
#endif  // OPFORGE_WGMMA_DEVICE
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A (rows x k) row-major operand per batch as a 3-D map (k, rows, batch), boxes of 64 x box_rows.
bool make_map(CUtensorMap* map, const void* base, DType dtype, int64_t rows, int64_t k, int64_t batch, int64_t ld,
              int64_t bs, uint32_t box_rows) {
  const auto encode = encode_fn();
  if (!encode) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * 2), static_cast<cuuint64_t>((batch > 1 ? bs : rows * ld) * 2)};
  const cuuint32_t box[3] = {kBK, box_rows, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult res = encode(map, dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                              3, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS;
}

template <typename T>
cudaError_t launch(const GemmParams& p, cudaStream_t stream) {
  CUtensorMap map_a{}, map_bt{};
  // p.b holds b^T: (n, k) rows, row stride p.b_rs.
  if (!make_map(&map_a, p.a, p.dtype, p.m, p.k, p.batch, p.a_rs, p.a_bs, kBM) ||
      !make_map(&map_bt, p.b, p.dtype, p.n, p.k, p.batch, p.b_rs, p.b_bs, kBN))
    return cudaErrorInvalidValue;
  // setmaxnreg moves registers between the warpgroups of a block: 128 x 40 + 256 x 232 needs
  // the block to start with at least 168 a thread, or the consumers wait for ever.
  static bool configured[64] = {};
  const cudaError_t err = tc::configure_once(matmul_wgmma_kernel<T>, kSmemBytes, configured,
                                             [](const cudaFuncAttributes& a) { return (a.numRegs + 7) / 8 * 8 >= 168; });
  if (err != cudaSuccess) return err;
  int dev = 0, sms = 1;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t tiles = ((p.m + kBM - 1) / kBM) * ((p.n + kBN - 1) / kBN) * p.batch;
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  matmul_wgmma_kernel<T><<<grid, kThreads, kSmemBytes, stream>>>(map_a, map_bt, static_cast<T*>(p.c),
                                                                 static_cast<int>(p.m), static_cast<int>(p.n),
                                                                 static_cast<int>(p.k), static_cast<int>(p.batch),
                                                                 p.c_rs, p.c_bs);
  return cudaGetLastError();
}

}  // namespace

int matmul_wgmma_cuda(const GemmParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, s);
    case DType::kFloat16: return launch<__half>(p, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace opforge
