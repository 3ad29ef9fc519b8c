// matmul: autograd in C++ (LibTorch users get it too). For c = a @ b:
// da = dc @ b^T and db = a^T @ dc, both computed by opforge.matmul with the forward's variant.
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "matmul/matmul.h"
#include "opforge.h"

namespace opforge {
namespace {

class MatmulFunction : public torch::autograd::Function<MatmulFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            c10::string_view variant) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["variant"] = std::string(variant);
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return matmul(a, b, variant);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &dc = grads[0];
    const std::string variant = ctx->saved_data["variant"].toStringRef();
    at::Tensor da, db;
    if (ctx->needs_input_grad(0)) da = matmul(dc, b.transpose(-1, -2), variant);
    if (ctx->needs_input_grad(1)) db = matmul(a.transpose(-1, -2), dc, variant);
    return {da, db, at::Tensor()};
  }
};

// The checks first: the autograd layer would otherwise fail on an undefined (None) input with
// "tensor does not have a device".
at::Tensor matmul_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view variant) {
  check_matmul_inputs(a, b);
  return MatmulFunction::apply(a, b, variant);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("matmul", &matmul_autograd);
}

}  // namespace opforge
