// vector_add: CPU kernel. Parallel over chunks (at::parallel_for), vectorized with at::vec;
// the 16-bit types are widened to float, added, and rounded once (bit-identical to torch.add).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>

#include "vector_add/vector_add.h"

namespace opforge {
namespace {

constexpr int64_t kGrain = 32768;  // elements per task: big enough to amortize a task's cost

template <typename T>
inline T add_scalar(T a, T b) {
  using acc_t = at::opmath_type<T>;
  return static_cast<T>(static_cast<acc_t>(a) + static_cast<acc_t>(b));
}

// out[i] = a[i] + b[i] for i < n, all contiguous.
template <typename T>
inline void add_contiguous(T* out, const T* a, const T* b, int64_t n) {
  using Vec = at::vec::Vectorized<T>;
  int64_t i = 0;
  if constexpr (at::is_reduced_floating_point_v<T>) {
    for (; i + Vec::size() <= n; i += Vec::size()) {
      auto [a0, a1] = at::vec::convert_to_float<T>(Vec::loadu(a + i));
      auto [b0, b1] = at::vec::convert_to_float<T>(Vec::loadu(b + i));
      at::vec::convert_from_float<T>(a0 + b0, a1 + b1).store(out + i);
    }
  } else {
    // Two vectors per step: independent loads in flight, half the loop overhead.
    for (; i + 2 * Vec::size() <= n; i += 2 * Vec::size()) {
      const Vec s0 = Vec::loadu(a + i) + Vec::loadu(b + i);
      const Vec s1 = Vec::loadu(a + i + Vec::size()) + Vec::loadu(b + i + Vec::size());
      s0.store(out + i);
      s1.store(out + i + Vec::size());
    }
  }
  for (; i < n; ++i) out[i] = add_scalar(a[i], b[i]);
}

template <typename T>
void add_flat(T* out, const T* a, const T* b, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    add_contiguous(out + begin, a + begin, b + begin, end - begin);
  });
}

// Any strides: rows of the innermost collapsed dim, parallel over rows.
template <typename T>
void add_strided(T* out, const T* a, const T* b, const Geometry<3>& g) {
  const int nd = g.ndim;
  const int64_t inner = g.sizes[nd - 1];
  const int64_t so = g.strides[0][nd - 1], sa = g.strides[1][nd - 1], sb = g.strides[2][nd - 1];
  const bool inner_contiguous = so == 1 && sa == 1 && sb == 1;
  const int64_t rows = g.numel / inner;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t rem = r, oo = 0, oa = 0, ob = 0;
      for (int d = nd - 2; d >= 0; --d) {
        const int64_t idx = rem % g.sizes[d];
        rem /= g.sizes[d];
        oo += idx * g.strides[0][d];
        oa += idx * g.strides[1][d];
        ob += idx * g.strides[2][d];
      }
      if (inner_contiguous) {
        add_contiguous(out + oo, a + oa, b + ob, inner);
      } else {
        for (int64_t j = 0; j < inner; ++j) out[oo + j * so] = add_scalar(a[oa + j * sa], b[ob + j * sb]);
      }
    }
  });
}

at::Tensor vector_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_vector_add_inputs(a, b);
  VectorAddPlan plan = plan_vector_add(a, b);
  if (plan.out.numel() == 0) return plan.out;
  const VectorAddParams& p = plan.params;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "opforge.vector_add", [&] {
    auto* out = static_cast<scalar_t*>(p.out);
    const auto* pa = static_cast<const scalar_t*>(p.a);
    const auto* pb = static_cast<const scalar_t*>(p.b);
    if (p.geom.is_flat())
      add_flat(out, pa, pb, p.geom.numel);
    else
      add_strided(out, pa, pb, p.geom);
  });
  return plan.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) { m.impl("vector_add", &vector_add_cpu); }

}  // namespace opforge
