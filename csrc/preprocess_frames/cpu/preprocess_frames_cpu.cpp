// preprocess_frames: CPU entry. Builds the per-call tables (the normalized value of each uint8
// value without a resize; the horizontal bilinear taps with one), then runs the row loop picked
// for this CPU, parallel over output rows of all frames.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/cpu_isa.h"
#include "preprocess_frames/cpu/preprocess_frames_kernel.h"
#include "preprocess_frames/preprocess_frames.h"

namespace opforge {
namespace {

// Output pixels per task: below it a call runs serially (a thread's start costs more than the work).
constexpr int64_t kGrainPixels = 32768;

at::Tensor preprocess_frames_cpu(const at::Tensor& frames, c10::IntArrayRef size, c10::IntArrayRef region,
                                 double scale, c10::ArrayRef<double> mean, c10::ArrayRef<double> std,
                                 double pad_value, c10::IntArrayRef channels, at::ScalarType out_dtype) {
  check_preprocess_frames_inputs(frames, size, region, scale, mean, std, pad_value, channels, out_dtype);
  PreprocessPlan plan =
      plan_preprocess_frames(frames, size, region, scale, mean, std, pad_value, channels, out_dtype);
  if (plan.out.numel() == 0) return plan.out;
  const PreprocessParams& p = plan.params;

  PreprocessTaps taps;
  std::vector<float> lut;
  std::vector<int64_t> x0, x1;
  std::vector<float> l1;
  std::vector<int32_t> g0, g1, sh0, sh1;
  if (!p.resize) {
    lut.resize(3 * 256);
    for (int k = 0; k < 3; ++k)
      for (int v = 0; v < 256; ++v) lut[256 * k + v] = normalize_exact(static_cast<float>(v), p, k);
    taps.lut = lut.data();
  } else {
    x0.resize(p.rw);
    x1.resize(p.rw);
    l1.resize(p.rw);
    // Word gathers need each pixel's channels adjacent and offsets that fit 32 bits; a 3-channel
    // row of one pixel has no word to read.
    const bool gather = preprocess_packed(p) && p.w * p.c < (int64_t{1} << 31) && (p.c == 4 || p.w >= 2);
    if (gather) {
      g0.resize(p.rw);
      g1.resize(p.rw);
      sh0.resize(p.rw);
      sh1.resize(p.rw);
    }
    for (int64_t dx = 0; dx < p.rw; ++dx) {
      float sx = p.src_per_dst_x * (static_cast<float>(dx) + 0.5f) - 0.5f;
      sx = sx < 0.0f ? 0.0f : sx;
      // float32 can round sx up to w for sides near 2^23: clamp the tap and its weight.
      const int64_t i0 = std::min<int64_t>(static_cast<int64_t>(sx), p.w - 1);
      const int64_t i1 = i0 + (i0 < p.w - 1 ? 1 : 0);
      x0[dx] = i0 * p.s_w;
      x1[dx] = i1 * p.s_w;
      l1[dx] = std::min(std::max(sx - static_cast<float>(i0), 0.0f), 1.0f);
      if (gather) {
        // The last pixel of a 3-channel row is read from one byte earlier (its word would pass the row).
        const auto word = [&](int64_t i, int32_t& off, int32_t& shift) {
          const bool last = p.c == 3 && i == p.w - 1;
          off = static_cast<int32_t>(i * p.c - (last ? 1 : 0));
          shift = last ? 8 : 0;
        };
        word(i0, g0[dx], sh0[dx]);
        word(i1, g1[dx], sh1[dx]);
      }
    }
    taps.x0 = x0.data();
    taps.x1 = x1.data();
    taps.l1 = l1.data();
    if (gather) {
      taps.g0 = g0.data();
      taps.g1 = g1.data();
      taps.sh0 = sh0.data();
      taps.sh1 = sh1.data();
    }
  }
  const PreprocessRowsFn fn = preprocess_rows(p.out_dtype, cpu_isa());
  const int64_t rows = p.n * p.out_h;
  const int64_t grain = std::max<int64_t>(1, kGrainPixels / p.out_w);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) { fn(p, taps, begin, end); });
  return plan.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("preprocess_frames", &preprocess_frames_cpu);
}

}  // namespace opforge
