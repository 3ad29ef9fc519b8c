// CPU GEMM: the portable variant (SSE2 on x86-64).
#define CPU_CAPABILITY DEFAULT
#define OPFORGE_CPU_VARIANT_NS cpu_default
#include "common/cpu/gemm_impl.h"
