// nms: the plain parameters that cross from the launchers to the kernels (no torch).
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace opforge {

// Boxes are processed in "scan order": by decreasing score (ties: lower index first), and for
// batched_nms grouped by class first (a stable sort by class of the score order), so that each
// class is one contiguous segment and boxes of different classes are never compared.
struct NmsParams {
  const void* boxes = nullptr;            // [n, 4] (x1, y1, x2, y2) in scan order, contiguous, `dtype`
  const int64_t* classes = nullptr;       // [n] class of each box in scan order; null for plain nms
  const int64_t* to_score_pos = nullptr;  // [n] scan position -> score-order position; null if equal
  int64_t n = 0;
  DType dtype = DType::kFloat32;
  double iou_threshold = 0.5;      // suppress j when IoU(i, j) > iou_threshold
  float iou_threshold_f32 = 0.5f;  // the largest float <= iou_threshold: same decisions in fp32
};

// Number of 64-box words per mask row.
inline int64_t nms_words(int64_t n) {
  return (n + 63) / 64;
}

#if OPFORGE_WITH_CUDA
// Words of the per-row bitmap that marks which mask words are non-zero.
inline int64_t nms_nz_words(int64_t n) {
  return (nms_words(n) + 63) / 64;
}

// Plain nms of at most this many 16/32-bit boxes is put in scan order by ranking (two small
// kernels, run_nms_rank_sort_cuda) instead of torch.sort + index_select, whose launches and
// multi-pass radix sort cost more than the NMS itself at these sizes.
constexpr int64_t kNmsSmallSort = 16384;
// Upper bound of the greedy kernel's grid (the `partial` buffer's length).
constexpr int64_t kNmsMaxGreedyBlocks = 1024;

// The CUDA launcher's scratch, carved from one allocation (device pointers). The first
// `zeroed_bytes` (row_nz, in_deg, state, flags, rank) must be zero before run_nms_cuda.
struct NmsCudaBuffers {
  uint64_t* row_nz = nullptr;      // [n, nz_words]: bit c set when mask[i][c] != 0
  int32_t* in_deg = nullptr;       // [n]: how many higher-ranked boxes overlap box j (then: how many remain)
  int32_t* state = nullptr;        // [n]: undecided, kept, pending, or suppressed in round r
  int32_t* flags = nullptr;        // [4]: "some box became pending" per round parity
  uint64_t* mask = nullptr;        // [n, words]: only non-zero words are written (see row_nz)
  uint64_t* open = nullptr;        // [words]: bit i set while box i is undecided
  int32_t* or_end = nullptr;       // [words]: exclusive end word of each row block's class segment
  uint8_t* kept = nullptr;         // [n]: 1 if kept, by score-order position
  int32_t* partial = nullptr;      // [kNmsMaxGreedyBlocks]: per-block counts for the compaction
  int32_t* rank = nullptr;         // [n], zeroed: the ranking sort's ranks
  int64_t* score_order = nullptr;  // [n]: the ranking sort's score order
  void* scan_boxes = nullptr;      // [n, 4]: the ranking sort's boxes in scan order
};
struct NmsCudaLayout {
  int64_t zeroed_bytes = 0, total_bytes = 0;
  int64_t row_nz = 0, in_deg = 0, state = 0, flags = 0, mask = 0, open = 0, or_end = 0, kept = 0, partial = 0,
          rank = 0, score_order = 0, scan_boxes = 0;
};
inline int64_t nms_align(int64_t x) {
  return (x + 255) / 256 * 256;
}
inline NmsCudaLayout nms_cuda_layout(int64_t n) {
  NmsCudaLayout l;
  const int64_t words = nms_words(n);
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t off = at;
    at = nms_align(at + bytes);
    return off;
  };
  l.row_nz = take(n * nms_nz_words(n) * 8);
  l.in_deg = take(n * 4);
  l.state = take(n * 4);
  l.flags = take(16);
  l.rank = take(n * 4);
  l.zeroed_bytes = at;
  l.mask = take(n * words * 8);
  l.open = take(words * 8);
  l.or_end = take(words * 4);
  l.kept = take(n);
  l.partial = take(kNmsMaxGreedyBlocks * 4);
  l.score_order = take(n * 8);     // the ranking sort's outputs (small plain nms only)
  l.scan_boxes = take(n * 4 * 8);  // room for any dtype
  l.total_bytes = at;
  return l;
}
inline NmsCudaBuffers nms_cuda_buffers(void* base, const NmsCudaLayout& l) {
  auto at = [&](int64_t off) { return static_cast<char*>(base) + off; };
  NmsCudaBuffers b;
  b.row_nz = reinterpret_cast<uint64_t*>(at(l.row_nz));
  b.in_deg = reinterpret_cast<int32_t*>(at(l.in_deg));
  b.state = reinterpret_cast<int32_t*>(at(l.state));
  b.flags = reinterpret_cast<int32_t*>(at(l.flags));
  b.mask = reinterpret_cast<uint64_t*>(at(l.mask));
  b.open = reinterpret_cast<uint64_t*>(at(l.open));
  b.or_end = reinterpret_cast<int32_t*>(at(l.or_end));
  b.kept = reinterpret_cast<uint8_t*>(at(l.kept));
  b.partial = reinterpret_cast<int32_t*>(at(l.partial));
  b.rank = reinterpret_cast<int32_t*>(at(l.rank));
  b.score_order = reinterpret_cast<int64_t*>(at(l.score_order));
  b.scan_boxes = at(l.scan_boxes);
  return b;
}

// Plain nms with n <= kNmsSmallSort and 16/32-bit dtypes: the scan order by ranking, on the
// device. rank: [n] int32, zeroed. Writes score_order [n] (decreasing score, ties by lower
// index, NaN first as in torch.sort) and scan_boxes [n, 4]. Inputs contiguous. Returns a
// cudaError_t as int.
int run_nms_rank_sort_cuda(const void* boxes, const void* scores, int64_t n, DType dtype, int32_t* rank,
                           int64_t* score_order, void* scan_boxes, void* stream);
// Overlap graph, greedy resolution and compaction on `stream` (buffers zeroed as above):
// keep [n] gets the kept boxes' indices (score_order entries) in score order, then -1;
// num_kept the count. Returns a cudaError_t as int.
int run_nms_cuda(const NmsParams& p, const NmsCudaBuffers& buf, const int64_t* score_order, int64_t* keep,
                 int64_t* num_kept, void* stream);
#endif

}  // namespace opforge
