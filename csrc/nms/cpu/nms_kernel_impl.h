// nms CPU suppression loop, compiled once per CPU variant (see common/cpu_isa.h): plain loops
// over 8 candidates at a time that the compiler vectorizes; groups with no live candidate are
// skipped, a kept box that overlaps none of the 8 costs no division, and a group stops testing
// kept boxes once all its candidates are suppressed.
#include <cstring>
#include <type_traits>

#include "nms/cpu/nms_kernel.h"

namespace opforge {
namespace OPFORGE_CPU_VARIANT_NS {
namespace {

// GCC/Clang vector extensions: L lanes of A, one YMM register of floats in the AVX2 variant
// (two XMM in the portable one). Selects are written as torchvision's std::max/std::min, so NaN
// propagates exactly as in its scalar code.
template <typename A>
void suppress(const NmsBoxes<A>& b, const int64_t* kept, int nk, int64_t j0, int64_t j1, A threshold,
              uint8_t* alive) {
  constexpr int L = 8;
  using M = typename std::conditional<sizeof(A) == 4, int32_t, int64_t>::type;
  typedef A V __attribute__((vector_size(sizeof(A) * L)));
  typedef M VM __attribute__((vector_size(sizeof(A) * L)));
  auto load = [](const A* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  };
  auto lanes = [](const VM& v) {
    M out[L];
    std::memcpy(out, &v, sizeof(VM));
    return out[0] | out[1] | out[2] | out[3] | out[4] | out[5] | out[6] | out[7];
  };
  const V zero = V{};
  const V thr = zero + threshold;
  const bool skip_disjoint = threshold >= A(0);
  for (int64_t j = j0; j < j1; j += L) {
    const int m = j1 - j < L ? static_cast<int>(j1 - j) : L;
    uint64_t live = 0;
    std::memcpy(&live, alive + j, m);
    if (live == 0) continue;
    const V x1 = load(b.x1 + j), y1 = load(b.y1 + j), x2 = load(b.x2 + j), y2 = load(b.y2 + j);
    const V area = load(b.area + j);
    VM gone = VM{};
    for (int q = 0; q < nk; ++q) {
      const int64_t k = kept[q];
      const V kx1 = zero + b.x1[k], ky1 = zero + b.y1[k], kx2 = zero + b.x2[k], ky2 = zero + b.y2[k];
      const V xx1 = kx1 < x1 ? x1 : kx1;  // std::max(x1[k], x1[j])
      const V yy1 = ky1 < y1 ? y1 : ky1;
      const V xx2 = x2 < kx2 ? x2 : kx2;  // std::min(x2[k], x2[j])
      const V yy2 = y2 < ky2 ? y2 : ky2;
      const V dw = xx2 - xx1, dh = yy2 - yy1;
      const V w = zero < dw ? dw : zero;  // std::max(0, dw)
      const V h = zero < dh ? dh : zero;
      const V inter = w * h;
      // With a threshold >= 0 only overlapping boxes can be suppressed (IoU is otherwise 0, -0 or
      // NaN): most kept boxes overlap none of the L candidates and cost no division.
      if (skip_disjoint && !lanes(inter > zero)) continue;
      const V iou = inter / ((zero + b.area[k]) + area - inter);
      gone |= iou > thr;
      if (!lanes(~gone)) break;  // all L suppressed
    }
    M g[L];
    std::memcpy(g, &gone, sizeof(VM));
    for (int l = 0; l < m; ++l)
      if (g[l]) alive[j + l] = 0;
  }
}

template <typename A>
void suppress_window(const NmsBoxes<A>& xb, const int32_t* pos, int64_t j0, int64_t j1, const NmsKeptBox<A>& k,
                     int32_t min_pos, A threshold, uint8_t* alive, uint8_t* alive_x) {
  constexpr int L = 8;
  using M = typename std::conditional<sizeof(A) == 4, int32_t, int64_t>::type;
  typedef A V __attribute__((vector_size(sizeof(A) * L)));
  typedef M VM __attribute__((vector_size(sizeof(A) * L)));
  auto load = [](const A* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  };
  const V zero = V{};
  const V thr = zero + threshold;
  const V kx1 = zero + k.x1, ky1 = zero + k.y1, kx2 = zero + k.x2, ky2 = zero + k.y2, karea = zero + k.area;
  for (int64_t j = j0; j < j1; j += L) {
    const int m = j1 - j < L ? static_cast<int>(j1 - j) : L;
    uint64_t live = 0;
    std::memcpy(&live, alive_x + j, m);
    if (live == 0) continue;
    const V x1 = load(xb.x1 + j), y1 = load(xb.y1 + j), x2 = load(xb.x2 + j), y2 = load(xb.y2 + j);
    const V xx1 = kx1 < x1 ? x1 : kx1;  // std::max(x1[k], x1[j]), as torchvision
    const V yy1 = ky1 < y1 ? y1 : ky1;
    const V xx2 = x2 < kx2 ? x2 : kx2;  // std::min(x2[k], x2[j])
    const V yy2 = y2 < ky2 ? y2 : ky2;
    const V dw = xx2 - xx1, dh = yy2 - yy1;
    const V w = zero < dw ? dw : zero;
    const V h = zero < dh ? dh : zero;
    const V inter = w * h;
    const VM gone = inter / (karea + load(xb.area + j) - inter) > thr;
    M g[L];
    std::memcpy(g, &gone, sizeof(VM));
    for (int l = 0; l < m; ++l) {
      if (g[l] && alive_x[j + l] && pos[j + l] >= min_pos) {
        alive_x[j + l] = 0;
        alive[pos[j + l]] = 0;
      }
    }
  }
}

}  // namespace

NmsSuppressFn<float> nms_suppress_f32() { return &suppress<float>; }
NmsSuppressFn<double> nms_suppress_f64() { return &suppress<double>; }
NmsSuppressWindowFn<float> nms_window_f32() { return &suppress_window<float>; }
NmsSuppressWindowFn<double> nms_window_f64() { return &suppress_window<double>; }

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
