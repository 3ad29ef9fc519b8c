// attention CPU softmax loops: the AVX2 + FMA variant (Sleef's exp), used when torch reports AVX2.
#include "common/cpu_variant_avx2.h"
#if OPFORGE_CPU_AVX2_VARIANT
#define OPFORGE_CPU_VARIANT_NS cpu_avx2
#include "attention/cpu/attention_kernel_impl.h"
#endif
