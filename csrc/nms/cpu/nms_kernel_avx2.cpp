// nms CPU suppression loop: the AVX2 variant (no at::vec here: the pragma alone, see
// common/cpu_variant_avx2.h).
#include <type_traits>

#include "common/cpu_isa.h"
#if OPFORGE_CPU_AVX2_VARIANT
#pragma GCC target("avx,avx2,fma,f16c")
#define OPFORGE_CPU_VARIANT_NS cpu_avx2
#include "nms/cpu/nms_kernel_impl.h"
#endif
