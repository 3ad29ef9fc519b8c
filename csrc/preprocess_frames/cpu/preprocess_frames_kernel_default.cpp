// preprocess_frames CPU rows: the portable variant (SSE2 on x86-64).
#define CPU_CAPABILITY DEFAULT
#define OPFORGE_CPU_VARIANT_NS cpu_default
#include "preprocess_frames/cpu/preprocess_frames_kernel_impl.h"
