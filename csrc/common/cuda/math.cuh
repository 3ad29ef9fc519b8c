// The shared CUDA layer: the special-function unit's approximations the kernels use in their
// inner loops (ex2.approx / lg2.approx: about 2 ulp, denormal results flush to zero; tanh.approx:
// relative error below 2^-10.9, one instruction where tanhf takes about twenty).
#pragma once

#include <cuda_runtime.h>

namespace opforge {
namespace cuda {

// 2^x (-inf -> +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// log2(x) (+0 -> -inf).
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) (sm_75+).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace cuda
}  // namespace opforge
