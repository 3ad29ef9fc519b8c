// attention CPU: the decode kernel and the merge of its chunks.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention/attention_params.h"
#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/attention_cpu_common.h"
#include "attention/cpu/attention_kernel.h"
#include "common/cpu_isa.h"

namespace opforge {
namespace attention_cpu {
namespace {

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
        sc(rows * kDecodeBlock), run_sc(rows * kDecodeBlock);
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
      // f(j, run) for each run of keys [j, j + run) in one page (the whole range when not paged).
      const auto for_page_runs = [&](int64_t j0, int64_t cols, auto&& f) {
        for (int64_t j = j0; j < j0 + cols;) {
          const int64_t run =
              p.block_table ? std::min(j0 + cols - j, p.page_size - j % p.page_size) : j0 + cols - j;
          f(j, run);
          j += run;
        }
      };
      const auto load_keys = [&](const T* head, int64_t bs, int64_t ss, int64_t ds, int64_t j0, int64_t cols,
                                 A* dst) {
        for_page_runs(j0, cols, [&](int64_t j, int64_t run) {
          load_rows(head + p.kv_row(b, j, bs, ss), ss, ds, run, D, dst + (j - j0) * D);
        });
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
          // (float32 / float64 caches; paged ones a page's run of rows at a time, the run's scores
          // and probabilities through run_sc), else converted into a block.
          bool in_runs = false;
          if constexpr (std::is_same_v<T, A>) in_runs = p.block_table && p.k_ds == 1 && p.v_ds == 1;
          const A* kt = kb.data();
          int64_t kld = D;
          if constexpr (std::is_same_v<T, A>) {
            if (p.k_ds == 1 && !p.block_table) kt = khead + p.kv_row(b, j0, p.k_bs, p.k_ss), kld = p.k_ss;
            if (in_runs) {
              for_page_runs(j0, cols, [&](int64_t j, int64_t run) {
                const A* kr = khead + p.kv_row(b, j, p.k_bs, p.k_ss);
                if (run == cols)
                  return decode_scores(qs.data() + i * rows * D, rows, kr, p.k_ss, run, D, sc.data());
                decode_scores(qs.data() + i * rows * D, rows, kr, p.k_ss, run, D, run_sc.data());
                for (int64_t r = 0; r < rows; ++r) {
                  std::copy_n(run_sc.data() + r * run, run, sc.data() + r * cols + (j - j0));
                }
              });
            }
          }
          if (!in_runs) {
            if (kt == kb.data()) load_keys(khead, p.k_bs, p.k_ss, p.k_ds, j0, cols, kb.data());
            decode_scores(qs.data() + i * rows * D, rows, kt, kld, cols, D, sc.data());
          }
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
            if (mx == neg_inf) {                    // nothing visible in this row yet
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
            if (in_runs) {
              for_page_runs(j0, cols, [&](int64_t j, int64_t run) {
                const A* vr = vhead + p.kv_row(b, j, p.v_bs, p.v_ss);
                if (run == cols) return decode_accumulate(sc.data(), rows, vr, p.v_ss, run, D, o);
                for (int64_t r = 0; r < rows; ++r) {
                  std::copy_n(sc.data() + r * cols + (j - j0), run, run_sc.data() + r * run);
                }
                decode_accumulate(run_sc.data(), rows, vr, p.v_ss, run, D, o);
              });
            }
          }
          if (!in_runs) {
            if (vt == vb.data()) load_keys(vhead, p.v_bs, p.v_ss, p.v_ds, j0, cols, vb.data());
            decode_accumulate(sc.data(), rows, vt, vld, cols, D, o);
          }
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
      if (mx == neg_inf) {  // a row with nothing visible: zeros and an LSE of -inf (or its sink)
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(0);
        A unused;
        finish_row(mx, A(0), p.sinks, h, unused, *lse);
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
      A inv;
      finish_row(mx, sum, p.sinks, h, inv, *lse);
      for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(acc[d] * inv);
    }
  });
}

}  // namespace
}  // namespace attention_cpu

void attention_cpu_decode(const AttentionParams& p) {
  attention_cpu::dispatch_dtype(p.dtype, [&](auto x) { attention_cpu::decode_kernel<decltype(x)>(p); });
}

}  // namespace opforge
