// preprocess_frames: the plain parameters the CPU and CUDA kernels share (no torch types).
//
// Output pixel (n, c, oy, ox) of an (N, 3, out_h, out_w) tensor: inside the region
// [top, top + rh) x [left, left + rw) it is the frame resized to (rh, rw), sampled at
// (oy - top, ox - left); outside it is the pad value. Each value v (a uint8 pixel, or the bilinear
// blend of four) is normalized as ((v * scale) - mean[c]) / std[c], in float32 with every operation
// rounded on its own (no fused multiply-add), then rounded once to the output type: without a
// resize the result is bit-identical to the plain-PyTorch chain
// ((x.float() * scale - mean) / std).to(dtype).
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace opforge {

struct PreprocessParams {
  // Input: uint8 (N, H, W, C), strides in bytes (= elements).
  const uint8_t* in = nullptr;
  int64_t n = 0, h = 0, w = 0, c = 0;
  int64_t s_n = 0, s_h = 0, s_w = 0, s_c = 0;
  // Output: (N, 3, out_h, out_w), contiguous.
  void* out = nullptr;
  int64_t out_h = 0, out_w = 0;
  DType out_dtype = DType::kFloat16;
  // The resized frame's place in the output.
  int64_t top = 0, left = 0, rh = 0, rw = 0;
  bool resize = false;         // (rh, rw) != (h, w)
  float src_per_dst_y = 1.0f;  // h / rh, as PyTorch's bilinear computes it (float)
  float src_per_dst_x = 1.0f;  // w / rw
  int ch[3] = {0, 1, 2};       // input channel of each output channel
  float scale = 1.0f;
  float mean[3] = {0.0f, 0.0f, 0.0f};
  float std[3] = {1.0f, 1.0f, 1.0f};
  bool has_std = false;  // std given (else the division by 1 is skipped: same result)
  // 1 / std, rounded; with exact_reciprocal the quotient c / std is computed as q = c * inv,
  // q += (c - q * std) * inv (two FMAs), which the plan verified to equal the IEEE quotient for
  // every value a uint8 pixel normalizes to (Markstein's correction; checked, not assumed).
  float inv_std[3] = {1.0f, 1.0f, 1.0f};
  bool exact_reciprocal = false;
  // With `affine`, a uint8 pixel v normalizes as fma(v, affine_a[c], affine_b[c]), one rounding,
  // which the plan verified gives the same output-type value as the chain above for all 256 v of
  // every channel (checked per call, not assumed; found for most parameters when the output is
  // fp16 or bf16, whose rounding absorbs the chain's float32 roundings).
  float affine_a[3] = {1.0f, 1.0f, 1.0f};
  float affine_b[3] = {0.0f, 0.0f, 0.0f};
  bool affine = false;
  float pad[3] = {0.0f, 0.0f, 0.0f};  // the pad value, normalized like a pixel, per output channel
  int num_sms = 0;                    // CUDA: for the grid size
};

// A frame layout the vector paths read: each pixel's channels adjacent (channel stride 1, pixel
// stride C), as decoders and numpy frames store them.
constexpr bool preprocess_packed(const PreprocessParams& p) {
  return p.s_c == 1 && p.s_w == p.c;
}

// CUDA (preprocess_frames_kernel.cu); returns a cudaError_t.
int run_preprocess_frames_cuda(const PreprocessParams& p, void* stream);

}  // namespace opforge
