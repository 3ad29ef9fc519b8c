// attention CUDA, mma.sync kernels (sm_80+): tiles of rows of head_dim 16-bit values in shared
// memory (16-byte chunks in the 128-byte XOR swizzle, filled by cp.async), their ldmatrix fragments,
// an accumulator block as the A fragment of the next product (the Hopper and decode kernels' P too),
// and the kernels' one-time setup.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention/cuda/attention_cuda.h"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/swizzle.cuh"
#include "common/cuda/vector.cuh"

namespace opforge {
namespace attention_cuda {

using cuda::ldmatrix_x4;

using cuda::ldmatrix_x4_trans;

using cuda::mma_m16n8k16;

using cuda::pack2;

// A tile of rows of kD 16-bit values: row r's 16-byte chunk c at r * 2 kD + 16 (c ^ (r % 8)).
template <int kD>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * (kD * 2) + (cuda::swizzle128_chunk(row, chunk) << 4));
}

// Rows [row0, row0 + kRows) of a matrix of `rows` rows (row stride ld elements, unit column
// stride, 16-byte aligned rows) into the tile at shared address `tile`; rows past the end are
// zero-filled. By kThreads threads.
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_rows(uint32_t tile, const T* base, int64_t ld, int64_t row0,
                                          int64_t rows, int tid) {
  constexpr int kChunks = kD / 8, kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int n = 0; n < kTotal / kThreads; ++n) {
    const int idx = tid + n * kThreads, r = idx / kChunks, c = idx % kChunks;
    const int64_t gr = row0 + r;
    const bool in = gr < rows;
    cuda::cp_async16(tile + tile_offset<kD>(r, c), base + (in ? gr * ld : 0) + c * 8, in ? 16 : 0);
  }
}

// kRows floats [row0, row0 + kRows) of a vector of `rows` into shared memory (zeros past the end).
template <int kRows, int kThreads>
__device__ __forceinline__ void load_floats(float* dst, const float* src, int64_t row0, int64_t rows,
                                            int tid) {
  for (int r = tid; r < kRows; r += kThreads) {
    const bool in = row0 + r < rows;
    cuda::cp_async4(dst + r, src + (in ? row0 + r : 0), in ? 4 : 0);
  }
}

// mma.sync fragments from a tile. A (16 x 16: rows r0.., k chunks 2 kk, 2 kk + 1).
template <int kD>
__device__ __forceinline__ void frag_a(uint32_t* a, uint32_t tile, int r0, int kk, int lane) {
  ldmatrix_x4(a, tile + tile_offset<kD>(r0 + (lane & 15), kk * 2 + (lane >> 4)));
}

// B of two n8 tiles whose n index runs along the tile's rows (n0..n0 + 15) and k along its
// columns (chunks 2 kk, 2 kk + 1): b[0..1] for rows n0.., b[2..3] for n0 + 8...
template <int kD>
__device__ __forceinline__ void frag_b(uint32_t* b, uint32_t tile, int n0, int kk, int lane) {
  ldmatrix_x4(b, tile + tile_offset<kD>(n0 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
}

// B of two n8 tiles whose k index runs along the tile's rows (k0..k0 + 15) and n along its
// columns (chunks 2 np, 2 np + 1): b[0..1] for columns 16 np.., b[2..3] for 16 np + 8...
template <int kD>
__device__ __forceinline__ void frag_b_trans(uint32_t* b, uint32_t tile, int k0, int np, int lane) {
  ldmatrix_x4_trans(b,
                    tile + tile_offset<kD>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), np * 2 + (lane >> 4)));
}

// The A fragment of k chunk kk (columns 16 kk..) of a 16-row accumulator block, rounded to T.
// float8_e4m3 (T = __nv_fp8_e4m3, k chunks of 32 columns, saturated to +-448): an 8-bit fragment's
// word holds 4 consecutive k (word 0: row g, k 4 t4 ..; 1: row g + 8; 2, 3: k 16 + 4 t4 ..), while
// the accumulator holds columns 8 n + 2 t4 + {0, 1}: the words take columns {2 t4, 2 t4 + 1,
// 8 + 2 t4, 9 + 2 t4} of each 16 in that order, so that k position 4 c + i of a 16-column half is
// column 2 c + (i & 1) + 8 (i >> 1): the B operand's rows must come in that order (fp8_key_of).
template <typename T, int kN>
__device__ __forceinline__ void acc_to_a(uint32_t* a, const float (&acc)[kN][4], int kk) {
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int n = 4 * kk + 2 * (w / 2), e = 2 * (w % 2);  // (the group of 8 columns, the row's pair)
      a[w] = cuda::pack4_e4m3(acc[n][e], acc[n][e + 1], acc[n + 1][e], acc[n + 1][e + 1]);
    }
  } else {
    a[0] = pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
    a[1] = pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
    a[2] = pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[3] = pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// The column of a 16-column group that k position q (0..15) of an 8-bit A fragment holds
// (acc_to_a's order).
__host__ __device__ constexpr int fp8_key_of(int q) {
  return 2 * (q / 4) + (q & 1) + 8 * ((q >> 1) & 1);
}

template <typename Kernel>
cudaError_t prepare_kernel(Kernel kernel, int smem_bytes, signed char (&state)[64]) {
  const cudaError_t err = cuda::configure_once(
      kernel, smem_bytes, state, [](const cudaFuncAttributes& f) { return f.ptxVersion >= 80; });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

}  // namespace attention_cuda
}  // namespace opforge
