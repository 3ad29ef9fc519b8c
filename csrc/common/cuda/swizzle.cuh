// The shared CUDA layer: XOR swizzles of shared-memory tiles, so that the 8 rows one ldmatrix or
// one store instruction touches fall in 8 different 16-byte bank groups. The patterns are TMA's
// (its copies write boxes so, and wgmma's descriptors read them so); cp.async-filled tiles use
// the same ones.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/ptx.cuh"

namespace opforge {
namespace cuda {

// 128-byte swizzle: 16-byte chunk c of row r (rows of 128 bytes, or any multiple: the low three
// bits of the chunk index are permuted) sits at chunk c ^ (r % 8).
__device__ __forceinline__ int swizzle128_chunk(int row, int chunk) {
  return chunk ^ (row & 7);
}
// 64-byte swizzle: rows of 64 bytes (4 chunks); chunk c of row r at c ^ ((r / 2) % 4).
__device__ __forceinline__ int swizzle64_chunk(int row, int chunk) {
  return chunk ^ ((row >> 1) & 3);
}

// The swizzled staging of an output tile for TMA stores: the pair (x, y) that an mma.sync or
// wgmma accumulator fragment holds at row `row`, columns 8 chunk + 2 (lane % 4) + {0, 1}, packed
// into one word, stored into a box of 128-byte rows (64 16-bit columns) at shared address `box`,
// laid out in the 128-byte swizzle a TMA store of that box reads.
__device__ __forceinline__ void stage_pair_swizzle128(uint32_t box, int row, int chunk, int lane,
                                                      uint32_t packed) {
  st_shared_u32(box + row * 128 + (swizzle128_chunk(row, chunk) * 16) + (lane % 4) * 4, packed);
}

}  // namespace cuda
}  // namespace opforge
