// attention CPU softmax loops: the portable variant (SSE2 on x86-64).
#define CPU_CAPABILITY DEFAULT
#define OPFORGE_CPU_VARIANT_NS cpu_default
#include "attention/cpu/attention_kernel_impl.h"
