// vector_add: C++ entry (through the dispatcher) and input checks.
#include "vector_add/vector_add.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_like.h>

#include "common/checks.h"
#include "opforge.h"

namespace opforge {

void check_vector_add_inputs(const at::Tensor& a, const at::Tensor& b) {
  constexpr const char* op = "opforge.vector_add";
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  check_dtype_in(op, "a", a, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16});
  check_same_dtype(op, "b", b, "a", a);
  check_same_device(op, "b", b, "a", a);
  check_same_shape(op, "b", b, "a", a);
}

VectorAddPlan plan_vector_add(const at::Tensor& a, const at::Tensor& b) {
  // The output always takes a's layout when a is dense, else a dense one (empty_like's rule, which
  // the fake kernel states too).
  VectorAddPlan plan{at::empty_like(a), a, b, {}};
  if (!geometry_of<3>({&plan.out, &plan.a, &plan.b}, plan.params.geom)) {
    // More than kMaxDims dims after collapsing (or more than 64): the inputs in the output's own
    // layout (a copy of each that is not: a dense a already is); three operands with the same
    // dense strides are one flat range.
    const auto in_out_layout = [&](const at::Tensor& t) {
      return t.strides() == plan.out.strides() ? t : at::empty_like(plan.out).copy_(t);
    };
    plan.a = in_out_layout(a);
    plan.b = in_out_layout(b);
    Geometry<3>& g = plan.params.geom;
    g = Geometry<3>{};
    g.ndim = 1;
    g.numel = a.numel();
    g.sizes[0] = a.numel();
    for (int op = 0; op < 3; ++op) g.strides[op][0] = 1;
  }
  plan.params.out = plan.out.data_ptr();
  plan.params.a = plan.a.const_data_ptr();
  plan.params.b = plan.b.const_data_ptr();
  plan.params.dtype = to_dtype(a.scalar_type());
  return plan;
}

at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::vector_add", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

}  // namespace opforge
