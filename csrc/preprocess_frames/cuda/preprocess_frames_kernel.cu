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
#include <type_traits>

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
  if (!p.has_std) return centered;
  if (p.exact_reciprocal) {  // the IEEE quotient (verified by the plan for every uint8 value)
    const float q = __fmul_rn(centered, p.inv_std[k]);
    return __fmaf_rn(__fmaf_rn(-q, p.std[k], centered), p.inv_std[k], q);
  }
  return __fdiv_rn(centered, p.std[k]);
}

// A byte as a float without the quarter-rate integer conversion: 2^23 + b, exactly, minus 2^23.
__device__ __forceinline__ float byte_to_float(uint32_t b) {
  return __fsub_rn(__uint_as_float(0x4B000000u | b), 8388608.0f);
}

// Input channel of output channel k: RGB order kept, or reversed (BGR <-> RGB).
template <bool kSwap>
__device__ __forceinline__ constexpr int in_channel(int k) {
  return kSwap ? 2 - k : k;
}

// kConvertPixels output values of one plane, stored at `dst` (a row position of the plane).
template <typename T>
__device__ __forceinline__ void store_group(T* dst, const float (&v)[kConvertPixels], int valid, bool vec) {
  if (vec && valid == kConvertPixels) {
    if constexpr (std::is_same_v<T, float>) {
      float4* d = reinterpret_cast<float4*>(dst);
      d[0] = make_float4(v[0], v[1], v[2], v[3]);
      d[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      // Two values per conversion instruction (cvt.rn.f16x2.f32 / bf16x2), one 16-byte store.
      uint4 pack;
      uint32_t* words = reinterpret_cast<uint32_t*>(&pack);
#pragma unroll
      for (int j = 0; j < kConvertPixels / 2; ++j) {
        if constexpr (std::is_same_v<T, __half>) {
          const __half2 h = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
          words[j] = *reinterpret_cast<const uint32_t*>(&h);
        } else {
          const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
          words[j] = *reinterpret_cast<const uint32_t*>(&h);
        }
      }
      *reinterpret_cast<uint4*>(dst) = pack;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kConvertPixels; ++j)
      if (j < valid) dst[j] = from_float<T>(v[j]);
  }
}

// Without a resize. A block takes a segment of kSegment output pixels of one row; for a packed
// frame the segment's input bytes are first staged in shared memory with coalesced 16-byte loads
// (the whole warp reads consecutive 16-byte words: a thread's own 24 or 32 bytes, read directly,
// would make each load instruction span 3-4x the cache lines it uses), then each thread converts
// its 8 pixels from there and writes each output plane with one 16-byte store. Other layouts and
// the border go pixel by pixel.
constexpr int kSegment = kConvertThreads * kConvertPixels;
constexpr int kStageBytes = kSegment * 4 + 32;  // 4 channels, plus the alignment slack

template <typename T, bool kSwap>
__global__ void __launch_bounds__(kConvertThreads) convert_kernel(const PreprocessParams p) {
  __shared__ alignas(16) uint8_t stage[kStageBytes];
  const int out_w = static_cast<int>(p.out_w);
  const int segs = (out_w + kSegment - 1) / kSegment;
  const int64_t tiles = p.n * p.out_h * segs;
  const int64_t plane = p.out_h * p.out_w;
  const bool vec_store = out_w % kConvertPixels == 0;
  const int c = static_cast<int>(p.c);
  T* out = static_cast<T*>(p.out);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row = tile / segs;
    const int seg = static_cast<int>(tile - row * segs);
    const int64_t img = row / p.out_h;
    const int oy = static_cast<int>(row - img * p.out_h);
    const int sy = oy - static_cast<int>(p.top);
    const bool row_in = sy >= 0 && sy < p.rh;
    const uint8_t* src = p.in + img * p.s_n + static_cast<int64_t>(row_in ? sy : 0) * p.s_h;
    const int x_begin = seg * kSegment;
    // The region's columns inside this segment: [lo, hi) of the frame row.
    const int lo = max(x_begin - static_cast<int>(p.left), 0);
    const int hi = min(x_begin + kSegment - static_cast<int>(p.left), static_cast<int>(p.rw));
    const bool staged = row_in && preprocess_packed(p) && lo < hi;
    int delta = 0;  // where frame byte lo * c sits in `stage`
    if (staged) {
      const uintptr_t first = reinterpret_cast<uintptr_t>(src + static_cast<int64_t>(lo) * c);
      const uintptr_t last = reinterpret_cast<uintptr_t>(src + static_cast<int64_t>(hi) * c);  // exclusive
      const uintptr_t base = first & ~uintptr_t{15};
      delta = static_cast<int>(first - base);
      const int words = static_cast<int>((last - base + 15) / 16);
      // Whole aligned 16-byte words around the bytes needed: they lie in the same allocation.
      const uint4* from = reinterpret_cast<const uint4*>(base);
      for (int i = threadIdx.x; i < words; i += kConvertThreads) reinterpret_cast<uint4*>(stage)[i] = __ldg(from + i);
    }
    __syncthreads();
    const int x0 = x_begin + threadIdx.x * kConvertPixels;
    if (x0 < out_w) {
      float v[3][kConvertPixels];
      const int sx0 = x0 - static_cast<int>(p.left);
      if (staged && sx0 >= lo && sx0 + kConvertPixels <= hi) {
        const int off = delta + (sx0 - lo) * c;
        if ((off & 3) == 0) {
          uint32_t w[8];
          const uint32_t* from = reinterpret_cast<const uint32_t*>(stage + off);
#pragma unroll
          for (int i = 0; i < 8; ++i)
            if (i < 2 * c) w[i] = from[i];  // 24 or 32 bytes
          if (c == 3) {
#pragma unroll
            for (int j = 0; j < kConvertPixels; ++j)
#pragma unroll
              for (int k = 0; k < 3; ++k) {
                const int b = 3 * j + in_channel<kSwap>(k);
                v[k][j] = normalize(p, k, byte_to_float((w[b >> 2] >> (8 * (b & 3))) & 0xffu));
              }
          } else {
#pragma unroll
            for (int j = 0; j < kConvertPixels; ++j)
#pragma unroll
              for (int k = 0; k < 3; ++k) {
                const int b = 4 * j + in_channel<kSwap>(k);
                v[k][j] = normalize(p, k, byte_to_float((w[b >> 2] >> (8 * (b & 3))) & 0xffu));
              }
          }
        } else {
#pragma unroll
          for (int j = 0; j < kConvertPixels; ++j)
#pragma unroll
            for (int k = 0; k < 3; ++k)
              v[k][j] = normalize(p, k, byte_to_float(stage[off + j * c + in_channel<kSwap>(k)]));
        }
      } else {
        // The border, a segment's edge, any strides.
#pragma unroll
        for (int j = 0; j < kConvertPixels; ++j) {
          const int sx = sx0 + j;
          const bool inside = row_in && sx >= 0 && sx < p.rw && x0 + j < out_w;
#pragma unroll
          for (int k = 0; k < 3; ++k)
            v[k][j] = inside ? normalize(p, k, byte_to_float(__ldg(src + static_cast<int64_t>(sx) * p.s_w +
                                                                     in_channel<kSwap>(k) * p.s_c)))
                             : p.pad[k];
        }
      }
      const int valid = min(out_w - x0, kConvertPixels);
      T* dst = out + img * 3 * plane + static_cast<int64_t>(oy) * out_w + x0;
#pragma unroll
      for (int k = 0; k < 3; ++k) store_group(dst + k * plane, v[k], valid, vec_store);
    }
    __syncthreads();  // the stage is rewritten by the next tile
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
    const int64_t tiles = p.n * p.out_h * ((p.out_w + kSegment - 1) / kSegment);
    const unsigned grid = cuda::grid_for_tiles(tiles, kConvertThreads, p.num_sms);
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
