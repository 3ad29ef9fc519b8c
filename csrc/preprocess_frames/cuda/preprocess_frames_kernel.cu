// preprocess_frames: CUDA device code (no torch). Two kernels, both one pass over memory: every
// output element written once, every input byte read from DRAM once.
//  - convert: no resize (the frame lands 1:1 in the output, possibly inside a pad border). A
//    thread takes 8 consecutive output pixels of a row: packed frames are read as 8- or 16-byte
//    words (24 bytes for RGB, 32 for RGBA), each output plane written as one 16-byte store.
//  - resize: bilinear (align_corners=False, PyTorch's sampling and arithmetic). A thread takes
//    one output pixel; neighbouring lanes take neighbouring pixels, so the four taps of a warp fall
//    on a few cache lines of two input rows.
// Normalization ((v * scale) - mean) / std uses round-to-nearest intrinsics, so nvcc cannot fuse
// it into an FMA: without a resize the result is bit-identical to the plain PyTorch chain.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/launch.cuh"
#include "common/cuda/vector.cuh"
#include "preprocess_frames/preprocess_frames_params.h"

namespace opforge {
namespace {

constexpr int kConvertThreads = 256;
constexpr int kConvertPixels = 8;  // output pixels per thread
constexpr int kResizeThreads = 128;

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float normalize(const PreprocessParams& p, int k, float v) {
  const float centered = __fsub_rn(__fmul_rn(v, p.scale), p.mean[k]);
  return p.has_std ? __fdiv_rn(centered, p.std[k]) : centered;
}

// Input channel of output channel k: RGB order kept, or reversed (BGR <-> RGB).
template <bool kSwap>
__device__ __forceinline__ constexpr int in_channel(int k) {
  return kSwap ? 2 - k : k;
}

// Byte b of a little-endian array of 32-bit words (b a compile-time constant after unrolling).
__device__ __forceinline__ uint32_t byte_of(const uint32_t* words, int b) {
  return (words[b >> 2] >> (8 * (b & 3))) & 0xffu;
}

// The kConvertPixels values of output channel k, stored at `dst` (a row position of one plane).
template <typename T>
__device__ __forceinline__ void store_group(T* dst, const float (&v)[kConvertPixels], int valid, bool vec) {
  if (vec && valid == kConvertPixels) {
    constexpr int kPer = 16 / sizeof(T);  // elements per 16-byte store
#pragma unroll
    for (int s = 0; s < kConvertPixels / kPer; ++s) {
      cuda::Pack<T, kPer> pack;
#pragma unroll
      for (int j = 0; j < kPer; ++j) pack.v[j] = from_float<T>(v[s * kPer + j]);
      reinterpret_cast<cuda::Pack<T, kPer>*>(dst)[s] = pack;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kConvertPixels; ++j)
      if (j < valid) dst[j] = from_float<T>(v[j]);
  }
}

template <typename T, bool kSwap>
__global__ void __launch_bounds__(kConvertThreads) convert_kernel(const PreprocessParams p) {
  const int64_t groups_per_row = (p.out_w + kConvertPixels - 1) / kConvertPixels;
  const int64_t total = p.n * p.out_h * groups_per_row;
  const int64_t plane = p.out_h * p.out_w;
  const bool vec_store = p.out_w % kConvertPixels == 0;
  const bool packed = preprocess_packed(p);
  T* out = static_cast<T*>(p.out);
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kConvertThreads + threadIdx.x; g < total;
       g += static_cast<int64_t>(gridDim.x) * kConvertThreads) {
    const int64_t row = g / groups_per_row;
    const int64_t x0 = (g - row * groups_per_row) * kConvertPixels;
    const int64_t img = row / p.out_h;
    const int64_t oy = row - img * p.out_h;
    const int64_t sy = oy - p.top;
    const int64_t sx0 = x0 - p.left;
    const bool row_in = sy >= 0 && sy < p.rh;
    const uint8_t* src = p.in + img * p.s_n + (row_in ? sy : 0) * p.s_h;
    float v[3][kConvertPixels];
    bool done = false;
    if (row_in && sx0 >= 0 && sx0 + kConvertPixels <= p.rw && packed) {
      const uint8_t* px = src + sx0 * p.c;
      if (p.c == 3 && cuda::is_aligned(px, 8)) {
        uint32_t w[6];
        const uint2* q = reinterpret_cast<const uint2*>(px);
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          const uint2 t = __ldg(q + i);
          w[2 * i] = t.x;
          w[2 * i + 1] = t.y;
        }
#pragma unroll
        for (int j = 0; j < kConvertPixels; ++j)
#pragma unroll
          for (int k = 0; k < 3; ++k)
            v[k][j] = normalize(p, k, static_cast<float>(byte_of(w, 3 * j + in_channel<kSwap>(k))));
        done = true;
      } else if (p.c == 4 && cuda::is_aligned(px, 16)) {
        uint32_t w[8];
        const uint4* q = reinterpret_cast<const uint4*>(px);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint4 t = __ldg(q + i);
          w[4 * i] = t.x;
          w[4 * i + 1] = t.y;
          w[4 * i + 2] = t.z;
          w[4 * i + 3] = t.w;
        }
#pragma unroll
        for (int j = 0; j < kConvertPixels; ++j)
#pragma unroll
          for (int k = 0; k < 3; ++k)
            v[k][j] = normalize(p, k, static_cast<float>(byte_of(w, 4 * j + in_channel<kSwap>(k))));
        done = true;
      }
    }
    if (!done) {
      // Any strides, the border, a row's last partial group.
#pragma unroll
      for (int j = 0; j < kConvertPixels; ++j) {
        const int64_t sx = sx0 + j;
        const bool inside = row_in && sx >= 0 && sx < p.rw && x0 + j < p.out_w;
#pragma unroll
        for (int k = 0; k < 3; ++k)
          v[k][j] = inside ? normalize(p, k, static_cast<float>(__ldg(src + sx * p.s_w + in_channel<kSwap>(k) * p.s_c)))
                           : p.pad[k];
      }
    }
    const int valid = static_cast<int>(p.out_w - x0 < kConvertPixels ? p.out_w - x0 : kConvertPixels);
    T* dst = out + img * 3 * plane + oy * p.out_w + x0;
#pragma unroll
    for (int k = 0; k < 3; ++k) store_group(dst + k * plane, v[k], valid, vec_store);
  }
}

// PyTorch's bilinear source index (align_corners=False): clamped at 0 below, the upper tap
// clamped to the last pixel.
struct Tap {
  int64_t i0, i1;
  float l1;
};
__device__ __forceinline__ Tap source_tap(float src_per_dst, int64_t dst, int64_t in_size) {
  float s = src_per_dst * (static_cast<float>(dst) + 0.5f) - 0.5f;
  s = s < 0.0f ? 0.0f : s;
  const int64_t i0 = static_cast<int64_t>(s);
  return {i0, i0 + (i0 < in_size - 1 ? 1 : 0), s - static_cast<float>(i0)};
}

template <typename T, bool kSwap>
__global__ void __launch_bounds__(kResizeThreads) resize_kernel(const PreprocessParams p) {
  const int64_t segs = (p.out_w + kResizeThreads - 1) / kResizeThreads;
  const int64_t total = p.n * p.out_h * segs;
  const int64_t plane = p.out_h * p.out_w;
  T* out = static_cast<T*>(p.out);
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int64_t row = t / segs;
    const int64_t ox = (t - row * segs) * kResizeThreads + threadIdx.x;
    if (ox >= p.out_w) continue;
    const int64_t img = row / p.out_h;
    const int64_t oy = row - img * p.out_h;
    const int64_t dy = oy - p.top, dx = ox - p.left;
    float v[3];
    if (dy >= 0 && dy < p.rh && dx >= 0 && dx < p.rw) {
      const Tap ty = source_tap(p.src_per_dst_y, dy, p.h);
      const Tap tx = source_tap(p.src_per_dst_x, dx, p.w);
      const float h1 = ty.l1, h0 = 1.0f - h1, w1 = tx.l1, w0 = 1.0f - w1;
      const uint8_t* r0 = p.in + img * p.s_n + ty.i0 * p.s_h;
      const uint8_t* r1 = p.in + img * p.s_n + ty.i1 * p.s_h;
      const int64_t c0 = tx.i0 * p.s_w, c1 = tx.i1 * p.s_w;
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int64_t ch = in_channel<kSwap>(k) * p.s_c;
        const float p00 = __ldg(r0 + c0 + ch), p01 = __ldg(r0 + c1 + ch);
        const float p10 = __ldg(r1 + c0 + ch), p11 = __ldg(r1 + c1 + ch);
        v[k] = normalize(p, k, h0 * (w0 * p00 + w1 * p01) + h1 * (w0 * p10 + w1 * p11));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 3; ++k) v[k] = p.pad[k];
    }
    T* dst = out + img * 3 * plane + oy * p.out_w + ox;
#pragma unroll
    for (int k = 0; k < 3; ++k) dst[k * plane] = from_float<T>(v[k]);
  }
}

template <typename T, bool kSwap>
cudaError_t launch(const PreprocessParams& p, cudaStream_t stream) {
  if (p.resize) {
    const int64_t segs = (p.out_w + kResizeThreads - 1) / kResizeThreads;
    const unsigned grid = cuda::grid_for_tiles(p.n * p.out_h * segs, kResizeThreads, p.num_sms);
    resize_kernel<T, kSwap><<<grid, kResizeThreads, 0, stream>>>(p);
  } else {
    const int64_t groups = p.n * p.out_h * ((p.out_w + kConvertPixels - 1) / kConvertPixels);
    const unsigned grid =
        cuda::grid_for_tiles((groups + kConvertThreads - 1) / kConvertThreads, kConvertThreads, p.num_sms);
    convert_kernel<T, kSwap><<<grid, kConvertThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_for(const PreprocessParams& p, cudaStream_t stream) {
  return p.ch[0] == 0 ? launch<T, false>(p, stream) : launch<T, true>(p, stream);
}

}  // namespace

int run_preprocess_frames_cuda(const PreprocessParams& p, void* stream) {
  if (p.n == 0) return cudaSuccess;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.out_dtype) {
    case DType::kFloat32: return launch_for<float>(p, s);
    case DType::kFloat16: return launch_for<__half>(p, s);
    case DType::kBFloat16: return launch_for<__nv_bfloat16>(p, s);
    case DType::kFloat64: break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace opforge
