// attention CPU: the tiled forward (attention_cpu.cpp describes it).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_params.h"
#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/attention_cpu_common.h"
#include "common/cpu/gemm.h"
#include "common/cpu_isa.h"

namespace opforge {
namespace attention_cpu {
namespace {

// A kv head's K^T and V tiles packed for the GEMM's micro-kernel, each the first time a thread
// needs it (then reused by every query tile of the head: repacking them per tile pair, with K^T
// gathered by columns, was 17% of the forward's time).
template <typename A>
struct PackedHead {
  std::vector<A> keys, values;
  std::vector<bool> have_keys, have_values;
  int64_t head = -1, key_tile = 0, value_tile = 0;
  void reset(int64_t id, int64_t tiles, int64_t key_elems, int64_t value_elems) {
    if (id == head) return;
    head = id;
    key_tile = key_elems, value_tile = value_elems;
    keys.resize(tiles * key_elems);
    values.resize(tiles * value_elems);
    have_keys.assign(tiles, false);
    have_values.assign(tiles, false);
  }
};

template <typename T>
void forward_kernel(const AttentionParams& p) {
  using A = acc_type<T>;
  const AttentionPattern& pat = p.pattern;
  const int64_t D = p.head_dim, group = p.heads / p.kv_heads;
  const int64_t tq = tile_queries(pat), tk = tile_keys(pat);
  const TileTasks work(pat, p.batch, p.heads, tq, false);
  const int64_t tasks = work.count;
  // A small call is not worth a thread (a parallel region can cost a scheduler tick).
  const double flops = 4.0 * p.heads * work.pairs * D;
  const int64_t grain = flops < double(int64_t{1} << 22) ? std::max<int64_t>(tasks, 1) : 1;
  const CpuIsa isa = cpu_isa();
  const A scale = static_cast<A>(p.scale);
  // Inputs are packed by their type's packer, P (in the accumulation type) by the float one.
  const GemmPackedFns in = gemm_packed(p.dtype, isa);
  const GemmPackedFns acc = gemm_packed(std::is_same_v<A, double> ? DType::kFloat64 : DType::kFloat32, isa);
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> s(tq * tk), o(tq * D), m(tq), l(tq);
    std::vector<A> q_packed(in.a_size(tq, D)), p_packed(acc.a_size(tq, tk));
    PackedHead<A> kv;
    for (int64_t task = begin; task < end; ++task) {
      int64_t b, h, qt;
      work.locate(task, b, h, qt);
      const AttentionPattern seq = pat.at(b);  // this sequence's lengths
      const int64_t Sq = seq.sq, Sk = seq.sk, k_tiles = (Sk + tk - 1) / tk;
      const int64_t hk = h / group, i0 = qt * tq, rows = std::min(tq, Sq - i0);
      const T* k = at_<T>(p.k, p.k_at(b, hk));
      const T* v = at_<T>(p.v, p.v_at(b, hk));
      kv.reset(b * p.kv_heads + hk, k_tiles, in.b_size(D, tk), in.b_size(tk, D));
      in.pack_a(at_<T>(p.q, p.q_at(b, h) + i0 * p.q_ss), p.q_ss, p.q_ds, rows, D, q_packed.data());
      // The scale on the packed Q (in the accumulation type) once, instead of on every tile's scores.
      for (A& x : q_packed) x *= scale;
      std::fill(o.begin(), o.end(), A(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<A>::infinity());
      std::fill(l.begin(), l.end(), A(0));
      const SegmentRange q_range = segment_range(pat.q_segments, pat.q_seg_bs, b, i0, i0 + rows);
      for (int64_t kt = 0; kt < k_tiles; ++kt) {
        const int64_t j0 = kt * tk, cols = std::min(tk, Sk - j0);
        const SegmentRange kv_range = pat.kv_segments
                                          ? segment_range(pat.kv_segments, pat.kv_seg_bs, b, j0, j0 + cols)
                                          : SegmentRange{};
        const BlockKind kind = tile_kind(seq, b, h, i0, i0 + rows, j0, j0 + cols, q_range, kv_range);
        if (kind == BlockKind::kEmpty) continue;
        A* keys = kv.keys.data() + kt * kv.key_tile;
        if (!kv.have_keys[kt]) {  // K^T tile: (D, cols) with rows along d
          in.pack_b(k + j0 * p.k_ss, p.k_ds, p.k_ss, D, cols, keys);
          kv.have_keys[kt] = true;
        }
        in.multiply(rows, cols, D, q_packed.data(), keys, s.data(), tk, false);
        finish_scores<A>(p, seq, kind, b, h, i0, rows, j0, cols, tk, s.data(), s.data(), true);
        for (int64_t r = 0; r < rows; ++r) {
          A* row = s.data() + r * tk;
          const A mx = row_max(row, cols, m[r]);            // (NaN if a visible score is)
          if (mx == -std::numeric_limits<A>::infinity()) {  // nothing visible in this row yet
            for (int64_t c = 0; c < tk; ++c) row[c] = 0;
            continue;
          }
          const A alpha = std::exp(m[r] - mx);  // 0 for the first visible tile (m = -inf)
          const A sum = exp_sum(row, cols, mx);
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
          A* orow = o.data() + r * D;
          for (int64_t d = 0; d < D; ++d) orow[d] *= alpha;
          if constexpr (!std::is_same_v<T, A>) {  // P rounded to the inputs' type for P V
            for (int64_t c = 0; c < cols; ++c) row[c] = static_cast<A>(static_cast<T>(row[c]));
          }
        }
        acc.pack_a(s.data(), tk, 1, rows, cols, p_packed.data());
        A* values = kv.values.data() + kt * kv.value_tile;
        if (!kv.have_values[kt]) {
          in.pack_b(v + j0 * p.v_ss, p.v_ss, p.v_ds, cols, D, values);
          kv.have_values[kt] = true;
        }
        acc.multiply(rows, D, cols, p_packed.data(), values, o.data(), D, true);  // o = o * alpha + P V
      }
      T* out = static_cast<T*>(p.out) + p.o_at(b, h) + i0 * p.o_ss;
      A* lse = static_cast<A*>(p.lse) + p.lse_at(b, h) + i0;
      for (int64_t r = 0; r < rows; ++r) {
        // A row with nothing visible: zeros and an LSE of -inf (or its sink); NaN scores: NaN (l is NaN).
        A inv;
        finish_row(m[r], l[r], p.sinks, h, inv, lse[r]);
        for (int64_t d = 0; d < D; ++d) out[r * p.o_ss + d] = static_cast<T>(o[r * D + d] * inv);
      }
    }
  });
}

}  // namespace
}  // namespace attention_cpu

void attention_cpu_forward(const AttentionParams& p) {
  attention_cpu::dispatch_dtype(p.dtype, [&](auto x) { attention_cpu::forward_kernel<decltype(x)>(p); });
}

}  // namespace opforge
