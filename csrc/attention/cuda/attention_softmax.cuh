// attention CUDA: the online softmax, one definition each, for every kernel on tensor cores (a
// warp's 16 rows of an accumulator block: elements 0, 1 of a fragment in row g, 2, 3 in row g + 8,
// a row's columns spread over a quad of lanes). Scores in the log2 domain (scale log2(e), a softcap
// through tanh), each row's running max and sum, exp2 (ex2.approx) with the max subtracted, the
// output's rescale, the rows' totals and LSE; the backward's P from the forward's lse2 and its dS.

#pragma once

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/attention_cuda.h"
#include "common/cuda/math.cuh"
#include "common/cuda/math_constants.h"

namespace opforge {
namespace attention_cuda {

using cuda::kNegInf;

// A raw score under a softcap c, in the log2 domain: c log2(e) tanh(s scale / c) (tanh.approx, as
// every CUDA kernel computes it: a backward recomputes the forward's P).
__device__ __forceinline__ float capped_score_log2(float s, const AttentionCudaArgs& a) {
  return a.cap_log2 * cuda::fast_tanh(s * a.cap_inv_scale);
}

// Scores in the log2 domain: s * scale * log2(e), or with a softcap capped_score_log2.
template <int kN>
__device__ __forceinline__ void scores_log2(float (&s)[kN][4], const AttentionCudaArgs& a) {
  if (a.cap_log2 != 0.f) {
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = capped_score_log2(s[n][e], a);
  } else {
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= a.scale_log2;
  }
}

// A row's value combined over the quad of lanes that hold its columns (every lane gets it).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// One key tile of the online softmax for a warp's 16 rows (elements 0, 1: row g; 2, 3: row g + 8):
// the running max and sum updated from the tile's scores, the scores turned into P in place, and
// each row's factor corr by which the output accumulated so far must be rescaled (a row that has
// seen nothing yet keeps max -inf and P 0). The scores are x with log2-domain values x k (k > 0):
// either already in the log2 domain (k = 1, scores_log2) or raw with k = scale log2(e), the scale
// then applied in the exponent's FFMA (exp2(x k - max k), FlashAttention's form: one FMUL an
// element less); m_run stays in x's units. softmax_step leaves the output alone (a kernel whose P V
// product of the previous tile is still running rescales it afterwards, rescale_rows);
// online_softmax does both. kPOffset: P and the sums scaled by 2^kPOffset (the FP8 forward's P in
// [0, 2^kPOffset]: exp2's argument offset in the same FFMA; corr unchanged; the caller divides the
// sums by 2^kPOffset at the end).
template <int kPOffset = 0, int kN>
__device__ __forceinline__ void softmax_step(float (&s)[kN][4], float (&m_run)[2], float (&l_run)[2],
                                             float (&corr)[2], float k = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float v[kN];  // the row's max as a tree (log2 kN deep, not a chain of kN: it gates the exponentials)
#pragma unroll
    for (int n = 0; n < kN; ++n) v[n] = fmaxf(s[n][2 * r], s[n][2 * r + 1]);
#pragma unroll
    for (int w = 1; w < kN; w *= 2)
#pragma unroll
      for (int n = 0; n + w < kN; n += 2 * w) v[n] = fmaxf(v[n], v[n + w]);
    const float mx = quad_max(fmaxf(m_run[r], v[0]));
    const float use = mx == kNegInf ? 0.f : mx * k;
    corr[r] = cuda::fast_exp2(fmaf(m_run[r], k, -use));
    m_run[r] = mx;
    const float neg = kPOffset != 0 ? static_cast<float>(kPOffset) - use : -use;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      s[n][2 * r] = cuda::fast_exp2(fmaf(s[n][2 * r], k, neg));
      s[n][2 * r + 1] = cuda::fast_exp2(fmaf(s[n][2 * r + 1], k, neg));
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    l_run[r] = l_run[r] * corr[r] + sum;
  }
}

template <int kDT>
__device__ __forceinline__ void rescale_rows(float (&o)[kDT][4], const float (&corr)[2]) {
#pragma unroll
  for (int n = 0; n < kDT; ++n) {
    o[n][0] *= corr[0], o[n][1] *= corr[0];
    o[n][2] *= corr[1], o[n][3] *= corr[1];
  }
}

template <int kN, int kDT>
__device__ __forceinline__ void online_softmax(float (&s)[kN][4], float (&o)[kDT][4], float (&m_run)[2],
                                               float (&l_run)[2]) {
  float corr[2];
  softmax_step(s, m_run, l_run, corr);
  rescale_rows(o, corr);
}

// dS of one element from P, dP and its row's delta: P (dP - delta), times the softmax scale where
// kScaled (the mma.sync passes; the Hopper backward leaves the scale to dK's epilogue and the dQ
// conversion: one multiply a key row or a dQ element instead of one a score), times 1 - tanh^2
// under a softcap (cap; tanh recovered from P: x = log2(P) + lse2, tanh = x / (c log2(e))).
template <bool kScaled>
__device__ __forceinline__ float score_grad(float prob, float dp, float delta, float lse2,
                                            const AttentionCudaArgs& a, bool cap) {
  float ds = prob * (dp - delta);
  if (kScaled) ds *= a.scale;
  if (cap) {
    const float th = (cuda::fast_log2(prob) + lse2) * a.inv_cap_log2;
    ds = prob > 0.f ? ds * (1.f - th * th) : 0.f;
  }
  return ds;
}

// The backward's P and dS of a warp's 16 x kN block from scores in the log2 domain: by columns
// (the dK/dV passes: columns are queries, their lse2 and delta from shared memory; P stays in s)
// or by rows (the dQ passes: the thread's two rows' lse2 and delta; only dS is kept, in dp).
// By columns in two steps, so that P can be computed while dP is: probs_by_column turns the
// scores into P, score_grads_from_probs dP into dS.
template <int kN>
__device__ __forceinline__ void probs_by_column(float (&s)[kN][4], const float* lse2, int t4) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = cuda::fast_exp2(s[n][e] - lse2[n * 8 + 2 * t4 + (e & 1)]);
  }
}

template <int kN>
__device__ __forceinline__ void score_grads_from_probs(const float (&prob)[kN][4], float (&dp)[kN][4],
                                                       const float* lse2, const float* delta,
                                                       const AttentionCudaArgs& a, int t4) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = n * 8 + 2 * t4 + (e & 1);
      dp[n][e] = score_grad<true>(prob[n][e], dp[n][e], delta[c], lse2[c], a, a.cap_log2 != 0.f);
    }
  }
}

template <int kN>
__device__ __forceinline__ void score_grads_by_column(float (&s)[kN][4], float (&dp)[kN][4],
                                                      const float* lse2, const float* delta,
                                                      const AttentionCudaArgs& a, int t4) {
  probs_by_column(s, lse2, t4);
  score_grads_from_probs(s, dp, lse2, delta, a, t4);
}

template <int kN>
__device__ __forceinline__ void score_grads_by_row(const float (&s)[kN][4], float (&dp)[kN][4],
                                                   const float (&lse2)[2], const float (&delta)[2],
                                                   const AttentionCudaArgs& a) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const float prob = cuda::fast_exp2(s[n][e] - lse2[r]);
      dp[n][e] = score_grad<true>(prob, dp[n][e], delta[r], lse2[r], a, a.cap_log2 != 0.f);
    }
  }
}

// The Hopper backward's P and dS (both consumer layouts; the softcap's forms, kCap, are separate
// code: a runtime test inside the element loops is if-converted, and the plain path would pay the
// softcap's log2 and selects on every element). From raw scores: log2(P), the score in the log2
// domain minus its query's lse2, by one FFMA (a masked element is then set to -inf and gives
// P = 0); P by exp2 (probs_from_log2); dS without the softmax scale (score_grad).
template <bool kCap>
__device__ __forceinline__ float log2_prob(float s, float lse2, const AttentionCudaArgs& a) {
  return kCap ? capped_score_log2(s, a) - lse2 : fmaf(s, a.scale_log2, -lse2);
}
template <int kN>
__device__ __forceinline__ void probs_from_log2(float (&s)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = cuda::fast_exp2(s[n][e]);
  }
}
// By columns (the keys layout: a warp's keys x queries block, each column's lse2 and delta from the
// stage, read as pairs).
template <bool kCap, int kN>
__device__ __forceinline__ void log2_probs_by_column(float (&s)[kN][4], const float* lse2,
                                                     const AttentionCudaArgs& a, int t4) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const float2 l = *reinterpret_cast<const float2*>(lse2 + n * 8 + 2 * t4);
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = log2_prob<kCap>(s[n][e], e & 1 ? l.y : l.x, a);
  }
}
template <bool kCap, int kN>
__device__ __forceinline__ void unscaled_score_grads_by_column(const float (&prob)[kN][4], float (&dp)[kN][4],
                                                               const float* lse2, const float* delta,
                                                               const AttentionCudaArgs& a, int t4) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const float2 d = *reinterpret_cast<const float2*>(delta + n * 8 + 2 * t4);
    float2 l = make_float2(0.f, 0.f);
    if (kCap) l = *reinterpret_cast<const float2*>(lse2 + n * 8 + 2 * t4);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dp[n][e] = score_grad<false>(prob[n][e], dp[n][e], e & 1 ? d.y : d.x, e & 1 ? l.y : l.x, a, kCap);
    }
  }
}
// By rows (the head-dim layout: queries as rows; the thread's two rows' lse2 and delta).
template <bool kCap, int kN>
__device__ __forceinline__ void log2_probs_by_row(float (&s)[kN][4], float2 lse2,
                                                  const AttentionCudaArgs& a) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = log2_prob<kCap>(s[n][e], e < 2 ? lse2.x : lse2.y, a);
  }
}
template <bool kCap, int kN>
__device__ __forceinline__ void unscaled_score_grads_by_row(const float (&prob)[kN][4], float (&dp)[kN][4],
                                                            float2 lse2, float2 delta,
                                                            const AttentionCudaArgs& a) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dp[n][e] = score_grad<false>(prob[n][e], dp[n][e], e < 2 ? delta.x : delta.y, e < 2 ? lse2.x : lse2.y,
                                   a, kCap);
    }
  }
}

// A row's total with its head's attention sink (AttentionParams::sinks), in the log2 domain: from
// the row's max m2 (log2 units: m_run k) and sum l of exp2(x - m2), the factor its output is
// multiplied by and its LSE in log2 units. Over m' = max(m2, sink log2(e)), the sum gains
// exp2(sink log2(e) - m'): inv = exp2(m2 - m') / (l exp2(m2 - m') + exp2(sink log2(e) - m')). A row
// that saw nothing (l = 0) keeps zeros and gets the sink as its LSE; a sink of +inf gives zeros and
// +inf; NaN stays NaN.
__device__ __forceinline__ void sink_total(float m2, float l, float sink, float& inv, float& lse2) {
  const float s2 = sink * cuda::kLog2eFloat;
  if (s2 == -kNegInf && l == l) {  // (a sink of +inf takes all the weight: zeros, an LSE of +inf)
    inv = 0.f, lse2 = -kNegInf;
    return;
  }
  const bool none = l == 0.f;  // (a NaN sum is not none: it stays NaN)
  const float top = none ? s2 : fmaxf(m2, s2);
  if (top == kNegInf) {
    inv = 0.f, lse2 = kNegInf;
    return;
  }
  const float c = none ? 0.f : cuda::fast_exp2(m2 - top);
  const float total = fmaf(l, c, cuda::fast_exp2(s2 - top));  // (>= 1 unless NaN: no slow division path)
  inv = __fdividef(c, total);
  lse2 = top + cuda::fast_log2(total);
}

// The forward's row totals: each row's 1 / sum (0 for a row that saw nothing) into inv, and its
// LSE (natural log; -inf for such a row) written by the quad's first lane; with sinks, sink_total's.
// row0: the warp's first query row; sq: batch row b's query count; k: softmax_step's.
__device__ __forceinline__ void finish_rows(const float (&m_run)[2], const float (&l_run)[2], float (&inv)[2],
                                            const AttentionParams& p, int64_t sq, int64_t b, int64_t h,
                                            int64_t row0, int lane, float k = 1.f) {
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(l_run[r]);
    float lse2;
    if (p.sinks) {
      sink_total(m_run[r] * k, l, static_cast<const float*>(p.sinks)[h], inv[r], lse2);
    } else {
      inv[r] = l > 0.f ? 1.f / l : 0.f;
      lse2 = l > 0.f ? fmaf(m_run[r], k, log2f(l)) : kNegInf;
    }
    const int64_t i = row0 + g + 8 * r;
    if (t4 == 0 && i < sq) static_cast<float*>(p.lse)[p.lse_at(b, h) + i] = lse2 * cuda::kLn2Float;
  }
}

}  // namespace attention_cuda
}  // namespace opforge
