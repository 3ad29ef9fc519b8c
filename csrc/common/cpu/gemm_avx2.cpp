// CPU GEMM: the AVX2 + FMA + F16C variant, used when torch reports AVX2.
#include "common/cpu_variant_avx2.h"
#if OPFORGE_CPU_AVX2_VARIANT
#define OPFORGE_CPU_VARIANT_NS cpu_avx2
#include "common/cpu/gemm_impl.h"
#endif
