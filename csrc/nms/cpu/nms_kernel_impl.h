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

// GCC/Clang vector extensions: kLanes lanes of A, one YMM register of floats in the AVX2 variant
// (two XMM in the portable one).
constexpr int kLanes = 8;

template <typename A>
struct Lanes {
  using M = typename std::conditional<sizeof(A) == 4, int32_t, int64_t>::type;
  typedef A V __attribute__((vector_size(sizeof(A) * kLanes)));
  typedef M VM __attribute__((vector_size(sizeof(A) * kLanes)));

  static V load(const A* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static V splat(A x) { return V{} + x; }
  static bool any(const VM& v) {
    M out[kLanes];
    std::memcpy(out, &v, sizeof(VM));
    M acc = 0;
    for (int l = 0; l < kLanes; ++l) acc |= out[l];
    return acc != 0;
  }
  // Any of the group [j, j + m) still alive?
  static bool live(const uint8_t* alive, int64_t j, int m) {
    uint64_t bits = 0;
    std::memcpy(&bits, alive + j, m);
    return bits != 0;
  }
  // The intersection area of kept box k with kLanes candidates, written as torchvision's
  // std::max/std::min so that NaN propagates exactly as in its scalar code.
  static V intersection(const V& kx1, const V& ky1, const V& kx2, const V& ky2, const V& x1, const V& y1,
                        const V& x2, const V& y2) {
    const V zero = V{};
    const V xx1 = kx1 < x1 ? x1 : kx1;  // std::max(x1[k], x1[j])
    const V yy1 = ky1 < y1 ? y1 : ky1;
    const V xx2 = x2 < kx2 ? x2 : kx2;  // std::min(x2[k], x2[j])
    const V yy2 = y2 < ky2 ? y2 : ky2;
    const V dw = xx2 - xx1, dh = yy2 - yy1;
    const V w = zero < dw ? dw : zero;  // std::max(0, dw)
    const V h = zero < dh ? dh : zero;
    return w * h;
  }
  // IoU > threshold, from the intersection: inter / (area_k + area_j - inter).
  static VM suppresses(const V& inter, const V& karea, const V& area, const V& thr) {
    return inter / (karea + area - inter) > thr;
  }
};

template <typename A>
void suppress(const NmsBoxes<A>& b, const int64_t* kept, int nk, int64_t j0, int64_t j1, A threshold,
              uint8_t* alive) {
  using Ln = Lanes<A>;
  using V = typename Ln::V;
  using VM = typename Ln::VM;
  const V thr = Ln::splat(threshold);
  const bool skip_disjoint = threshold >= A(0);
  for (int64_t j = j0; j < j1; j += kLanes) {
    const int m = j1 - j < kLanes ? static_cast<int>(j1 - j) : kLanes;
    if (!Ln::live(alive, j, m)) continue;
    const V x1 = Ln::load(b.x1 + j), y1 = Ln::load(b.y1 + j), x2 = Ln::load(b.x2 + j),
            y2 = Ln::load(b.y2 + j);
    const V area = Ln::load(b.area + j);
    VM gone = VM{};
    for (int q = 0; q < nk; ++q) {
      const int64_t k = kept[q];
      const V inter = Ln::intersection(Ln::splat(b.x1[k]), Ln::splat(b.y1[k]), Ln::splat(b.x2[k]),
                                       Ln::splat(b.y2[k]), x1, y1, x2, y2);
      // With a threshold >= 0 only overlapping boxes can be suppressed (IoU is otherwise 0, -0 or
      // NaN): most kept boxes overlap none of the candidates and cost no division.
      if (skip_disjoint && !Ln::any(inter > V{})) continue;
      gone |= Ln::suppresses(inter, Ln::splat(b.area[k]), area, thr);
      if (!Ln::any(~gone)) break;  // all suppressed
    }
    typename Ln::M g[kLanes];
    std::memcpy(g, &gone, sizeof(VM));
    for (int l = 0; l < m; ++l)
      if (g[l]) alive[j + l] = 0;
  }
}

template <typename A>
void suppress_window(const NmsBoxes<A>& xb, const int32_t* pos, int64_t j0, int64_t j1,
                     const NmsKeptBox<A>& k, int32_t min_pos, A threshold, uint8_t* alive, uint8_t* alive_x) {
  using Ln = Lanes<A>;
  using V = typename Ln::V;
  using VM = typename Ln::VM;
  const V thr = Ln::splat(threshold);
  const V kx1 = Ln::splat(k.x1), ky1 = Ln::splat(k.y1), kx2 = Ln::splat(k.x2), ky2 = Ln::splat(k.y2);
  const V karea = Ln::splat(k.area);
  for (int64_t j = j0; j < j1; j += kLanes) {
    const int m = j1 - j < kLanes ? static_cast<int>(j1 - j) : kLanes;
    if (!Ln::live(alive_x, j, m)) continue;
    const V inter = Ln::intersection(kx1, ky1, kx2, ky2, Ln::load(xb.x1 + j), Ln::load(xb.y1 + j),
                                     Ln::load(xb.x2 + j), Ln::load(xb.y2 + j));
    const VM gone = Ln::suppresses(inter, karea, Ln::load(xb.area + j), thr);
    typename Ln::M g[kLanes];
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

NmsSuppressFn<float> nms_suppress_f32() {
  return &suppress<float>;
}
NmsSuppressFn<double> nms_suppress_f64() {
  return &suppress<double>;
}
NmsSuppressWindowFn<float> nms_window_f32() {
  return &suppress_window<float>;
}
NmsSuppressWindowFn<double> nms_window_f64() {
  return &suppress_window<double>;
}

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
