// vector_add CPU inner loop: the portable variant (SSE2 on x86-64).
#define CPU_CAPABILITY DEFAULT
#define OPFORGE_CPU_VARIANT_NS cpu_default
#include "vector_add/cpu/vector_add_kernel_impl.h"
