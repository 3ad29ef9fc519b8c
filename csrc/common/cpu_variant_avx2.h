// Include first in a CPU variant translation unit (common/cpu_isa.h) to compile the rest of it
// for AVX2 + FMA + F16C. setuptools has no per-file compiler flags, so the target is set by
// pragma; headers that test the ISA macros (sleef.h, at::vec) see them defined as -mavx2 -mfma
// -mf16c would define them, and at::vec puts its types in the AVX2 inline namespace.
// Then: #if OPFORGE_CPU_AVX2_VARIANT ... #define OPFORGE_CPU_VARIANT_NS cpu_avx2, the op's impl ... #endif
#pragma once

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
#endif
