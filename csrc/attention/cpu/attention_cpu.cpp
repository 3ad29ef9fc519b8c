// attention CPU: forward and backward, tiled with an online softmax (no Sq x Sk matrix in memory).
//
// Forward: a task is one (batch, head, 64-query tile); it walks the key tiles the pattern leaves
// visible (tile_kind: empty tiles are skipped, full tiles take no mask arithmetic), computing
// S = Q K^T and P V with the blocked GEMM of matmul's CPU kernel (AVX2 where the CPU has it).
// Backward: dK and dV by key tiles (a task owns its tile's rows for the whole GQA group: the
// reduction over the group's query heads happens inside the task), then dQ by query tiles; every
// sum runs in a fixed order, so gradients are deterministic. Accumulation in float (double for
// float64 inputs); 16-bit inputs round P and dS to their type for the P V and dS K products, as
// GPU flash attention does.
// Packed variable-length sequences (cu_seqlens): every loop runs over sequences in place of batch
// rows, each with its own lengths (pattern.at(b)) and tile counts (TileTasks), and finds its rows by
// the params' offsets (q_at, k_at, ...); the offsets are host memory here.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention.h"
#include "attention/cpu/attention_kernel.h"
#include "common/checks.h"
#include "common/cpu_isa.h"
#include "matmul/cpu/gemm_kernel.h"

namespace opforge {
namespace {

// Tiles of 96 queries (16 of the GEMM's 6-row micro-panels, no edge panel) by 128 keys; with a
// block mask a tile lies inside one mask block: 128 (or 64 where the blocks are not a multiple of
// 128) on each side. 64-row products ran at half the rate of 128-row ones (53 vs 117 GFLOP/s).
int64_t tile_queries(const AttentionPattern& p) {
  return p.mask_kinds ? (p.block_q % 128 ? 64 : 128) : 96;
}
int64_t tile_keys(const AttentionPattern& p) {
  return p.mask_kinds && p.block_k % 128 ? 64 : 128;
}

template <typename T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;

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
SegmentRange segment_range(const int64_t* ids, int64_t stride_b, int64_t b, int64_t i0, int64_t i1) {
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

// The softmax's row loops: vectorized (Sleef's exp on AVX2) for float, plain for double.
float row_max(const float* x, int64_t n, float init) {
  return softmax_row_fns(cpu_isa()).max(x, n, init);
}
float exp_sum(float* x, int64_t n, float m) {
  return softmax_row_fns(cpu_isa()).exp_sum(x, n, m);
}
void exp_rows(float* x, int64_t n, float m) {
  softmax_row_fns(cpu_isa()).exp(x, n, m);
}
double row_max(const double* x, int64_t n, double init) {
  for (int64_t i = 0; i < n; ++i) init = std::isnan(init) || x[i] <= init ? init : x[i];  // (NaN sticks)
  return init;
}
double exp_sum(double* x, int64_t n, double m) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - m));
  return sum;
}
void exp_rows(double* x, int64_t n, double m) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - m);
}

// max(a, b) that keeps a NaN of either (std::max drops a NaN b).
template <typename A>
A max_keeping_nan(A a, A b) {
  return std::isnan(a) ? a : (std::isnan(b) || b > a) ? b : a;
}

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
          const A mx = row_max(row, cols, m[r]);  // (NaN if a visible score is)
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
        // A row with nothing visible: zeros and an LSE of -inf; NaN scores: NaN (l is NaN).
        const A inv = l[r] == 0 ? A(0) : A(1) / l[r];
        for (int64_t d = 0; d < D; ++d) out[r * p.o_ss + d] = static_cast<T>(o[r * D + d] * inv);
        lse[r] = l[r] == 0 ? -std::numeric_limits<A>::infinity() : m[r] + std::log(l[r]);
      }
    }
  });
}

// Decode: few query rows against a long KV cache (Sq x the GQA group <= kDecodeRows). A task is one
// (batch, kv head, chunk of keys) and takes the group's query heads together, so that each K and V
// row is read once for all of them (converted into a small float block; GEMM packing would move the
// cache twice more for one query row). Key blocks the pattern leaves empty are never read (a sliding
// window reads its last W keys). The chunks' partial softmax states (max, sum, output) merge in chunk
// order afterwards: deterministic, and parallel over the keys when batch x kv heads is small.
// (When it serves: attention_heuristics.h, up to kAttentionCpuDecodeMaxRows rows.)
constexpr int64_t kDecodeBlock = 128;

template <typename A>
void decode_scores(const A* q, int64_t rows, const A* k, int64_t ld, int64_t cols, int64_t d, A* s) {
  if constexpr (std::is_same_v<A, float>) {
    softmax_row_fns(cpu_isa()).scores(q, rows, k, ld, cols, d, s);
  } else {
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) {
        A sum = 0;
        for (int64_t i = 0; i < d; ++i) sum += q[r * d + i] * k[c * ld + i];
        s[r * cols + c] = sum;
      }
  }
}

template <typename A>
void decode_accumulate(const A* pr, int64_t rows, const A* v, int64_t ld, int64_t cols, int64_t d, A* o) {
  if constexpr (std::is_same_v<A, float>) {
    softmax_row_fns(cpu_isa()).accumulate(pr, rows, v, ld, cols, d, o);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t i = 0; i < d; ++i) o[r * d + i] += pr[r * cols + c] * v[c * ld + i];
  }
}

// Rows [0, n) of a (rows x d) block of x (row stride ss, element stride ds) into dst as A.
template <typename T, typename A>
void load_rows(const T* x, int64_t ss, int64_t ds, int64_t n, int64_t d, A* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const T* row = x + r * ss;
    A* out = dst + r * d;
    if (ds == 1) {
      for (int64_t i = 0; i < d; ++i) out[i] = static_cast<A>(row[i]);
    } else {
      for (int64_t i = 0; i < d; ++i) out[i] = static_cast<A>(row[i * ds]);
    }
  }
}

template <typename T>
void decode_kernel(const AttentionParams& p) {
  using A = acc_type<T>;
  const AttentionPattern& pat = p.pattern;
  // Every batch row has Sq queries here: packed sequences (varlen) never reach this kernel (the
  // rule gives them the tiled one, and variant 'decode' refuses them).
  TORCH_INTERNAL_ASSERT(!pat.varlen(), "opforge.attention: the decode kernel takes no packed sequences");
  const int64_t D = p.head_dim, Sq = pat.sq, Sk = pat.sk, group = p.heads / p.kv_heads, rows = group * Sq;
  const int64_t blocks = (Sk + kDecodeBlock - 1) / kDecodeBlock, heads = p.batch * p.kv_heads;
  // About four tasks a thread, each of at least four key blocks. A task (chunk c of a (batch, kv
  // head)) takes the c-th share of its sequence's visible blocks (per-sequence key counts and a
  // band make those differ), and tasks run chunk-major, so that each thread's range holds every
  // sequence's shares alike (ragged lengths stay balanced).
  const int64_t threads = at::get_num_threads();
  // Where a cache row holds every kv head (paged caches, (B, S, Hkv, D) layouts) a task takes all kv
  // heads of its key blocks, one head after another a block: the rows' memory is read once, in
  // order, where a task a head would stride over the other heads' rows.
  const bool by_row = p.kv_heads > 1 && (p.block_table != nullptr || p.k_hs < p.k_ss);
  const int64_t units = by_row ? p.batch : heads, heads_a_task = by_row ? p.kv_heads : 1;
  const int64_t chunks = std::min<int64_t>(std::max<int64_t>(1, (4 * threads + units - 1) / units),
                                           std::max<int64_t>(1, (blocks + 3) / 4));
  const int64_t tasks = units * chunks;
  const int64_t flops = 4 * p.batch * p.heads * Sq * Sk * D;
  // Serial below about 20 us of work (a parallel region costs a few us at two threads).
  const int64_t grain = flops < (int64_t{1} << 19) ? tasks : 1;
  const A scale = static_cast<A>(p.scale), neg_inf = -std::numeric_limits<A>::infinity();
  std::vector<A> part_o(heads * chunks * rows * D), part_m(heads * chunks * rows),
      part_l(heads * chunks * rows);
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    std::vector<A> qs(heads_a_task * rows * D), kb(kDecodeBlock * D), vb(kDecodeBlock * D),
        sc(rows * kDecodeBlock);
    std::vector<BlockKind> kinds(group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t c = task / units, u = task % units;
      const int64_t b = by_row ? u : u / p.kv_heads, hk0 = by_row ? 0 : u % p.kv_heads;
      // This sequence's pattern: its own key count with per-sequence counts (kv_lens).
      const AttentionPattern bpat = pat.at(b);
      int64_t lo, hi;
      band_key_range(bpat, 0, Sq, lo, hi);
      const int64_t first = lo / kDecodeBlock,
                    last = hi <= lo ? first : (hi + kDecodeBlock - 1) / kDecodeBlock;
      const int64_t per_chunk = (last - first + chunks - 1) / chunks;
      const int64_t blk0 = first + c * per_chunk, blk1 = std::min(last, blk0 + per_chunk);
      // (the partial states sit by (batch, kv head), then chunk, for the merge)
      const auto slot_of = [&](int64_t hk) { return (b * p.kv_heads + hk) * chunks + c; };
      for (int64_t i = 0; i < heads_a_task; ++i) {
        const int64_t hk = hk0 + i, slot = slot_of(hk);
        A* q_rows = qs.data() + i * rows * D;
        for (int64_t g = 0; g < group; ++g) {
          load_rows(at_<T>(p.q, p.q_at(b, hk * group + g)), p.q_ss, p.q_ds, Sq, D, q_rows + g * Sq * D);
        }
        for (int64_t x = 0; x < rows * D; ++x) q_rows[x] *= scale;
        std::fill(part_o.data() + slot * rows * D, part_o.data() + (slot + 1) * rows * D, A(0));
        std::fill(part_m.data() + slot * rows, part_m.data() + (slot + 1) * rows, neg_inf);
        std::fill(part_l.data() + slot * rows, part_l.data() + (slot + 1) * rows, A(0));
      }
      const SegmentRange q_range = segment_range(pat.q_segments, pat.q_seg_bs, b, 0, Sq);
      // Rows [j0, j0 + cols) of K or V into a block, a page's run at a time (key j's row at
      // head + kv_row(b, j, ...): through the page table for paged caches).
      const auto load_keys = [&](const T* head, int64_t bs, int64_t ss, int64_t ds, int64_t j0, int64_t cols,
                                 A* dst) {
        for (int64_t j = j0; j < j0 + cols;) {
          const int64_t run =
              p.block_table ? std::min(j0 + cols - j, p.page_size - j % p.page_size) : j0 + cols - j;
          load_rows(head + p.kv_row(b, j, bs, ss), ss, ds, run, D, dst + (j - j0) * D);
          j += run;
        }
      };
      for (int64_t blk = blk0; blk < blk1; ++blk) {
        const int64_t j0 = blk * kDecodeBlock, cols = std::min(kDecodeBlock, bpat.sk - j0);
        if (cols <= 0) break;  // past this sequence's keys
        const SegmentRange kv_range = pat.kv_segments
                                          ? segment_range(pat.kv_segments, pat.kv_seg_bs, b, j0, j0 + cols)
                                          : SegmentRange{};
        for (int64_t i = 0; i < heads_a_task; ++i) {
          const int64_t hk = hk0 + i, slot = slot_of(hk);
          A* o = part_o.data() + slot * rows * D;
          A* m = part_m.data() + slot * rows;
          A* l = part_l.data() + slot * rows;
          const T* khead = at_<T>(p.k, hk * p.k_hs);
          const T* vhead = at_<T>(p.v, hk * p.v_hs);
          bool any = false;
          for (int64_t g = 0; g < group; ++g) {
            kinds[g] = tile_kind(bpat, b, hk * group + g, 0, Sq, j0, j0 + cols, q_range, kv_range);
            any = any || kinds[g] != BlockKind::kEmpty;
          }
          if (!any) continue;
          // K and V in place when they are already the accumulation type with unit column stride
          // (float32 / float64 caches, not paged), else converted into a block.
          const A* kt = kb.data();
          int64_t kld = D;
          if constexpr (std::is_same_v<T, A>) {
            if (p.k_ds == 1 && !p.block_table) kt = khead + p.kv_row(b, j0, p.k_bs, p.k_ss), kld = p.k_ss;
          }
          if (kt == kb.data()) load_keys(khead, p.k_bs, p.k_ss, p.k_ds, j0, cols, kb.data());
          decode_scores(qs.data() + i * rows * D, rows, kt, kld, cols, D, sc.data());
          for (int64_t g = 0; g < group; ++g) {
            A* sg = sc.data() + g * Sq * cols;
            if (kinds[g] == BlockKind::kEmpty) {
              std::fill(sg, sg + Sq * cols, neg_inf);
            } else {
              finish_scores<A>(p, bpat, kinds[g], b, hk * group + g, 0, Sq, j0, cols, cols, sg, sg, true);
            }
          }
          for (int64_t r = 0; r < rows; ++r) {
            A* row = sc.data() + r * cols;
            const A mx = row_max(row, cols, m[r]);  // (NaN if a visible score is)
            if (mx == neg_inf) {  // nothing visible in this row yet
              std::fill(row, row + cols, A(0));
              continue;
            }
            const A alpha = std::exp(m[r] - mx);  // 0 for the first visible block (m = -inf)
            l[r] = l[r] * alpha + exp_sum(row, cols, mx);
            m[r] = mx;
            for (int64_t d = 0; d < D; ++d) o[r * D + d] *= alpha;
            if constexpr (!std::is_same_v<T, A>) {  // P rounded to the inputs' type, as the tiled path does
              for (int64_t cc = 0; cc < cols; ++cc) row[cc] = static_cast<A>(static_cast<T>(row[cc]));
            }
          }
          const A* vt = vb.data();
          int64_t vld = D;
          if constexpr (std::is_same_v<T, A>) {
            if (p.v_ds == 1 && !p.block_table) vt = vhead + p.kv_row(b, j0, p.v_bs, p.v_ss), vld = p.v_ss;
          }
          if (vt == vb.data()) load_keys(vhead, p.v_bs, p.v_ss, p.v_ds, j0, cols, vb.data());
          decode_accumulate(sc.data(), rows, vt, vld, cols, D, o);
        }
      }
    }
  });
  // Merge the chunks of each (batch, kv head), in chunk order.
  at::parallel_for(0, heads * rows, grain == tasks ? heads * rows : 16, [&](int64_t begin, int64_t end) {
    std::vector<A> acc(D);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t r = idx % rows, bh = idx / rows, hk = bh % p.kv_heads, b = bh / p.kv_heads;
      const int64_t g = r / Sq, i = r % Sq, h = hk * group + g;
      A mx = neg_inf;
      for (int64_t c = 0; c < chunks; ++c) mx = max_keeping_nan(mx, part_m[(bh * chunks + c) * rows + r]);
      T* out = static_cast<T*>(p.out) + p.o_at(b, h) + i * p.o_ss;
      A* lse = static_cast<A*>(p.lse) + p.lse_at(b, h) + i;
      if (mx == neg_inf) {  // a row with nothing visible: zeros and an LSE of -inf
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(0);
        *lse = neg_inf;
        continue;
      }
      std::fill(acc.begin(), acc.end(), A(0));
      A sum = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t t = bh * chunks + c;
        const A mc = part_m[t * rows + r];
        if (mc == neg_inf) continue;
        const A w = std::exp(mc - mx);
        sum += w * part_l[t * rows + r];
        const A* oc = part_o.data() + (t * rows + r) * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * oc[d];
      }
      const A inv = A(1) / sum;
      for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(acc[d] * inv);
      *lse = mx + std::log(sum);
    }
  });
}

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

// A block mask's data comes from opforge.block_mask, but the tensors are plain arguments:
// every kind and partial index is checked before a kernel reads through them.
void check_mask_values(const AttentionPattern& pat, int64_t partials) {
  if (!pat.mask_kinds) return;
  const int64_t n = pat.mask_b * pat.mask_h * pat.mask_nq * pat.mask_nk;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t kind = pat.mask_kinds[i];
    TORCH_CHECK_VALUE(kind <= 2, "opforge.attention: mask_kinds holds ", int{kind},
                      ": block kinds are 0 (empty), 1 (full) and 2 (partial)");
    if (kind == 2) {
      TORCH_CHECK_VALUE(pat.mask_index[i] >= 0 && pat.mask_index[i] < partials,
                        "opforge.attention: mask_index ", pat.mask_index[i],
                        " of a partial block is outside mask_bits' ", partials, " blocks");
    }
  }
}

std::tuple<at::Tensor, at::Tensor> attention_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap, bool causal,
    int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, c10::string_view variant,
    std::optional<bool> /*deterministic*/) {
  AttentionPatternArgs args =
      attention_pattern_args(causal, window_left, window_right, prefix_len, q_segments, kv_segments,
                             mask_kinds, mask_index, mask_bits, block_q, block_k);
  args.kv_lens = kv_lens;
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  const char* op = attention_op_name(args);
  check_attention_inputs(q, k, v, scale, softcap, args);
  check_varlen_offsets(op, args, q.size(2), k.size(2));
  const AttentionCall call = attention_call(q, k, kv_lens.has_value(), false, args.varlen());
  const AttentionKernel kernel = choose_attention_kernel(op, call, variant);
  at::Tensor out = empty_attention_like(q, args.varlen());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(attention_lse_dtype(q)));
  if (out.numel() == 0) return {out, lse.fill_(-std::numeric_limits<double>::infinity())};
  const AttentionPlan plan = plan_attention(q, k, v, out, lse, scale, softcap, args);
  check_mask_values(plan.params.pattern, mask_bits ? mask_bits->size(0) : 0);
  // (Named in profiler traces: "opforge.attention.tiled" / ".decode".)
  RECORD_FUNCTION(kernel == AttentionKernel::kDecode ? "opforge.attention.decode" : "opforge.attention.tiled",
                  std::vector<c10::IValue>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "opforge.attention", [&] {
    if (kernel == AttentionKernel::kDecode) {
      decode_kernel<scalar_t>(plan.params);
    } else {
      forward_kernel<scalar_t>(plan.params);
    }
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& grad_lse, double scale,
    double softcap, bool causal, int64_t window_left, int64_t window_right, int64_t prefix_len,
    const std::optional<at::Tensor>& q_segments, const std::optional<at::Tensor>& kv_segments,
    const std::optional<at::Tensor>& mask_kinds, const std::optional<at::Tensor>& mask_index,
    const std::optional<at::Tensor>& mask_bits, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
    c10::string_view variant, std::optional<bool> /*deterministic: always*/) {
  AttentionPatternArgs args =
      attention_pattern_args(causal, window_left, window_right, prefix_len, q_segments, kv_segments,
                             mask_kinds, mask_index, mask_bits, block_q, block_k);
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  check_attention_backward_inputs(grad_out, q, k, v, out, lse, grad_lse, scale, softcap, args);
  check_varlen_offsets("opforge.attention_backward", args, q.size(2), k.size(2));
  choose_attention_kernel("opforge.attention_backward", attention_call(q, k, false, true, args.varlen()),
                          variant);  // (tiled)
  RECORD_FUNCTION("opforge.attention_backward.tiled", std::vector<c10::IValue>());
  at::Tensor dq = empty_attention_like(q), dk = empty_attention_like(k), dv = empty_attention_like(v);
  if (q.numel() == 0 || k.numel() == 0) {  // nothing visible anywhere: every gradient is 0
    return {dq.zero_(), dk.zero_(), dv.zero_()};
  }
  // The kernels read rows of grad_out and out with unit stride.
  const at::Tensor go = grad_out.stride(3) == 1 ? grad_out : grad_out.contiguous();
  const at::Tensor o = out.stride(3) == 1 ? out : out.contiguous();
  const at::Tensor lse_c = lse.contiguous();
  const at::Tensor grad_lse_c = grad_lse ? grad_lse->contiguous() : at::Tensor();
  AttentionPlan plan = plan_attention(q, k, v, o, lse_c, scale, softcap, args);
  check_mask_values(plan.params.pattern, mask_bits ? mask_bits->size(0) : 0);
  const AttentionGradParams g = attention_grad_params(plan.params, go, grad_lse_c, dq, dk, dv);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "opforge.attention_backward",
                                  [&] { backward_kernel<scalar_t>(g); });
  return {dq, dk, dv};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_paged_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                                                       const at::Tensor& v_cache, const at::Tensor& kv_lens,
                                                       const at::Tensor& block_table, double scale,
                                                       double softcap, bool causal, int64_t window_left,
                                                       int64_t window_right, int64_t prefix_len,
                                                       c10::string_view variant) {
  constexpr const char* op = "opforge.attention";
  TORCH_CHECK(q.defined() && q.dim() == 4, op, ": q must be a 4-D tensor (batch, heads, sequence, head_dim)");
  at::Tensor out = empty_attention_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(attention_lse_dtype(q)));
  const AttentionPlan plan =
      plan_paged_attention(q, k_cache, v_cache, kv_lens, int32_block_table(block_table, k_cache.size(0)), out,
                           lse, scale, softcap, causal, window_left, window_right, prefix_len);
  const AttentionKernel kernel = choose_attention_kernel(
      op, attention_call(q, paged_view(k_cache, q.size(0), plan.params.pattern.sk), true, false, false),
      variant);
  if (kernel != AttentionKernel::kDecode) {  // (the CPU's tiled kernel reads one contiguous cache)
    return attention_paged_gathered(q, k_cache, v_cache, kv_lens, block_table, scale, softcap, causal,
                                    window_left, window_right, prefix_len, variant);
  }
  if (out.numel() == 0) return {out, lse.fill_(-std::numeric_limits<double>::infinity())};
  RECORD_FUNCTION("opforge.attention.decode", std::vector<c10::IValue>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "opforge.attention",
                                  [&] { decode_kernel<scalar_t>(plan.params); });
  return {out, lse};
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("attention_paged", &attention_paged_cpu);
  m.impl("attention", &attention_cpu);
  m.impl("attention_backward", &attention_backward_cpu);
}

}  // namespace opforge
