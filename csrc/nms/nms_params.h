// nms: the plain parameters that cross from the launchers to the kernels (no torch).
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace opforge {

// Boxes are processed in "scan order": by decreasing score (ties: lower index first), and for
// batched_nms grouped by class first (a stable sort by class of the score order), so that each
// class is one contiguous segment and boxes of different classes are never compared.
struct NmsParams {
  const void* boxes = nullptr;    // [n, 4] (x1, y1, x2, y2) in scan order, contiguous, `dtype`
  const int64_t* classes = nullptr;  // [n] class of each box in scan order; null for plain nms
  const int64_t* to_score_pos = nullptr;  // [n] scan position -> score-order position; null if equal
  int64_t n = 0;
  DType dtype = DType::kFloat32;
  double iou_threshold = 0.5;     // suppress j when IoU(i, j) > iou_threshold
  float iou_threshold_f32 = 0.5f;  // the largest float <= iou_threshold: same decisions in fp32
};

// Number of 64-box words per mask row.
inline int64_t nms_words(int64_t n) { return (n + 63) / 64; }

#if OPFORGE_WITH_CUDA
// Words of the per-row bitmap that marks which mask words are non-zero.
inline int64_t nms_nz_words(int64_t n) { return (nms_words(n) + 63) / 64; }

// Scratch the CUDA launcher allocates (device pointers).
struct NmsCudaBuffers {
  uint64_t* mask = nullptr;    // [n, words]: only non-zero words are written (see row_nz)
  uint64_t* row_nz = nullptr;  // [n, nz_words], zeroed: bit c set when mask[i][c] != 0
  int32_t* in_deg = nullptr;   // [n], zeroed: how many higher-ranked boxes box j overlaps
  int32_t* or_end = nullptr;   // [words] exclusive end word of each row block's class segment
  int32_t* work = nullptr;     // [5, n]: remaining, state and three frontier lists
  uint64_t* open = nullptr;    // [words]: bit i set while box i is undecided
  uint8_t* kept = nullptr;     // [n] 1 if kept, by score-order position
};
// Mask + greedy resolution on `stream`; fills buffers.kept. Returns a cudaError_t as int.
int run_nms_cuda(const NmsParams& p, const NmsCudaBuffers& buf, void* stream);
// keep[prefix[i] - 1] = score_order[i] where kept[i]; num_kept = prefix[n - 1]. keep is pre-filled.
int run_nms_compact_cuda(const uint8_t* kept, const int32_t* prefix, const int64_t* score_order, int64_t n,
                         int64_t* keep, int64_t* num_kept, void* stream);
#endif

}  // namespace opforge
