// vector_add: CPU entry. Parallel over chunks (at::parallel_for) around a vectorized inner loop
// picked for this CPU (vector_add_kernel.h); strided layouts go row by row.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>

#include "vector_add/cpu/vector_add_kernel.h"
#include "vector_add/vector_add.h"

namespace opforge {
namespace {

constexpr int64_t kGrain = 32768;  // elements per task: big enough to amortize a task's cost

template <typename T>
inline T add_scalar(T a, T b) {
  using acc_t = at::opmath_type<T>;
  return static_cast<T>(static_cast<acc_t>(a) + static_cast<acc_t>(b));
}

// Rows of the innermost collapsed dim, parallel over rows; contiguous rows use the vector loop.
template <typename T>
void add_strided(T* out, const T* a, const T* b, const Geometry<3>& g, AddContiguousFn contiguous) {
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
        contiguous(out + oo, a + oa, b + ob, inner);
      } else {
        for (int64_t j = 0; j < inner; ++j) out[oo + j * so] = add_scalar(a[oa + j * sa], b[ob + j * sb]);
      }
    }
  });
}

template <typename T>
void run(const VectorAddParams& p, AddContiguousFn contiguous) {
  auto* out = static_cast<T*>(p.out);
  const auto* a = static_cast<const T*>(p.a);
  const auto* b = static_cast<const T*>(p.b);
  if (p.geom.is_flat()) {
    at::parallel_for(0, p.geom.numel, kGrain, [&](int64_t begin, int64_t end) {
      contiguous(out + begin, a + begin, b + begin, end - begin);
    });
  } else {
    add_strided(out, a, b, p.geom, contiguous);
  }
}

at::Tensor vector_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_vector_add_inputs(a, b);
  VectorAddPlan plan = plan_vector_add(a, b);
  if (plan.out.numel() == 0) return plan.out;
  const VectorAddParams& p = plan.params;
  const AddContiguousFn contiguous = vector_add_contiguous(p.dtype, cpu_isa());
  switch (p.dtype) {
    case DType::kFloat32:
      run<float>(p, contiguous);
      break;
    case DType::kFloat64:
      run<double>(p, contiguous);
      break;
    case DType::kFloat16:
      run<c10::Half>(p, contiguous);
      break;
    case DType::kBFloat16:
      run<c10::BFloat16>(p, contiguous);
      break;
    case DType::kFloat8E4M3:  // (no kernel: the op's checks refuse it)
      break;
  }
  return plan.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("vector_add", &vector_add_cpu);
}

}  // namespace opforge
