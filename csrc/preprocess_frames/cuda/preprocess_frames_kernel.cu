// preprocess_frames: CUDA device code (no torch). Two kernels, both one pass over memory: every
// output element written once, every input byte read from DRAM once.
//  - convert: no resize (the frame lands 1:1 in the output, possibly inside a pad border). A block
//    takes row segments of 2048 output pixels, staged in shared memory (below); a thread converts
//    8 consecutive pixels and writes each output plane with one 16-byte store.
//  - resize: bilinear (align_corners=False, PyTorch's sampling and arithmetic). A thread takes
//    one output pixel; neighbouring lanes take neighbouring pixels, so the four taps of a warp fall
//    on a few cache lines of two input rows.
// Normalization ((v * scale) - mean) / std uses round-to-nearest intrinsics, so nvcc cannot fuse
// it into an FMA: without a resize the result is bit-identical to the plain PyTorch chain.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda/cp_async.cuh"
#include "common/cuda/launch.cuh"
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

// For v a uint8 value, (v * scale - mean) / std: the division by a reciprocal with Markstein's
// correction where the plan verified it gives the IEEE quotient for every such value, else IEEE's.
__device__ __forceinline__ float normalize(const PreprocessParams& p, int k, float v) {
  const float centered = __fsub_rn(__fmul_rn(v, p.scale), p.mean[k]);
  if (!p.has_std) return centered;
  if (p.exact_reciprocal) {
    const float q = __fmul_rn(centered, p.inv_std[k]);
    return __fmaf_rn(__fmaf_rn(-q, p.std[k], centered), p.inv_std[k], q);
  }
  return __fdiv_rn(centered, p.std[k]);
}

// A uint8 value v normalized as one FMA, where the plan verified it exact (p.affine), else as above.
template <bool kAffine>
__device__ __forceinline__ float normalize_byte(const PreprocessParams& p, int k, float v) {
  if constexpr (kAffine) return __fmaf_rn(v, p.affine_a[k], p.affine_b[k]);
  return normalize(p, k, v);
}

// The same with the IEEE division always (any v: the resize's blend).
__device__ __forceinline__ float normalize_ieee(const PreprocessParams& p, int k, float v) {
  const float centered = __fsub_rn(__fmul_rn(v, p.scale), p.mean[k]);
  return p.has_std ? __fdiv_rn(centered, p.std[k]) : centered;
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

// Without a resize. A block takes a segment of kSegment output pixels of one row at a time; for a
// packed frame the segment's input bytes are staged in shared memory with coalesced 16-byte
// cp.async copies (a thread's own 24 or 32 bytes, read directly, would make each load instruction
// span 3-4x the cache lines it uses), double-buffered: the next segment's bytes are in flight while
// this one is converted and stored, each output plane with one 16-byte store per thread. Other
// layouts and the border go pixel by pixel.
constexpr int kSegment = kConvertThreads * kConvertPixels;
constexpr int kStageBytes = kSegment * 4 + 32;  // 4 channels, plus the alignment slack

struct ConvertTile {
  int64_t img = 0;
  int oy = 0;
  bool row_in = false;
  const uint8_t* src = nullptr;  // the frame row (row_in) or the frame's first row
  int x_begin = 0;
  int lo = 0, hi = 0;   // the region's columns in this segment: [lo, hi) of the frame row
  bool staged = false;  // the segment's bytes go through shared memory
  int delta = 0;        // where frame byte lo * c sits in the stage
  int words = 0;        // 16-byte words staged
  const uint8_t* base = nullptr;
};

__device__ __forceinline__ ConvertTile convert_tile(const PreprocessParams& p, int64_t tile, int segs,
                                                    bool narrow) {
  ConvertTile t;
  int seg = 0;
  if (narrow) {  // 32-bit divisions (the 64-bit ones are a long software sequence)
    const uint32_t tile32 = static_cast<uint32_t>(tile), segs32 = static_cast<uint32_t>(segs);
    const uint32_t row = tile32 / segs32, out_h = static_cast<uint32_t>(p.out_h);
    seg = static_cast<int>(tile32 - row * segs32);
    const uint32_t img = row / out_h;
    t.img = img;
    t.oy = static_cast<int>(row - img * out_h);
  } else {
    const int64_t row = tile / segs;
    seg = static_cast<int>(tile - row * segs);
    t.img = row / p.out_h;
    t.oy = static_cast<int>(row - t.img * p.out_h);
  }
  const int sy = t.oy - static_cast<int>(p.top);
  t.row_in = sy >= 0 && sy < p.rh;
  t.src = p.in + t.img * p.s_n + static_cast<int64_t>(t.row_in ? sy : 0) * p.s_h;
  t.x_begin = seg * kSegment;
  t.lo = max(t.x_begin - static_cast<int>(p.left), 0);
  t.hi = static_cast<int>(std::min<int64_t>(int64_t{t.x_begin} + kSegment - p.left, p.rw));
  t.staged = t.row_in && preprocess_packed(p) && t.lo < t.hi;
  if (t.staged) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(t.src + static_cast<int64_t>(t.lo) * p.c);
    const uintptr_t last =
        reinterpret_cast<uintptr_t>(t.src + static_cast<int64_t>(t.hi) * p.c);  // exclusive
    const uintptr_t base = first & ~uintptr_t{15};
    t.delta = static_cast<int>(first - base);
    t.words = static_cast<int>((last - base + 15) / 16);
    t.base = reinterpret_cast<const uint8_t*>(base);
  }
  return t;
}

// Whole aligned 16-byte words around the bytes needed (they lie in the same allocation), one
// commit group per tile (empty when nothing is staged).
__device__ __forceinline__ void stage_tile(const ConvertTile& t, uint8_t* stage) {
  if (t.staged)
    for (int i = threadIdx.x; i < t.words; i += kConvertThreads)
      cuda::cp_async16(stage + 16 * i, t.base + 16 * i, 16);
  cuda::cp_async_commit();
}

template <typename T, bool kSwap, bool kAffine>
__device__ __forceinline__ void convert_pixels(const PreprocessParams& p, const ConvertTile& t,
                                               const uint8_t* stage, T* out, int64_t plane, bool vec_store) {
  const int out_w = static_cast<int>(p.out_w);
  const int c = static_cast<int>(p.c);
  const int x0 = t.x_begin + threadIdx.x * kConvertPixels;
  if (x0 >= out_w) return;
  float v[3][kConvertPixels];
  const int sx0 = x0 - static_cast<int>(p.left);
  if (t.staged && sx0 >= t.lo && sx0 + kConvertPixels <= t.hi) {
    const int off = t.delta + (sx0 - t.lo) * c;
    if ((off & 3) == 0) {
      uint32_t w[8];
      const uint32_t* from = reinterpret_cast<const uint32_t*>(stage + off);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i < 2 * c) w[i] = from[i];  // 24 or 32 bytes
#pragma unroll
      for (int j = 0; j < kConvertPixels; ++j)
#pragma unroll
        for (int k = 0; k < 3; ++k) {
          const int b3 = 3 * j + in_channel<kSwap>(k), b4 = 4 * j + in_channel<kSwap>(k);
          const uint32_t byte = c == 3 ? (w[b3 >> 2] >> (8 * (b3 & 3))) : (w[b4 >> 2] >> (8 * (b4 & 3)));
          v[k][j] = normalize_byte<kAffine>(p, k, byte_to_float(byte & 0xffu));
        }
    } else {
#pragma unroll
      for (int j = 0; j < kConvertPixels; ++j)
#pragma unroll
        for (int k = 0; k < 3; ++k)
          v[k][j] = normalize_byte<kAffine>(p, k, byte_to_float(stage[off + j * c + in_channel<kSwap>(k)]));
    }
  } else {
    // The border, a segment's edge, any strides.
#pragma unroll
    for (int j = 0; j < kConvertPixels; ++j) {
      const int sx = sx0 + j;
      const bool inside = t.row_in && sx >= 0 && sx < p.rw && x0 + j < out_w;
#pragma unroll
      for (int k = 0; k < 3; ++k)
        v[k][j] = inside
                      ? normalize_byte<kAffine>(p, k,
                                                byte_to_float(__ldg(t.src + static_cast<int64_t>(sx) * p.s_w +
                                                                    in_channel<kSwap>(k) * p.s_c)))
                      : p.pad[k];
    }
  }
  const int valid = min(out_w - x0, kConvertPixels);
  T* dst = out + t.img * 3 * plane + static_cast<int64_t>(t.oy) * out_w + x0;
#pragma unroll
  for (int k = 0; k < 3; ++k) store_group(dst + k * plane, v[k], valid, vec_store);
}

template <typename T, bool kSwap, bool kAffine>
__global__ void __launch_bounds__(kConvertThreads) convert_kernel(const PreprocessParams p) {
  __shared__ alignas(16) uint8_t stage[2][kStageBytes];
  const int segs = static_cast<int>((p.out_w + kSegment - 1) / kSegment);
  const int64_t tiles = p.n * p.out_h * segs;
  const int64_t plane = p.out_h * p.out_w;
  const bool vec_store = p.out_w % kConvertPixels == 0;
  const bool narrow = tiles <= INT32_MAX - int64_t{gridDim.x};  // every tile index below fits 32 bits
  T* out = static_cast<T*>(p.out);
  int64_t tile = blockIdx.x;
  if (tile >= tiles) return;
  ConvertTile cur = convert_tile(p, tile, segs, narrow);
  stage_tile(cur, stage[0]);
  int buf = 0;
  for (; tile < tiles; tile += gridDim.x) {
    const int64_t next = tile + gridDim.x;
    ConvertTile nxt;
    if (next < tiles) {
      nxt = convert_tile(p, next, segs, narrow);
      stage_tile(nxt, stage[buf ^ 1]);
    } else {
      cuda::cp_async_commit();
    }
    cuda::cp_async_wait<1>();  // this tile's words have landed (this thread's)...
    __syncthreads();           // ...and every thread's
    convert_pixels<T, kSwap, kAffine>(p, cur, stage[buf], out, plane, vec_store);
    __syncthreads();  // the stage is refilled two tiles on
    cur = nxt;
    buf ^= 1;
  }
}

// PyTorch's bilinear source index (align_corners=False): clamped at 0 below, the upper tap
// clamped to the last pixel.
struct Tap {
  int64_t i0, i1;
  float l1;
};
__device__ __forceinline__ Tap source_tap(float src_per_dst, int64_t dst, int64_t in_size) {
  float s = __fsub_rn(__fmul_rn(src_per_dst, static_cast<float>(dst) + 0.5f), 0.5f);
  s = s < 0.0f ? 0.0f : s;
  // float32 can round s up to in_size for sides near 2^23: clamp the tap and its weight (PyTorch's
  // guard_index_and_lambda).
  const int64_t i0 = static_cast<int64_t>(s) < in_size - 1 ? static_cast<int64_t>(s) : in_size - 1;
  const float l1 = fminf(fmaxf(__fsub_rn(s, static_cast<float>(i0)), 0.0f), 1.0f);
  return {i0, i0 + (i0 < in_size - 1 ? 1 : 0), l1};
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
      const float h1 = ty.l1, h0 = __fsub_rn(1.0f, h1), w1 = tx.l1, w0 = __fsub_rn(1.0f, w1);
      const uint8_t* r0 = p.in + img * p.s_n + ty.i0 * p.s_h;
      const uint8_t* r1 = p.in + img * p.s_n + ty.i1 * p.s_h;
      const int64_t c0 = tx.i0 * p.s_w, c1 = tx.i1 * p.s_w;
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int64_t ch = in_channel<kSwap>(k) * p.s_c;
        const float p00 = __ldg(r0 + c0 + ch), p01 = __ldg(r0 + c1 + ch);
        const float p10 = __ldg(r1 + c0 + ch), p11 = __ldg(r1 + c1 + ch);
        // Each operation rounded on its own, as on the CPU: the two agree bit for bit.
        const float top = __fadd_rn(__fmul_rn(w0, p00), __fmul_rn(w1, p01));
        const float bottom = __fadd_rn(__fmul_rn(w0, p10), __fmul_rn(w1, p11));
        v[k] = normalize_ieee(p, k, __fadd_rn(__fmul_rn(h0, top), __fmul_rn(h1, bottom)));
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

template <typename T, bool kSwap, bool kAffine>
cudaError_t launch_convert(const PreprocessParams& p, int64_t tiles, cudaStream_t stream) {
  static int per_sm[64] = {};  // resident blocks per SM of this instantiation, per device
  unsigned grid = 0;
  const cudaError_t err = cuda::resident_grid(convert_kernel<T, kSwap, kAffine>, kConvertThreads, 0, tiles,
                                              p.num_sms, per_sm, grid);
  if (err != cudaSuccess) return err;
  convert_kernel<T, kSwap, kAffine><<<grid, kConvertThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, bool kSwap>
cudaError_t launch(const PreprocessParams& p, cudaStream_t stream) {
  if (p.resize) {
    const int64_t segs = (p.out_w + kResizeThreads - 1) / kResizeThreads;
    const unsigned grid = cuda::grid_for_tiles(p.n * p.out_h * segs, kResizeThreads, p.num_sms);
    resize_kernel<T, kSwap><<<grid, kResizeThreads, 0, stream>>>(p);
  } else {
    // Persistent: as many blocks as fit on the GPU at once, each striding over row segments, so
    // that the double-buffered staging overlaps one segment's loads with the previous one's
    // stores (with a block per segment every block would load, wait, convert and exit).
    const int64_t tiles = p.n * p.out_h * ((p.out_w + kSegment - 1) / kSegment);
    return p.affine ? launch_convert<T, kSwap, true>(p, tiles, stream)
                    : launch_convert<T, kSwap, false>(p, tiles, stream);
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
    case DType::kFloat32:
      return launch_for<float>(p, s);
    case DType::kFloat16:
      return launch_for<__half>(p, s);
    case DType::kBFloat16:
      return launch_for<__nv_bfloat16>(p, s);
    case DType::kFloat64:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace opforge
