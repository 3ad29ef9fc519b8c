// nms CPU suppression loop, compiled once per CPU variant (see common/cpu_isa.h): plain loops
// over 8 candidates at a time that the compiler vectorizes; groups with no live candidate are
// skipped, and a group stops testing kept boxes once all its candidates are suppressed.
#include <cstring>

#include "nms/cpu/nms_kernel.h"

namespace opforge {
namespace OPFORGE_CPU_VARIANT_NS {
namespace {

template <typename A>
void suppress(const NmsBoxes<A>& b, const int64_t* kept, int nk, int64_t j0, int64_t j1, A threshold,
              uint8_t* alive) {
  using Mask = typename std::conditional<sizeof(A) == 4, int32_t, int64_t>::type;
  constexpr int L = 8;
  for (int64_t j = j0; j < j1; j += L) {
    const int m = j1 - j < L ? static_cast<int>(j1 - j) : L;
    uint64_t live = 0;
    std::memcpy(&live, alive + j, m);
    if (live == 0) continue;
    const A* __restrict__ x1 = b.x1 + j;
    const A* __restrict__ y1 = b.y1 + j;
    const A* __restrict__ x2 = b.x2 + j;
    const A* __restrict__ y2 = b.y2 + j;
    const A* __restrict__ area = b.area + j;
    Mask gone[L] = {};
    for (int q = 0; q < nk; ++q) {
      const int64_t k = kept[q];
      const A kx1 = b.x1[k], ky1 = b.y1[k], kx2 = b.x2[k], ky2 = b.y2[k], karea = b.area[k];
      Mask all = -1;
#pragma GCC unroll 8
      for (int l = 0; l < L; ++l) {
        const A xx1 = kx1 < x1[l] ? x1[l] : kx1;
        const A yy1 = ky1 < y1[l] ? y1[l] : ky1;
        const A xx2 = x2[l] < kx2 ? x2[l] : kx2;
        const A yy2 = y2[l] < ky2 ? y2[l] : ky2;
        const A dw = xx2 - xx1, dh = yy2 - yy1;
        const A w = A(0) < dw ? dw : A(0);
        const A h = A(0) < dh ? dh : A(0);
        const A inter = w * h;
        const A iou = inter / (karea + area[l] - inter);
        gone[l] |= iou > threshold ? Mask(-1) : Mask(0);
        all &= gone[l];
      }
      if (all) break;
    }
    for (int l = 0; l < m; ++l)
      if (gone[l]) alive[j + l] = 0;
  }
}

}  // namespace

NmsSuppressFn<float> nms_suppress_f32() { return &suppress<float>; }
NmsSuppressFn<double> nms_suppress_f64() { return &suppress<double>; }

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
