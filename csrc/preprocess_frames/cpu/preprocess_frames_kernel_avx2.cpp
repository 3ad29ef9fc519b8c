// preprocess_frames CPU rows: the AVX2 + FMA + F16C variant, used when torch reports AVX2.
#include "common/cpu_variant_avx2.h"
#if OPFORGE_CPU_AVX2_VARIANT
#define OPFORGE_CPU_VARIANT_NS cpu_avx2
#include "preprocess_frames/cpu/preprocess_frames_kernel_impl.h"
#endif
