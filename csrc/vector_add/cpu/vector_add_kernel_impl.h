// vector_add CPU inner loop, compiled once per CPU variant: the including file defines
// CPU_CAPABILITY (and CPU_CAPABILITY_AVX2 for that variant) and OPFORGE_CPU_VARIANT_NS first.
// Only at::vec is used here (no c10 scalar conversions): tails use at::vec's partial loads and
// stores, so nothing compiled for a wider ISA can be shared with the portable variant.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "vector_add/cpu/vector_add_kernel.h"

namespace opforge {
namespace OPFORGE_CPU_VARIANT_NS {
namespace {

template <typename T>
void add_contiguous(void* out_, const void* a_, const void* b_, int64_t n) {
  using Vec = at::vec::Vectorized<T>;
  auto* out = static_cast<T*>(out_);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  constexpr int64_t kStep = Vec::size();
  int64_t i = 0;
  if constexpr (at::is_reduced_floating_point_v<T>) {
    // Widen to float, add, round once: the correctly rounded sum, bit-identical to torch.add.
    auto add = [](const Vec& x, const Vec& y) {
      auto [x0, x1] = at::vec::convert_to_float<T>(x);
      auto [y0, y1] = at::vec::convert_to_float<T>(y);
      return at::vec::convert_from_float<T>(x0 + y0, x1 + y1);
    };
    for (; i + kStep <= n; i += kStep) add(Vec::loadu(a + i), Vec::loadu(b + i)).store(out + i);
    if (i < n) {
      const int64_t rest = n - i;
      add(Vec::loadu(a + i, rest), Vec::loadu(b + i, rest)).store(out + i, static_cast<int>(rest));
    }
  } else {
    // Two vectors per step: independent loads in flight.
    for (; i + 2 * kStep <= n; i += 2 * kStep) {
      const Vec s0 = Vec::loadu(a + i) + Vec::loadu(b + i);
      const Vec s1 = Vec::loadu(a + i + kStep) + Vec::loadu(b + i + kStep);
      s0.store(out + i);
      s1.store(out + i + kStep);
    }
    for (; i < n; i += kStep) {
      const int64_t rest = n - i < kStep ? n - i : kStep;
      (Vec::loadu(a + i, rest) + Vec::loadu(b + i, rest)).store(out + i, static_cast<int>(rest));
    }
  }
}

}  // namespace

AddContiguousFn vector_add_contiguous(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &add_contiguous<float>;
    case DType::kFloat64:
      return &add_contiguous<double>;
    case DType::kFloat16:
      return &add_contiguous<c10::Half>;
    case DType::kBFloat16:
      return &add_contiguous<c10::BFloat16>;
    case DType::kFloat8E4M3:  // (no kernel: the op's checks refuse it)
      break;
  }
  return nullptr;
}

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
