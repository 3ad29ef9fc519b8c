#include "common/cpu_isa.h"

#include <ATen/Version.h>

#include <string>

namespace opforge {

CpuIsa cpu_isa() {
  static const CpuIsa isa = [] {
    // torch's own choice: the CPU's best, lowered by ATEN_CPU_CAPABILITY.
    const std::string cap = at::get_cpu_capability();
    if (OPFORGE_CPU_AVX2_VARIANT && (cap == "AVX2" || cap == "AVX512")) return CpuIsa::kAvx2;
    return CpuIsa::kDefault;
  }();
  return isa;
}

const char* cpu_isa_name(CpuIsa isa) {
  return isa == CpuIsa::kAvx2 ? "avx2" : "default";
}

}  // namespace opforge

#include <torch/library.h>

// torch.ops.opforge._cpu_isa() (schema in registration.cpp): no tensor argument, so one kernel
// serves every dispatch key.
TORCH_LIBRARY_IMPL(opforge, CompositeExplicitAutograd, m) {
  m.impl("_cpu_isa", [] { return std::string(opforge::cpu_isa_name(opforge::cpu_isa())); });
}
