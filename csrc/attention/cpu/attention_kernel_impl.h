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
  float m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, acc);
  for (; i < n; ++i) m = std::max(m, x[i]);
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

float exp_sum(float* x, int64_t n, float m) { return exp_rows<true>(x, n, m); }
void exp_only(float* x, int64_t n, float m) { exp_rows<false>(x, n, m); }

float dot(const float* a, const float* b, int64_t d) {
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= d; i += Vec::size()) acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < d; ++i) sum += a[i] * b[i];
  return sum;
}

void scores(const float* q, int64_t rows, const float* k, int64_t cols, int64_t d, float* s) {
  for (int64_t c = 0; c < cols; ++c) {
    const float* kc = k + c * d;
    for (int64_t r = 0; r < rows; ++r) s[r * cols + c] = dot(q + r * d, kc, d);
  }
}

void accumulate(const float* p, int64_t rows, const float* v, int64_t cols, int64_t d, float* o) {
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = o + r * d;
    const float* prow = p + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float w = prow[c];
      if (w == 0.0f) continue;  // (masked keys)
      const float* vc = v + c * d;
      const Vec vw(w);
      int64_t i = 0;
      for (; i + Vec::size() <= d; i += Vec::size()) {
        at::vec::fmadd(vw, Vec::loadu(vc + i), Vec::loadu(orow + i)).store(orow + i);
      }
      for (; i < d; ++i) orow[i] += w * vc[i];
    }
  }
}

}  // namespace

SoftmaxRowFns softmax_row_fns() { return {&row_max, &exp_sum, &exp_only, &scores, &accumulate}; }

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
