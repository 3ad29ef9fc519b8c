// attention CPU: the tiled backward (attention_cpu.cpp describes it): P from the forward's LSE,
// dS, then dK and dV by key tiles and dQ by query tiles.
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention/attention_params.h"
#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/attention_cpu_common.h"
#include "common/cpu/gemm.h"
#include "common/cpu_isa.h"

namespace opforge {
namespace attention_cpu {
namespace {

// One thread's GEMM: c (m, n) = a (m, k) @ b (k, n), a and b in the inputs' type with any strides,
// c in the accumulation type, rows of c_rs elements.
struct Gemm {
  GemmBlockFn fn;
  DType dtype;
  c10::DataPtr work;

  Gemm(DType t, CpuIsa isa)
      : fn(gemm_block(t, isa)), dtype(t), work(c10::GetCPUAllocator()->allocate(gemm_work_bytes(t, isa))) {}

  void operator()(int64_t m, int64_t n, int64_t k, const void* a, int64_t a_rs, int64_t a_cs, const void* b,
                  int64_t b_rs, int64_t b_cs, void* c, int64_t c_rs) {
    GemmParams p;
    p.a = a, p.b = b, p.c = c;
    p.m = m, p.n = n, p.k = k;
    p.a_rs = a_rs, p.a_cs = a_cs, p.b_rs = b_rs, p.b_cs = b_cs, p.c_rs = c_rs;
    p.dtype = dtype;
    fn(p, 0, 0, m, 0, n, work.get());
  }
};

// P of a tile from the forward's LSE (0 where masked or for a row with nothing visible).
template <typename A>
void probabilities(int64_t rows, int64_t cols, int64_t ld, const A* lse, A* s) {
  for (int64_t r = 0; r < rows; ++r) {
    A* row = s + r * ld;
    const A m = lse[r];
    if (m == -std::numeric_limits<A>::infinity() || std::isnan(m)) {  // (NaN: the row's gradients NaN)
      std::fill(row, row + ld, std::isnan(m) ? m : A(0));
      continue;
    }
    exp_rows(row, cols, m);
    for (int64_t c = cols; c < ld; ++c) row[c] = 0;
  }
}

// dS = P * (dP - delta) (* (1 - tanh^2) with a softcap) * scale, in place in dp.
template <typename A>
void score_grads(const AttentionParams& p, int64_t rows, int64_t cols, int64_t ld, const A* prob,
                 const A* tanh_s, const A* delta, A* dp) {
  const A scale = static_cast<A>(p.scale);
  for (int64_t r = 0; r < rows; ++r) {
    A* row = dp + r * ld;
    const A* pr = prob + r * ld;
    for (int64_t c = 0; c < cols; ++c) {
      A g = pr[c] * (row[c] - delta[r]);
      if (p.softcap > 0) {
        const A t = tanh_s[r * ld + c];
        g *= A(1) - t * t;
      }
      row[c] = g * scale;
    }
    for (int64_t c = cols; c < ld; ++c) row[c] = 0;
  }
}

template <typename T>
void backward_kernel(const AttentionGradParams& g) {
  using A = acc_type<T>;
  const AttentionParams& p = g.fwd;
  const AttentionPattern& pat = p.pattern;
  const int64_t D = p.head_dim, group = p.heads / p.kv_heads;
  const int64_t tq = tile_queries(pat), tk = tile_keys(pat);
  const TileTasks kv_work(pat, p.batch, p.kv_heads, tk, true), q_work(pat, p.batch, p.heads, tq, false);
  const bool small = 10.0 * p.heads * q_work.pairs * D < double(int64_t{1} << 22);
  const CpuIsa isa = cpu_isa();
  const A* lse_all = static_cast<const A*>(p.lse);
  const A* grad_lse = static_cast<const A*>(g.grad_lse);

  // delta = sum_d dO * O - grad_lse: the softmax's backward term, per query, laid out like the LSE
  // (row lse_at(b, h) + i). A pass over the tensors' rows: (B, Hq, Sq), or under varlen the packed
  // (1, Hq, total_q), whose rows are the sequences' queries one after another.
  const int64_t tensor_batch = pat.varlen() ? 1 : p.batch, Sq_all = pat.sq;
  const int64_t rows_total = tensor_batch * p.heads * Sq_all;
  std::vector<A> delta(rows_total);
  at::parallel_for(0, rows_total, small ? std::max<int64_t>(rows_total, 1) : 256,
                   [&](int64_t begin, int64_t end) {
                     for (int64_t row = begin; row < end; ++row) {
                       const int64_t i = row % Sq_all, bh = row / Sq_all, h = bh % p.heads,
                                     tb = bh / p.heads;  // (tensor row)
                       const T* go = at_<T>(g.grad_out, tb * g.g_bs + h * g.g_hs + i * g.g_ss);
                       const T* o = at_<T>(p.out, tb * p.o_bs + h * p.o_hs + i * p.o_ss);
                       A sum = 0;
                       for (int64_t d = 0; d < D; ++d) sum += static_cast<A>(go[d]) * static_cast<A>(o[d]);
                       delta[row] = sum - (grad_lse ? grad_lse[row] : A(0));
                     }
                   });

  // The accumulating products (dV += P^T dO, dK += dS^T Q, dQ += dS K) run on the shared GEMM's
  // packed entry, accumulating in place: P and dS (rounded to the inputs' type, as the forward
  // rounds P) packed by the accumulation type's packer, dO, Q and K by the inputs'.
  const GemmPackedFns in = gemm_packed(p.dtype, isa);
  const GemmPackedFns acc_fns =
      gemm_packed(std::is_same_v<A, double> ? DType::kFloat64 : DType::kFloat32, isa);
  const int64_t t_max = std::max(tq, tk);

  // Per-thread buffers of one tile pair.
  struct Buffers {
    Gemm gemm;
    std::vector<A> s, t, dp, acc, acc2, a_packed, b_packed;
    Buffers(DType dt, CpuIsa isa, int64_t D, int64_t tq, int64_t tk, int64_t a_elems, int64_t b_elems)
        : gemm(dt, isa),
          s(tq * tk),
          t(tq * tk),
          dp(tq * tk),
          acc(std::max(tq, tk) * D),
          acc2(std::max(tq, tk) * D),
          a_packed(a_elems),
          b_packed(b_elems) {}
  };
  const int64_t a_elems = acc_fns.a_size(t_max, t_max), b_elems = in.b_size(t_max, D);
  // x (rows x cols, row stride ld) rounded to the inputs' type in place (16-bit inputs).
  auto round_to_inputs = [](std::vector<A>& x) {
    if constexpr (!std::is_same_v<T, A>) {
      for (A& e : x) e = static_cast<A>(static_cast<T>(e));
    }
  };
  // c (m x D, rows of D) += a (m x k: element (r, c) at a[r * a_rs + c * a_cs]) @ b (k x D, inputs).
  auto accumulate = [&](Buffers& w, int64_t m, int64_t k, const A* a, int64_t a_rs, int64_t a_cs, const T* b,
                        int64_t b_rs, int64_t b_cs, A* c) {
    acc_fns.pack_a(a, a_rs, a_cs, m, k, w.a_packed.data());
    in.pack_b(b, b_rs, b_cs, k, D, w.b_packed.data());
    acc_fns.multiply(m, D, k, w.a_packed.data(), w.b_packed.data(), c, D, true);
  };

  // Scores, probabilities and dS of tile (b, h, i0, j0) of sequence b (pattern seq) into the
  // buffers; false when empty.
  auto tile = [&](Buffers& w, const AttentionPattern& seq, int64_t b, int64_t h, int64_t i0, int64_t rows,
                  int64_t j0, int64_t cols, SegmentRange q_range, SegmentRange kv_range) {
    const BlockKind kind = tile_kind(seq, b, h, i0, i0 + rows, j0, j0 + cols, q_range, kv_range);
    if (kind == BlockKind::kEmpty) return false;
    const int64_t hk = h / group;
    const T* q = at_<T>(p.q, p.q_at(b, h) + i0 * p.q_ss);
    const T* k = at_<T>(p.k, p.k_at(b, hk) + j0 * p.k_ss);
    const T* v = at_<T>(p.v, p.v_at(b, hk) + j0 * p.v_ss);
    const T* go = at_<T>(g.grad_out, g.g_at(b, h) + i0 * g.g_ss);
    w.gemm(rows, cols, D, q, p.q_ss, p.q_ds, k, p.k_ds, p.k_ss, w.s.data(), tk);
    finish_scores<A>(p, seq, kind, b, h, i0, rows, j0, cols, tk, w.s.data(), w.t.data());
    probabilities<A>(rows, cols, tk, lse_all + p.lse_at(b, h) + i0, w.s.data());
    w.gemm(rows, cols, D, go, g.g_ss, 1, v, p.v_ds, p.v_ss, w.dp.data(), tk);  // dP = dO V^T
    score_grads<A>(p, rows, cols, tk, w.s.data(), w.t.data(), delta.data() + p.lse_at(b, h) + i0,
                   w.dp.data());
    return true;
  };

  // dK, dV: a task per (sequence, kv head, key tile), over the group's query heads and query tiles
  // (keys no query sees get zeros).
  const int64_t kv_grain = small ? std::max<int64_t>(kv_work.count, 1) : 1;
  at::parallel_for(0, kv_work.count, kv_grain, [&](int64_t begin, int64_t end) {
    Buffers w(p.dtype, isa, D, tq, tk, a_elems, b_elems);
    for (int64_t task = begin; task < end; ++task) {
      int64_t b, hk, kt;
      kv_work.locate(task, b, hk, kt);
      const AttentionPattern seq = pat.at(b);
      const int64_t Sq = seq.sq, q_tiles = (Sq + tq - 1) / tq;
      const int64_t j0 = kt * tk, cols = std::min(tk, seq.sk - j0);
      std::fill(w.acc.begin(), w.acc.end(), A(0));    // dV
      std::fill(w.acc2.begin(), w.acc2.end(), A(0));  // dK
      const SegmentRange kv_range = segment_range(pat.kv_segments, pat.kv_seg_bs, b, j0, j0 + cols);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t qt = 0; qt < q_tiles; ++qt) {
          const int64_t i0 = qt * tq, rows = std::min(tq, Sq - i0);
          const SegmentRange q_range = segment_range(pat.q_segments, pat.q_seg_bs, b, i0, i0 + rows);
          if (!tile(w, seq, b, h, i0, rows, j0, cols, q_range, kv_range)) continue;
          const T* q = at_<T>(p.q, p.q_at(b, h) + i0 * p.q_ss);
          const T* go = at_<T>(g.grad_out, g.g_at(b, h) + i0 * g.g_ss);
          // dV += P^T dO, dK += dS^T Q (P and dS read transposed: (cols, rows) with strides (1, tk)).
          round_to_inputs(w.s);
          round_to_inputs(w.dp);
          accumulate(w, cols, rows, w.s.data(), 1, tk, go, g.g_ss, 1, w.acc.data());
          accumulate(w, cols, rows, w.dp.data(), 1, tk, q, p.q_ss, p.q_ds, w.acc2.data());
        }
      }
      T* dv = static_cast<T*>(g.dv) + g.dv_at(b, hk) + j0 * g.dv_ss;
      T* dk = static_cast<T*>(g.dk) + g.dk_at(b, hk) + j0 * g.dk_ss;
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t d = 0; d < D; ++d) {
          dv[c * g.dv_ss + d] = static_cast<T>(w.acc[c * D + d]);
          dk[c * g.dk_ss + d] = static_cast<T>(w.acc2[c * D + d]);
        }
    }
  });

  // dQ: a task per (sequence, head, query tile), over the key tiles.
  const int64_t q_grain = small ? std::max<int64_t>(q_work.count, 1) : 1;
  at::parallel_for(0, q_work.count, q_grain, [&](int64_t begin, int64_t end) {
    Buffers w(p.dtype, isa, D, tq, tk, a_elems, b_elems);
    for (int64_t task = begin; task < end; ++task) {
      int64_t b, h, qt;
      q_work.locate(task, b, h, qt);
      const AttentionPattern seq = pat.at(b);
      const int64_t Sk = seq.sk, k_tiles = (Sk + tk - 1) / tk;
      const int64_t i0 = qt * tq, rows = std::min(tq, seq.sq - i0), hk = h / group;
      std::fill(w.acc.begin(), w.acc.end(), A(0));
      const SegmentRange q_range = segment_range(pat.q_segments, pat.q_seg_bs, b, i0, i0 + rows);
      for (int64_t kt = 0; kt < k_tiles; ++kt) {
        const int64_t j0 = kt * tk, cols = std::min(tk, Sk - j0);
        const SegmentRange kv_range = segment_range(pat.kv_segments, pat.kv_seg_bs, b, j0, j0 + cols);
        if (!tile(w, seq, b, h, i0, rows, j0, cols, q_range, kv_range)) continue;
        const T* k = at_<T>(p.k, p.k_at(b, hk) + j0 * p.k_ss);
        round_to_inputs(w.dp);
        accumulate(w, rows, cols, w.dp.data(), tk, 1, k, p.k_ss, p.k_ds, w.acc.data());
      }
      T* dq = static_cast<T*>(g.dq) + g.dq_at(b, h) + i0 * g.dq_ss;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d) dq[r * g.dq_ss + d] = static_cast<T>(w.acc[r * D + d]);
    }
  });
}

}  // namespace
}  // namespace attention_cpu

void attention_cpu_backward(const AttentionGradParams& g) {
  attention_cpu::dispatch_dtype(g.fwd.dtype, [&](auto x) { attention_cpu::backward_kernel<decltype(x)>(g); });
}

}  // namespace opforge
