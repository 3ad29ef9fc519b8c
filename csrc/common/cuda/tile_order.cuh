// The shared CUDA layer: the order in which blocks take output tiles. Blocks that run at the same
// time should share panels of a and b in L2: "grouped" order walks groups of kGroupRows tile rows
// column by column (a wave of 132 blocks over 32 x 16 tiles then spans 16 rows by 8-9 columns,
// against 8-9 whole rows of 16 columns row by row).
#pragma once

#include <cuda_runtime.h>

namespace opforge {
namespace cuda {

// Tile (tm, tn) of a tiles_m x tiles_n grid for linear index lin in grouped order, groups of
// group_rows rows. snake: odd groups walk their columns right to left (the b panels the previous
// group read last come first).
__device__ __forceinline__ void grouped_tile(int lin, int group_rows, int tiles_m, int tiles_n, bool snake,
                                             int& tm, int& tn) {
  const int group = lin / (group_rows * tiles_n), first = group * group_rows;
  const int rows = tiles_m - first < group_rows ? tiles_m - first : group_rows;
  const int w = lin - group * group_rows * tiles_n;
  tm = first + w % rows;
  tn = snake && (group & 1) ? tiles_n - 1 - w / rows : w / rows;
}
template <int kGroupRows, bool kSnake = false>
__device__ __forceinline__ void grouped_tile(int lin, int tiles_m, int tiles_n, int& tm, int& tn) {
  grouped_tile(lin, kGroupRows, tiles_m, tiles_n, kSnake, tm, tn);
}

// The same over a batch of grids, batch outermost: lin -> (batch, tm, tn).
template <int kGroupRows, bool kSnake = false>
__device__ __forceinline__ void batched_grouped_tile(int lin, int tiles_m, int tiles_n, int& batch, int& tm,
                                                     int& tn) {
  batch = lin / (tiles_m * tiles_n);
  grouped_tile<kGroupRows, kSnake>(lin - batch * tiles_m * tiles_n, tiles_m, tiles_n, tm, tn);
}

}  // namespace cuda
}  // namespace opforge
