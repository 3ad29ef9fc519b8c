// attention CPU softmax loops, compiled once per CPU variant (attention_kernel_{default,avx2}.cpp):
// at::vec's exp_u20 (a degree-5 polynomial, within 20 ulp: what PyTorch's own CPU flash attention
// uses) in the AVX2 variant.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>

#include "attention/cpu/attention_kernel.h"

namespace opforge {
namespace OPFORGE_CPU_VARIANT_NS {
namespace {

using Vec = at::vec::Vectorized<float>;

float row_max(const float* x, int64_t n, float init) {
  int64_t i = 0;
  Vec acc(init);
  for (; i + Vec::size() <= n; i += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(x + i));
  // (at::vec::maximum propagates NaN; so does the tail: NaN scores make the row NaN, as in SDPA)
  float m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, acc);
  for (; i < n; ++i) m = std::isnan(m) || x[i] <= m ? m : x[i];
  return m;
}

template <bool kSum>
float exp_rows(float* x, int64_t n, float m) {
  const Vec vm(m);
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec e = (Vec::loadu(x + i) - vm).exp_u20();
    e.store(x + i);
    if constexpr (kSum) acc = acc + e;
  }
  if (i < n) {
    const int64_t rest = n - i;
    const Vec e = (Vec::loadu(x + i, rest) - vm).exp_u20();
    e.store(x + i, rest);
    if constexpr (kSum) acc = acc + Vec::set(Vec(0.0f), e, rest);
  }
  if constexpr (kSum) return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
  return 0.0f;
}

float exp_sum(float* x, int64_t n, float m) {
  return exp_rows<true>(x, n, m);
}
void exp_only(float* x, int64_t n, float m) {
  exp_rows<false>(x, n, m);
}

float dot(const float* a, const float* b, int64_t d) {
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= d; i += Vec::size())
    acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < d; ++i) sum += a[i] * b[i];
  return sum;
}

float reduce_add(Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

// s[r][c] = q_r . k_c. Four keys a step, one accumulator each (four independent FMA chains; each
// dot sums in the same order as dot()).
void scores(const float* q, int64_t rows, const float* k, int64_t ld, int64_t cols, int64_t d, float* s) {
  int64_t c = 0;
  for (; c + 4 <= cols; c += 4) {
    const float* k0 = k + c * ld;
    const float *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * d;
      Vec a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
      int64_t i = 0;
      for (; i + Vec::size() <= d; i += Vec::size()) {
        const Vec qv = Vec::loadu(qr + i);
        a0 = at::vec::fmadd(qv, Vec::loadu(k0 + i), a0);
        a1 = at::vec::fmadd(qv, Vec::loadu(k1 + i), a1);
        a2 = at::vec::fmadd(qv, Vec::loadu(k2 + i), a2);
        a3 = at::vec::fmadd(qv, Vec::loadu(k3 + i), a3);
      }
      float s0 = reduce_add(a0), s1 = reduce_add(a1), s2 = reduce_add(a2), s3 = reduce_add(a3);
      for (; i < d; ++i) {
        s0 += qr[i] * k0[i], s1 += qr[i] * k1[i], s2 += qr[i] * k2[i], s3 += qr[i] * k3[i];
      }
      float* out = s + r * cols + c;
      out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
    }
  }
  for (; c < cols; ++c) {
    const float* kc = k + c * ld;
    for (int64_t r = 0; r < rows; ++r) s[r * cols + c] = dot(q + r * d, kc, d);
  }
}

// o_r += sum_c p[r][c] v_c. The output row stays in registers over all keys, four vectors of it at
// a time (each element still sums the keys in order).
void accumulate(const float* p, int64_t rows, const float* v, int64_t ld, int64_t cols, int64_t d, float* o) {
  constexpr int64_t kW = 4;
  const int64_t step = kW * Vec::size();
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = o + r * d;
    const float* prow = p + r * cols;
    int64_t i = 0;
    for (; i + step <= d; i += step) {
      Vec o0 = Vec::loadu(orow + i), o1 = Vec::loadu(orow + i + Vec::size());
      Vec o2 = Vec::loadu(orow + i + 2 * Vec::size()), o3 = Vec::loadu(orow + i + 3 * Vec::size());
      for (int64_t c = 0; c < cols; ++c) {
        const float w = prow[c];
        if (w == 0.0f) continue;  // (masked keys)
        const float* vc = v + c * ld + i;
        const Vec vw(w);
        o0 = at::vec::fmadd(vw, Vec::loadu(vc), o0);
        o1 = at::vec::fmadd(vw, Vec::loadu(vc + Vec::size()), o1);
        o2 = at::vec::fmadd(vw, Vec::loadu(vc + 2 * Vec::size()), o2);
        o3 = at::vec::fmadd(vw, Vec::loadu(vc + 3 * Vec::size()), o3);
      }
      o0.store(orow + i), o1.store(orow + i + Vec::size());
      o2.store(orow + i + 2 * Vec::size()), o3.store(orow + i + 3 * Vec::size());
    }
    for (; i + Vec::size() <= d; i += Vec::size()) {
      Vec acc = Vec::loadu(orow + i);
      for (int64_t c = 0; c < cols; ++c) {
        const float w = prow[c];
        if (w != 0.0f) acc = at::vec::fmadd(Vec(w), Vec::loadu(v + c * ld + i), acc);
      }
      acc.store(orow + i);
    }
    for (; i < d; ++i) {
      float acc = orow[i];
      for (int64_t c = 0; c < cols; ++c) acc += prow[c] * v[c * ld + i];
      orow[i] = acc;
    }
  }
}

}  // namespace

SoftmaxRowFns softmax_row_fns() {
  return {&row_max, &exp_sum, &exp_only, &scores, &accumulate};
}

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
