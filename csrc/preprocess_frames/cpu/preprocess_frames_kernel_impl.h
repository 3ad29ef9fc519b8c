// preprocess_frames CPU rows, compiled once per CPU variant: the including file defines
// CPU_CAPABILITY (and CPU_CAPABILITY_AVX2 for that variant) and OPFORGE_CPU_VARIANT_NS first.
// Only at::vec and intrinsics here (no c10 scalar conversions): tails use at::vec's partial loads
// and stores, so nothing compiled for a wider ISA is shared with the portable variant.
//
// A row of the output is its border (the pad value), then the region in chunks: each chunk's
// normalized float values go to a small buffer in L1 (fp32 output: straight to the output), then
// are rounded to the output type and stored. Packed frames are read with 32-bit gathers (one per
// pixel and tap; the channels are bytes of the word): without a resize the byte indexes the
// per-channel table of normalized values (exact, and cheaper than the arithmetic), with one the
// four taps are blended as PyTorch's bilinear does.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include "preprocess_frames/cpu/preprocess_frames_kernel.h"

namespace opforge {
namespace OPFORGE_CPU_VARIANT_NS {
namespace {

using VF = at::vec::Vectorized<float>;
constexpr int64_t kChunk = 256;  // region pixels per buffered chunk (3 KiB of floats)

// dst[0, len) = src rounded to T.
template <typename T>
void store_span(T* dst, const float* src, int64_t len) {
  using VT = at::vec::Vectorized<T>;
  constexpr int64_t n = VT::size();  // 2 float vectors
  constexpr int64_t f = VF::size();
  int64_t i = 0;
  for (; i + n <= len; i += n)
    at::vec::convert_from_float<T>(VF::loadu(src + i), VF::loadu(src + i + f)).store(dst + i);
  for (; i < len; i += f) {
    const int64_t rest = std::min<int64_t>(f, len - i);
    at::vec::convert_from_float<T>(VF::loadu(src + i, rest), VF(0.0f)).store(dst + i, static_cast<int>(rest));
  }
}

template <typename T>
void fill_span(T* dst, float value, int64_t len) {
  if constexpr (std::is_same_v<T, float>) {
    std::fill(dst, dst + len, value);
  } else {
    using VT = at::vec::Vectorized<T>;
    const VT v = at::vec::convert_from_float<T>(VF(value), VF(value));
    int64_t i = 0;
    for (; i + VT::size() <= len; i += VT::size()) v.store(dst + i);
    if (i < len) v.store(dst + i, static_cast<int>(len - i));
  }
}

// Region columns [sx0, sx0 + len) of one frame row, no resize: table lookups.
void convert_span(const PreprocessParams& p, const PreprocessTaps& t, const uint8_t* row, int64_t sx0,
                  int64_t len, float* const* buf) {
  int64_t j = 0;
#if defined(CPU_CAPABILITY_AVX2)
  if (preprocess_packed(p)) {
    const int c = static_cast<int>(p.c);
    const __m256i offsets =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(c));
    const __m256i byte = _mm256_set1_epi32(0xff);
    // A 4-byte read of a 3-channel pixel passes into the next pixel: not for the row's last one.
    const int64_t vec_end = c == 4 ? len : std::min(len, p.w - 1 - sx0);
    for (; j + 8 <= vec_end; j += 8) {
      const __m256i d = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row + (sx0 + j) * c), offsets, 1);
      for (int k = 0; k < 3; ++k) {
        const __m256i idx = _mm256_and_si256(_mm256_srl_epi32(d, _mm_cvtsi32_si128(8 * p.ch[k])), byte);
        _mm256_storeu_ps(buf[k] + j, _mm256_i32gather_ps(t.lut + 256 * k, idx, 4));
      }
    }
  }
#endif
  for (; j < len; ++j) {
    const uint8_t* px = row + (sx0 + j) * p.s_w;
    for (int k = 0; k < 3; ++k) buf[k][j] = t.lut[256 * k + px[p.ch[k] * p.s_c]];
  }
}

// Region columns [dx0, dx0 + len) of one output row, resized: bilinear between frame rows r0
// and r1 (weights h0, h1), then normalized.
void resize_span(const PreprocessParams& p, const PreprocessTaps& t, const uint8_t* r0, const uint8_t* r1,
                 float h0, float h1, int64_t dx0, int64_t len, float* const* buf) {
  int64_t j = 0;
#if defined(CPU_CAPABILITY_AVX2)
  if (t.g0 != nullptr) {
    const __m256i byte = _mm256_set1_epi32(0xff);
    const VF vh0(h0), vh1(h1), one(1.0f), scale(p.scale);
    for (; j + 8 <= len; j += 8) {
      const int64_t dx = dx0 + j;
      const __m256i i0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.g0 + dx));
      const __m256i i1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.g1 + dx));
      const __m256i s0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.sh0 + dx));
      const __m256i s1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.sh1 + dx));
      const __m256i a00 =
          _mm256_srlv_epi32(_mm256_i32gather_epi32(reinterpret_cast<const int*>(r0), i0, 1), s0);
      const __m256i a01 =
          _mm256_srlv_epi32(_mm256_i32gather_epi32(reinterpret_cast<const int*>(r0), i1, 1), s1);
      const __m256i a10 =
          _mm256_srlv_epi32(_mm256_i32gather_epi32(reinterpret_cast<const int*>(r1), i0, 1), s0);
      const __m256i a11 =
          _mm256_srlv_epi32(_mm256_i32gather_epi32(reinterpret_cast<const int*>(r1), i1, 1), s1);
      const VF w1 = VF::loadu(t.l1 + dx);
      const VF w0 = one - w1;
      for (int k = 0; k < 3; ++k) {
        const __m128i cnt = _mm_cvtsi32_si128(8 * p.ch[k]);
        const auto tap = [&](__m256i a) {
          return VF(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(a, cnt), byte)));
        };
        const VF v = vh0 * (w0 * tap(a00) + w1 * tap(a01)) + vh1 * (w0 * tap(a10) + w1 * tap(a11));
        VF out = v * scale - VF(p.mean[k]);
        if (p.has_std) out = out / VF(p.std[k]);
        out.store(buf[k] + j);
      }
    }
  }
#endif
  for (; j < len; ++j) {
    const int64_t dx = dx0 + j;
    const float w1 = t.l1[dx], w0 = 1.0f - w1;
    for (int k = 0; k < 3; ++k) {
      const int64_t ch = p.ch[k] * p.s_c;
      const float p00 = r0[t.x0[dx] + ch], p01 = r0[t.x1[dx] + ch];
      const float p10 = r1[t.x0[dx] + ch], p11 = r1[t.x1[dx] + ch];
      const float v = h0 * (w0 * p00 + w1 * p01) + h1 * (w0 * p10 + w1 * p11);
      const float centered = v * p.scale - p.mean[k];
      buf[k][j] = p.has_std ? centered / p.std[k] : centered;
    }
  }
}

template <typename T>
void rows(const PreprocessParams& p, const PreprocessTaps& t, int64_t begin, int64_t end) {
  constexpr bool kFloatOut = std::is_same_v<T, float>;
  alignas(64) float local[3][kChunk];
  const int64_t plane = p.out_h * p.out_w;
  T* out = static_cast<T*>(p.out);
  for (int64_t row = begin; row < end; ++row) {
    const int64_t img = row / p.out_h;
    const int64_t oy = row - img * p.out_h;
    T* dst[3];
    for (int k = 0; k < 3; ++k) dst[k] = out + (img * 3 + k) * plane + oy * p.out_w;
    const int64_t dy = oy - p.top;
    if (dy < 0 || dy >= p.rh) {
      for (int k = 0; k < 3; ++k) fill_span(dst[k], p.pad[k], p.out_w);
      continue;
    }
    for (int k = 0; k < 3; ++k) {
      fill_span(dst[k], p.pad[k], p.left);
      fill_span(dst[k] + p.left + p.rw, p.pad[k], p.out_w - p.left - p.rw);
    }
    const uint8_t* frame = p.in + img * p.s_n;
    // PyTorch's bilinear source row (align_corners=False), as the CUDA kernel computes it.
    float sy = p.src_per_dst_y * (static_cast<float>(dy) + 0.5f) - 0.5f;
    sy = sy < 0.0f ? 0.0f : sy;
    const int64_t y0 = std::min<int64_t>(static_cast<int64_t>(sy), p.h - 1);  // (sy rounds up to h near 2^23)
    const int64_t y1 = y0 + (y0 < p.h - 1 ? 1 : 0);
    const float h1 = std::min(std::max(sy - static_cast<float>(y0), 0.0f), 1.0f), h0 = 1.0f - h1;
    for (int64_t s = 0; s < p.rw; s += kChunk) {
      const int64_t len = std::min(kChunk, p.rw - s);
      float* buf[3];
      for (int k = 0; k < 3; ++k) {
        if constexpr (kFloatOut) {
          buf[k] = dst[k] + p.left + s;
        } else {
          buf[k] = local[k];
        }
      }
      if (p.resize) {
        resize_span(p, t, frame + y0 * p.s_h, frame + y1 * p.s_h, h0, h1, s, len, buf);
      } else {
        convert_span(p, t, frame + dy * p.s_h, s, len, buf);
      }
      if constexpr (!kFloatOut) {
        for (int k = 0; k < 3; ++k) store_span(dst[k] + p.left + s, local[k], len);
      }
    }
  }
}

}  // namespace

PreprocessRowsFn preprocess_rows(DType out_dtype) {
  switch (out_dtype) {
    case DType::kFloat32:
      return &rows<float>;
    case DType::kFloat16:
      return &rows<c10::Half>;
    case DType::kBFloat16:
      return &rows<c10::BFloat16>;
    case DType::kFloat64:
    case DType::kFloat8E4M3:
      break;
  }
  return nullptr;
}

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
