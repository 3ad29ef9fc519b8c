// CPU instruction-set variants of hot loops, chosen at run time.
//
// A variant is a translation unit that defines CPU_CAPABILITY (ATen's macro: at::vec puts its
// types in an inline namespace of that name, so each variant gets its own Vectorized<T>) and
// includes an op's *_impl.h. The AVX2 variant is compiled with `#pragma GCC target` instead of
// per-file flags (setuptools has none), and is picked when torch reports AVX2 or better, so
// ATEN_CPU_CAPABILITY=default forces the portable variant, as it does for torch's own kernels.
// Variants only hold contiguous inner loops on raw pointers; drivers, checks and scalar code
// stay in portable translation units.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPFORGE_CPU_AVX2_VARIANT 1
#else
#define OPFORGE_CPU_AVX2_VARIANT 0
#endif

namespace opforge {

enum class CpuIsa { kDefault, kAvx2 };

// The variant to run on this machine (decided once).
CpuIsa cpu_isa();

const char* cpu_isa_name(CpuIsa isa);

}  // namespace opforge
