// Host side of TMA: tensor maps for the tensor-core rungs (wgmma, and mma on sm_90). Host code
// only; the driver's encoder is reached through the runtime, so nothing links libcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "matmul/matmul_params.h"

namespace opforge {
namespace tc {

inline PFN_cuTensorMapEncodeTiled_v12000 tma_encode_fn() {
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

// A 16-bit (rows x cols) row-major operand per batch as a 3-D map (cols, rows, batch) with row
// stride ld and batch stride bs (elements), boxes of box_cols x box_rows x 1, 128-byte swizzle
// (box_cols * 2 must be 128 at most; `swizzle` another), L2 fetches of 128 bytes (`promotion`
// another), zeros outside. False if the driver refuses it.
inline bool make_tma_map(CUtensorMap* map, const void* base, DType dtype, int64_t rows, int64_t cols, int64_t batch,
                         int64_t ld, int64_t bs, uint32_t box_cols, uint32_t box_rows,
                         CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B,
                         CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B) {
  const auto encode = tma_encode_fn();
  if (!encode) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * 2),
                                 static_cast<cuuint64_t>((batch > 1 ? bs : rows * ld) * 2)};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult res =
      encode(map, dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
             const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS;
}

// Can bulk tensor copies store c (16-byte aligned base, strides in multiples of 16 bytes)?
inline bool tma_storable(const GemmParams& p) {
  return reinterpret_cast<uintptr_t>(p.c) % 16 == 0 && p.c_rs % 8 == 0 && (p.batch == 1 || p.c_bs % 8 == 0);
}

}  // namespace tc
}  // namespace opforge
