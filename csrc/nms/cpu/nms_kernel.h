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

}  // namespace opforge
