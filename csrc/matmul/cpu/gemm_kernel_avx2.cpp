// matmul CPU GEMM: the AVX2 + FMA + F16C variant, used when torch reports AVX2.
// setuptools has no per-file compiler flags, so the target is set by pragma; headers that test
// the ISA macros (sleef.h, at::vec) see them defined as -mavx2 -mfma -mf16c would define them.
#include "common/cpu_isa.h"
#if OPFORGE_CPU_AVX2_VARIANT
#pragma GCC target("avx,avx2,fma,f16c")
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#define OPFORGE_CPU_VARIANT_NS cpu_avx2
#include "matmul/cpu/gemm_kernel_impl.h"
#endif
