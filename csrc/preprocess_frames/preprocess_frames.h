// preprocess_frames: checks and the plan shared by the CPU and CUDA entries.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "preprocess_frames/preprocess_frames_params.h"

namespace opforge {

// Raise a RuntimeError (frames that do not fit) or a ValueError (an argument out of range) naming
// opforge.preprocess_frames and the argument.
void check_preprocess_frames_inputs(const at::Tensor& frames, c10::IntArrayRef out_size,
                                    c10::IntArrayRef region, double scale, c10::ArrayRef<double> mean,
                                    c10::ArrayRef<double> std, double pad_value, c10::IntArrayRef channels,
                                    at::ScalarType out_dtype);

// The op's normalization on the host, each float32 operation rounded on its own (never fused):
// v * scale - mean[k], and that divided by std[k] when std is given. The plan normalizes the pad
// value with it, the CPU kernel tabulates it for every uint8 value.
float centered_exact(float v, const PreprocessParams& p, int k);
float normalize_exact(float v, const PreprocessParams& p, int k);

struct PreprocessPlan {
  at::Tensor out;
  PreprocessParams params;
};

// Allocates the output (N, 3, out_h, out_w) of out_dtype on frames' device and fills the params.
PreprocessPlan plan_preprocess_frames(const at::Tensor& frames, c10::IntArrayRef out_size,
                                      c10::IntArrayRef region, double scale, c10::ArrayRef<double> mean,
                                      c10::ArrayRef<double> std, double pad_value, c10::IntArrayRef channels,
                                      at::ScalarType out_dtype);

}  // namespace opforge
