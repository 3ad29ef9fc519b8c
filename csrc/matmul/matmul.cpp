// matmul: C++ entry (through the dispatcher), input checks and variant names.
#include "matmul/matmul.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

#include "common/checks.h"
#include "opforge.h"

namespace opforge {
namespace {

struct NamedVariant {
  MatmulVariant variant;
  const char* name;
};
constexpr NamedVariant kVariants[] = {
    {MatmulVariant::kAuto, "auto"},
    {MatmulVariant::kNaive, "naive"},
    {MatmulVariant::kSmemTiled, "smem_tiled"},
    {MatmulVariant::kRegisterBlocked, "register_blocked"},
    {MatmulVariant::kWarpTiled, "warp_tiled"},
    {MatmulVariant::kWarpTiledStaged, "warp_tiled_staged"},
    {MatmulVariant::kWarpTiledCpAsync, "warp_tiled_cp_async"},
    {MatmulVariant::kMma, "mma"},
    {MatmulVariant::kMmaCpAsync, "mma_cp_async"},
    {MatmulVariant::kMmaTma, "mma_tma"},
    {MatmulVariant::kMmaWs, "mma_ws"},
    {MatmulVariant::kWgmma, "wgmma"},
};

}  // namespace

MatmulVariant parse_matmul_variant(std::string_view name) {
  std::string all;
  for (const auto& v : kVariants) {
    if (name == v.name) return v.variant;
    all += (all.empty() ? "" : ", ") + std::string(v.name);
  }
  TORCH_CHECK_VALUE(false, "opforge.matmul: unknown variant '", std::string(name),
                    "'; the variants are: ", all);
}

const char* matmul_variant_name(MatmulVariant v) {
  for (const auto& named : kVariants)
    if (named.variant == v) return named.name;
  return "?";
}

void check_matmul_inputs(const at::Tensor& a, const at::Tensor& b) {
  constexpr const char* op = "opforge.matmul";
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  TORCH_CHECK(a.dim() == 2 || a.dim() == 3, op, ": a must be 2-D (m, k) or 3-D (batch, m, k), got ", a.dim(),
              "-D with shape ", a.sizes());
  TORCH_CHECK(b.dim() == a.dim(), op, ": b must have as many dimensions as a (", a.dim(), "), got ", b.dim(),
              "-D with shape ", b.sizes());
  TORCH_CHECK(a.dim() == 2 || a.size(0) == b.size(0), op, ": b must have a's batch size (", a.size(0),
              "), got ", b.size(0));
  TORCH_CHECK(a.size(-1) == b.size(-2), op, ": inner dimensions differ: a is ", a.sizes(), " and b is ",
              b.sizes(), " (a's last dimension must equal b's second to last)");
  check_dtype_in(op, "a", a, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16});
  check_same_dtype(op, "b", b, "a", a);
  check_same_device(op, "b", b, "a", a);
}

std::vector<int64_t> matmul_output_shape(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() == 2) return {a.size(0), b.size(1)};
  return {a.size(0), a.size(1), b.size(2)};
}

GemmParams gemm_params(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& c3) {
  GemmParams p;
  p.a = a3.const_data_ptr();
  p.b = b3.const_data_ptr();
  p.c = c3.data_ptr();
  p.batch = a3.size(0);
  p.m = a3.size(1);
  p.k = a3.size(2);
  p.n = b3.size(2);
  p.a_bs = a3.stride(0);
  p.a_rs = a3.stride(1);
  p.a_cs = a3.stride(2);
  p.b_bs = b3.stride(0);
  p.b_rs = b3.stride(1);
  p.b_cs = b3.stride(2);
  p.c_bs = c3.stride(0);
  p.c_rs = c3.stride(1);
  p.dtype = to_dtype(a3.scalar_type());
  return p;
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view variant) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::matmul", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(a, b, variant);
}

}  // namespace opforge
