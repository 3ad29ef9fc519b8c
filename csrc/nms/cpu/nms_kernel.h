// nms CPU: the vectorized suppression loop, one instantiation per CPU variant (common/cpu_isa.h).
#pragma once

#include <cstdint>

#include "common/cpu_isa.h"

namespace opforge {

// Boxes in scan order as separate arrays, each padded with kNmsPad readable entries past n.
template <typename A>
struct NmsBoxes {
  const A *x1, *y1, *x2, *y2, *area;
};
constexpr int kNmsPad = 8;

// alive[j] = 0 for every j in [j0, j1) whose IoU with one of the boxes kept[0..nk) exceeds
// threshold: torchvision's CPU formula, inter / (area_kept + area_j - inter), bit for bit.
template <typename A>
using NmsSuppressFn = void (*)(const NmsBoxes<A>& b, const int64_t* kept, int nk, int64_t j0, int64_t j1,
                               A threshold, uint8_t* alive);

// The same test for one kept box k against the candidates [j0, j1) of arrays sorted by x1 (a
// window of boxes that can overlap k): candidate j at scan position pos[j] is suppressed when
// pos[j] >= min_pos (after k) and IoU(k, j) > threshold; alive (by scan position) and alive_x
// (by window index) are both cleared.
template <typename A>
struct NmsKeptBox {
  A x1, y1, x2, y2, area;
};
template <typename A>
using NmsSuppressWindowFn = void (*)(const NmsBoxes<A>& xb, const int32_t* pos, int64_t j0, int64_t j1,
                                     const NmsKeptBox<A>& k, int32_t min_pos, A threshold, uint8_t* alive,
                                     uint8_t* alive_x);

#define OPFORGE_NMS_VARIANT_DECLS              \
  NmsSuppressFn<float> nms_suppress_f32();     \
  NmsSuppressFn<double> nms_suppress_f64();    \
  NmsSuppressWindowFn<float> nms_window_f32(); \
  NmsSuppressWindowFn<double> nms_window_f64();

namespace cpu_default {
OPFORGE_NMS_VARIANT_DECLS
}  // namespace cpu_default
#if OPFORGE_CPU_AVX2_VARIANT
namespace cpu_avx2 {
OPFORGE_NMS_VARIANT_DECLS
}  // namespace cpu_avx2
#endif

template <typename A>
NmsSuppressWindowFn<A> nms_window_fn(CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) {
    if constexpr (sizeof(A) == 4)
      return cpu_avx2::nms_window_f32();
    else
      return cpu_avx2::nms_window_f64();
  }
#endif
  if constexpr (sizeof(A) == 4)
    return cpu_default::nms_window_f32();
  else
    return cpu_default::nms_window_f64();
}

template <typename A>
NmsSuppressFn<A> nms_suppress_fn(CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) {
    if constexpr (sizeof(A) == 4)
      return cpu_avx2::nms_suppress_f32();
    else
      return cpu_avx2::nms_suppress_f64();
  }
#endif
  if constexpr (sizeof(A) == 4)
    return cpu_default::nms_suppress_f32();
  else
    return cpu_default::nms_suppress_f64();
}

}  // namespace opforge
