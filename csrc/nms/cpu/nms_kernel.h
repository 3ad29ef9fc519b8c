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

namespace cpu_default {
NmsSuppressFn<float> nms_suppress_f32();
NmsSuppressFn<double> nms_suppress_f64();
}  // namespace cpu_default
#if OPFORGE_CPU_AVX2_VARIANT
namespace cpu_avx2 {
NmsSuppressFn<float> nms_suppress_f32();
NmsSuppressFn<double> nms_suppress_f64();
}  // namespace cpu_avx2
#endif

template <typename A>
NmsSuppressFn<A> nms_suppress_fn(CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) {
    if constexpr (sizeof(A) == 4) return cpu_avx2::nms_suppress_f32(); else return cpu_avx2::nms_suppress_f64();
  }
#endif
  if constexpr (sizeof(A) == 4) return cpu_default::nms_suppress_f32(); else return cpu_default::nms_suppress_f64();
}

// The same IoU test for one pair (used inside a 64-box block, in the portable variant).
template <typename A>
inline bool nms_overlaps(const NmsBoxes<A>& b, int64_t i, int64_t j, A threshold) {
  const A xx1 = b.x1[i] < b.x1[j] ? b.x1[j] : b.x1[i];  // std::max(x1[i], x1[j])
  const A yy1 = b.y1[i] < b.y1[j] ? b.y1[j] : b.y1[i];
  const A xx2 = b.x2[j] < b.x2[i] ? b.x2[j] : b.x2[i];  // std::min(x2[i], x2[j])
  const A yy2 = b.y2[j] < b.y2[i] ? b.y2[j] : b.y2[i];
  const A dw = xx2 - xx1, dh = yy2 - yy1;
  const A w = A(0) < dw ? dw : A(0);  // std::max(0, dw)
  const A h = A(0) < dh ? dh : A(0);
  const A inter = w * h;
  return inter / (b.area[i] + b.area[j] - inter) > threshold;
}

}  // namespace opforge
