// The shared CUDA layer: the tensor memory accelerator (sm_90). Host side: tensor maps
// (cuTensorMapEncodeTiled, reached through the runtime so nothing links libcuda). Device side:
// bulk tensor copies global -> shared (completing on an mbarrier, optionally multicast to the
// blocks of a cluster) and shared -> global (bulk groups), and the fence that orders a thread's
// shared-memory writes before the async proxy (TMA, wgmma) reads them.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/ptx.cuh"
#include "common/scalar_type.h"

namespace opforge {
namespace cuda {

// ---- host: tensor maps ----------------------------------------------------------------------

inline PFN_cuTensorMapEncodeTiled_v12000 tma_encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 16-bit (float16/bfloat16) row-major operand of `batch` matrices (rows x cols, row stride ld,
// batch stride bs, in elements) as a 3-D map (cols, rows, batch) read and written in boxes of
// box_cols x box_rows x 1: 128-byte swizzle by default (box_cols * 2 bytes must then be 128 at
// most), L2 fetches of 128 bytes (`promotion`), zeros outside the tensor. TMA needs the base and
// the strides in multiples of 16 bytes. False if the driver refuses the map.
inline bool make_tma_map_16bit(CUtensorMap* map, const void* base, DType dtype, int64_t rows, int64_t cols,
                               int64_t batch, int64_t ld, int64_t bs, uint32_t box_cols, uint32_t box_rows,
                               CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B,
                               CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B) {
  const auto encode = tma_encode_fn();
  if (!encode || (dtype != DType::kBFloat16 && dtype != DType::kFloat16)) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * 2),
                                 static_cast<cuuint64_t>((batch > 1 ? bs : rows * ld) * 2)};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult res = encode(
      map, dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS;
}

// A 16-bit or float8_e4m3 operand of (b, h) batches of row-major matrices (rows x cols; strides in
// elements: row ld, head hs, batch bs) as a 4-D map (cols, rows, heads, batch) read in boxes of
// box_cols x box_rows x 1 x 1, 128-byte swizzle (box_cols elements <= 128 bytes), zeros outside.
// False if the driver refuses the map (strides must be multiples of 16 bytes).
inline bool make_tma_map_4d(CUtensorMap* map, const void* base, DType dtype, int64_t rows, int64_t cols,
                            int64_t heads, int64_t batch, int64_t ld, int64_t hs, int64_t bs,
                            uint32_t box_cols, uint32_t box_rows) {
  const auto encode = tma_encode_fn();
  const bool fp8 = dtype == DType::kFloat8E4M3;
  if (!encode || (dtype != DType::kBFloat16 && dtype != DType::kFloat16 && !fp8)) return false;
  const int64_t eb = fp8 ? 1 : 2;  // (bytes an element)
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  // (A dimension of size 1 takes any stride: a valid one is given.)
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(ld * eb),
                                 static_cast<cuuint64_t>((heads > 1 ? hs : rows * ld) * eb),
                                 static_cast<cuuint64_t>((batch > 1 ? bs : heads * rows * ld) * eb)};
  const cuuint32_t box[4] = {box_cols, box_rows, 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = fp8                         ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult res = encode(map, type, 4, const_cast<void*>(base), dims, strides, box, elem,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS;
}

// ---- device: bulk tensor copies -------------------------------------------------------------

// The box at (x, y, z) of `map` into shared memory at dst, completing on the mbarrier at `bar`
// (which must expect the box's bytes).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int x, int y, int z,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y), "r"(z)
      : "memory");
}
// The box at (x, y, z, w) of a 4-D map.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int x, int y, int z, int w,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y), "r"(z), "r"(w)
      : "memory");
}
// `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned) global -> shared,
// completing on the mbarrier at `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// The same box written at the same shared address in every block of the cluster in cta_mask,
// completing on each one's barrier at `bar`.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map, int x, int y,
                                                      int z, uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y), "r"(z), "h"(cta_mask)
      : "memory");
}
// The box at shared address src to (x, y, z) of `map` (clipped at the tensor's edges), in this
// thread's current bulk group.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(x), "r"(y), "r"(z)
               : "memory");
}
// `bytes` (a multiple of 16) float32 values at shared address src added element-wise into global
// memory at dst (both 16-byte aligned), in this thread's current bulk group: the reduction is
// done at L2, atomically per element, so blocks may add into the same values concurrently.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
// Closes this thread's bulk group; waits until its groups have read their shared memory (it may
// be written again), or until they have completed.
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Orders this thread's async-proxy accesses to global memory (bulk copies and reductions it has
// waited for) with its generic-proxy ones (a release that publishes them, or an acquire after which
// it issues more).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Orders this thread's generic-proxy accesses to shared memory (its stores, or its reads of a
// stage about to be refilled) before later async-proxy ones (bulk copies, wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace cuda
}  // namespace opforge
