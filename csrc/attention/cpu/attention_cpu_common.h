// attention CPU: what the forward, decode and backward kernels share (attention_cpu.cpp describes
// them): tile sizes, the tile tasks, segment ranges, the scores' finishing and the softmax's row
// loops. Inline, so that each kernel's translation unit inlines them as before the split.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention/attention_params.h"
#include "attention/cpu/attention_kernel.h"
#include "common/cpu_isa.h"

namespace opforge {
namespace attention_cpu {

// Tiles of 96 queries (16 of the GEMM's 6-row micro-panels, no edge panel) by 128 keys; with a
// block mask a tile lies inside one mask block: 128 (or 64 where the blocks are not a multiple of
// 128) on each side. 64-row products ran at half the rate of 128-row ones (53 vs 117 GFLOP/s).
inline int64_t tile_queries(const AttentionPattern& p) {
  return p.mask_kinds ? (p.block_q % 128 ? 64 : 128) : 96;
}
inline int64_t tile_keys(const AttentionPattern& p) {
  return p.mask_kinds && p.block_k % 128 ? 64 : 128;
}

template <typename T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;

// A row's softmax finished, with its head's attention sink where the call has sinks
// (AttentionParams::sinks, in the accumulation type): from the row's max m and sum l of exp(s - m),
// the factor `inv` its accumulated output is multiplied by and its LSE. With a sink s the sum gains
// exp(s - m): over m' = max(m, s), inv = exp(m - m') / (l exp(m - m') + exp(s - m')) and the LSE is
// m' + log(that). A row that sees nothing (l = 0) gets zeros and an LSE of -inf, or the sink; a sink
// of +inf gives zeros and +inf; NaN stays NaN.
template <typename A>
inline void finish_row(A m, A l, const void* sinks, int64_t h, A& inv, A& lse) {
  constexpr A kInf = std::numeric_limits<A>::infinity();
  if (!sinks) {
    inv = l == 0 ? A(0) : A(1) / l;
    lse = l == 0 ? -kInf : m + std::log(l);
    return;
  }
  const A s = static_cast<const A*>(sinks)[h];
  if (s == kInf && l == l) {  // (a sink of +inf takes all the weight: zeros, an LSE of +inf)
    inv = 0, lse = kInf;
    return;
  }
  const A top = l == 0 ? s : std::max(m, s);
  if (top == -kInf) {
    inv = 0, lse = -kInf;
    return;
  }
  const A c = l == 0 ? A(0) : std::exp(m - top);
  const A total = l * c + std::exp(s - top);
  inv = c / total;
  lse = top + std::log(total);
}

// Calls f with a value of the element type `dtype` names (float, double, c10::Half, c10::BFloat16):
// the kernels' entries (attention_cpu.h) dispatch on their params' dtype.
template <typename F>
void dispatch_dtype(DType dtype, const F& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat64:
      return f(double{});
    case DType::kFloat16:
      return f(c10::Half{});
    case DType::kBFloat16:
      return f(c10::BFloat16{});
    case DType::kFloat8E4M3:  // (no CPU kernel: FP8 inputs are dequantized before the kernels)
      break;
  }
}

template <typename T>
const T* at_(const void* base, int64_t offset) {
  return static_cast<const T*>(base) + offset;
}

// The tasks of a loop over (sequence, head, tile of `tile` query or key rows), sequence-major,
// then head, then tile (a thread's range keeps a head's tiles together: the forward packs a head's
// K and V once for them). Batch rows share one tile count; packed sequences (varlen) each have
// their own, so `first` holds where each sequence's tasks begin.
struct TileTasks {
  int64_t heads = 0, tiles = 0;  // tiles: per sequence, without varlen
  std::vector<int64_t> first;    // varlen: (batch + 1) task offsets
  int64_t count = 0;
  double pairs = 0;  // the (query, key) pairs of every sequence, per head: sizes the grain

  TileTasks(const AttentionPattern& pat, int64_t batch, int64_t heads_, int64_t tile, bool keys)
      : heads(heads_) {
    auto tiles_of = [&](const AttentionPattern& s) { return ((keys ? s.sk : s.sq) + tile - 1) / tile; };
    if (!pat.varlen()) {
      tiles = tiles_of(pat);
      count = batch * heads * tiles;
      pairs = static_cast<double>(batch) * pat.sq * pat.sk;
      return;
    }
    first.resize(batch + 1);
    for (int64_t b = 0; b < batch; ++b) {
      const AttentionPattern s = pat.at(b);
      first[b] = count;
      count += heads * tiles_of(s);
      pairs += static_cast<double>(s.sq) * s.sk;
    }
    first[batch] = count;
  }
  // The sequence, head and tile of task t.
  void locate(int64_t t, int64_t& b, int64_t& h, int64_t& tile) const {
    if (first.empty()) {
      tile = t % tiles;
      h = (t / tiles) % heads;
      b = t / tiles / heads;
      return;
    }
    // The last sequence whose tasks start at or before t (sequences with no tiles start where the
    // next one does, so this one has tasks).
    b = std::upper_bound(first.begin(), first.end(), t) - first.begin() - 1;
    const int64_t local = t - first[b], n = (first[b + 1] - first[b]) / heads;
    h = local / n;
    tile = local % n;
  }
};

// The segment ids of rows [i0, i1) of one batch row, summarized.
inline SegmentRange segment_range(const int64_t* ids, int64_t stride_b, int64_t b, int64_t i0, int64_t i1) {
  SegmentRange r{};
  if (!ids) return r;
  const int64_t* row = ids + b * stride_b;
  r.lo = *std::min_element(row + i0, row + i1);
  r.hi = *std::max_element(row + i0, row + i1);
  return r;
}

// Scores of one tile of batch row (or sequence) b, whose pattern is `pat` (p.pattern.at(b)):
// s = softcap(scale * q.k), masked elements -inf (scaled: q came scaled, s is scale * q.k already).
// `t` keeps tanh(...) for the softcap's backward (when softcap is on).
template <typename A>
void finish_scores(const AttentionParams& p, const AttentionPattern& pat, BlockKind kind, int64_t b,
                   int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t ld, A* s, A* t,
                   bool scaled = false) {
  const A scale = static_cast<A>(p.scale), cap = static_cast<A>(p.softcap);
  const A neg_inf = -std::numeric_limits<A>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    A* row = s + r * ld;
    if (!scaled) {
      for (int64_t c = 0; c < cols; ++c) row[c] *= scale;
    }
    if (cap > 0) {
      A* trow = t + r * ld;
      for (int64_t c = 0; c < cols; ++c) {
        trow[c] = std::tanh(row[c] / cap);
        row[c] = cap * trow[c];
      }
    }
    if (kind == BlockKind::kPartial) {
      if (!pat.q_segments && !pat.mask_kinds) {
        // Only the band and the prefix: each row's visible keys are an interval (and the prefix).
        const int64_t pos = pat.pos(i0 + r), right = pat.band_right();
        const int64_t lo = pat.window_left >= 0 ? pos - pat.window_left : std::numeric_limits<int64_t>::min();
        const int64_t hi = right >= 0 ? pos + right : std::numeric_limits<int64_t>::max();
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t j = j0 + c;
          row[c] = (j < pat.prefix_len || (j >= lo && j <= hi)) ? row[c] : neg_inf;
        }
      } else {
        for (int64_t c = 0; c < cols; ++c)
          if (!pat.visible(b, h, i0 + r, j0 + c)) row[c] = neg_inf;
      }
    }
  }
}

// The softmax's row loops: vectorized (Sleef's exp on AVX2) for float, plain for double.
inline float row_max(const float* x, int64_t n, float init) {
  return softmax_row_fns(cpu_isa()).max(x, n, init);
}
inline float exp_sum(float* x, int64_t n, float m) {
  return softmax_row_fns(cpu_isa()).exp_sum(x, n, m);
}
inline void exp_rows(float* x, int64_t n, float m) {
  softmax_row_fns(cpu_isa()).exp(x, n, m);
}
inline double row_max(const double* x, int64_t n, double init) {
  for (int64_t i = 0; i < n; ++i) init = std::isnan(init) || x[i] <= init ? init : x[i];  // (NaN sticks)
  return init;
}
inline double exp_sum(double* x, int64_t n, double m) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - m));
  return sum;
}
inline void exp_rows(double* x, int64_t n, double m) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - m);
}

// max(a, b) that keeps a NaN of either (std::max drops a NaN b).
template <typename A>
A max_keeping_nan(A a, A b) {
  return std::isnan(a) ? a : (std::isnan(b) || b > a) ? b : a;
}

}  // namespace attention_cpu
}  // namespace opforge
