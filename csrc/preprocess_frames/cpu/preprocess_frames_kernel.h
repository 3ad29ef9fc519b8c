// preprocess_frames CPU: the row loop, one instantiation per CPU variant (common/cpu_isa.h).
#pragma once

#include <cstdint>

#include "common/cpu_isa.h"
#include "preprocess_frames/preprocess_frames_params.h"

namespace opforge {

// Horizontal bilinear taps of the resized region's columns, computed once per call.
struct PreprocessTaps {
  // Without a resize: the normalized value of every uint8 value, per output channel (3 x 256),
  // computed once in float32 with each operation rounded (bit-identical to the PyTorch chain).
  const float* lut = nullptr;
  const int64_t* x0 = nullptr;  // left tap's byte offset in a row (i0 * s_w)
  const int64_t* x1 = nullptr;  // right tap's
  const float* l1 = nullptr;    // weight of the right tap
  // Packed frames: 32-bit word offsets the vector path gathers (a tap on a 3-channel row's last
  // pixel starts one byte early, its channels then shifted by 8 bits), null when not used.
  const int32_t* g0 = nullptr;
  const int32_t* g1 = nullptr;
  const int32_t* sh0 = nullptr;
  const int32_t* sh1 = nullptr;
};

// Output rows [begin, end) of all frames (row = frame * out_h + oy).
using PreprocessRowsFn = void (*)(const PreprocessParams& p, const PreprocessTaps& taps, int64_t begin,
                                  int64_t end);

namespace cpu_default {
PreprocessRowsFn preprocess_rows(DType out_dtype);
}
#if OPFORGE_CPU_AVX2_VARIANT
namespace cpu_avx2 {
PreprocessRowsFn preprocess_rows(DType out_dtype);
}
#endif

inline PreprocessRowsFn preprocess_rows(DType out_dtype, CpuIsa isa) {
#if OPFORGE_CPU_AVX2_VARIANT
  if (isa == CpuIsa::kAvx2) return cpu_avx2::preprocess_rows(out_dtype);
#endif
  return cpu_default::preprocess_rows(out_dtype);
}

}  // namespace opforge
