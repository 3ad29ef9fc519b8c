// nms: CPU entries. Greedy NMS in scan order, 64 boxes at a time: the boxes of a block are
// resolved one by one (each kept box suppressing the rest of its block), then the block's kept boxes suppress
// every later live candidate of the same class in one vectorized pass (parallel over candidates when it
// pays). Classes of batched_nms are independent segments, processed in parallel.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "nms/cpu/nms_kernel.h"
#include "nms/nms.h"

namespace opforge {
namespace {

constexpr int64_t kRowBlock = 64;
constexpr int64_t kWindowMin = 1024;  // segments at least this large use spatial windows
// Parallel regions only for work that is large against what a region can cost: when the other
// cores are busy (a neighbour's threads), a region waits for its workers to be scheduled, a
// scheduler tick each (measured: batched_nms of 1k boxes went from 0.06 ms to 8 ms on 2 cores,
// benchmarks/tuning/common/cpu_neighbour.py). torchvision's NMS is serial, so below these sizes opforge
// stays serial too and is never slower than it because of its own threading.
constexpr int64_t kParallelWork = 1 << 22;        // candidate x kept-box tests of one suppression pass
constexpr int64_t kParallelSegmentBoxes = 16384;  // batched_nms: boxes before classes run in parallel

// Five coordinate arrays (x1, y1, x2, y2, area) of n boxes, each zero-padded by kNmsPad entries so
// that the vector loops may read whole groups past the end.
template <typename A>
struct BoxArrays {
  explicit BoxArrays(int64_t n) : stride(n + kNmsPad), store(5 * stride, A(0)) {}
  void set(int64_t q, A x1, A y1, A x2, A y2, A area) {
    A* base = store.data() + q;
    base[0] = x1;
    base[stride] = y1;
    base[2 * stride] = x2;
    base[3 * stride] = y2;
    base[4 * stride] = area;
  }
  NmsBoxes<A> view() const {
    const A* p = store.data();
    return {p, p + stride, p + 2 * stride, p + 3 * stride, p + 4 * stride};
  }
  int64_t stride;
  std::vector<A> store;
};

// kept[p] = 1 when the box at score position p is kept.
template <typename A>
std::vector<uint8_t> nms_cpu_kept(const NmsPlan& plan) {
  const NmsParams& p = plan.params;
  const int64_t n = p.n;
  const at::Tensor boxes = plan.scan_boxes.to(sizeof(A) == 4 ? at::kFloat : at::kDouble).contiguous();
  const A* src = boxes.const_data_ptr<A>();
  BoxArrays<A> arrays(n);
  for (int64_t i = 0; i < n; ++i) {
    const A* c = src + 4 * i;
    arrays.set(i, c[0], c[1], c[2], c[3], (c[2] - c[0]) * (c[3] - c[1]));
  }
  const NmsBoxes<A> b = arrays.view();
  const A *x1 = b.x1, *y1 = b.y1, *x2 = b.x2, *y2 = b.y2, *area = b.area;
  const A threshold = sizeof(A) == 4 ? static_cast<A>(p.iou_threshold_f32) : static_cast<A>(p.iou_threshold);
  const NmsSuppressFn<A> suppress = nms_suppress_fn<A>(cpu_isa());
  std::vector<uint8_t> alive(n + kNmsPad, 0);
  std::fill(alive.begin(), alive.begin() + n, uint8_t{1});

  auto segment = [&](int64_t begin, int64_t end, bool parallel) {
    int64_t kept[kRowBlock];
    for (int64_t r0 = begin; r0 < end; r0 += kRowBlock) {
      const int64_t rend = std::min(r0 + kRowBlock, end);
      int nk = 0;
      for (int64_t i = r0; i < rend; ++i) {
        if (!alive[i]) continue;
        kept[nk++] = i;
        suppress(b, &kept[nk - 1], 1, i + 1, rend, threshold, alive.data());  // the rest of the block
      }
      if (nk == 0 || rend == end) continue;
      if (parallel && (end - rend) * nk >= kParallelWork) {
        at::parallel_for(rend, end, 2048, [&](int64_t j0, int64_t j1) {
          suppress(b, kept, nk, j0, j1, threshold, alive.data());
        });
      } else {
        suppress(b, kept, nk, rend, end, threshold, alive.data());
      }
    }
  };

  // Spatial windows: a kept box can only suppress boxes it overlaps (when threshold >= 0, IoU > 0
  // needs a positive intersection), i.e. boxes with x1 in (x1_k - widest box, x2_k). Candidates
  // sorted by x1 then give each kept box a window of the boxes near it instead of all later ones.
  const NmsSuppressWindowFn<A> window_pass = nms_window_fn<A>(cpu_isa());
  auto segment_windowed = [&](int64_t begin, int64_t end) {
    std::vector<std::pair<A, int32_t>> by_x;  // (x1, scan position); any order among equal x1 works
    by_x.reserve(end - begin);
    for (int64_t i = begin; i < end; ++i)  // NaN-coordinate boxes (NaN IoU) are never suppressed
      if (!std::isnan(x1[i]) && !std::isnan(y1[i]) && !std::isnan(x2[i]) && !std::isnan(y2[i]))
        by_x.emplace_back(x1[i], static_cast<int32_t>(i));
    std::sort(by_x.begin(), by_x.end(), [](const auto& a, const auto& c) { return a.first < c.first; });
    const int64_t m = static_cast<int64_t>(by_x.size());
    BoxArrays<A> window(m);
    std::vector<int32_t> order(m + kNmsPad, 0);
    std::vector<uint8_t> alive_x(m + kNmsPad, 0);
    double widest = 0;
    for (int64_t q = 0; q < m; ++q) {
      const int32_t i = by_x[q].second;
      order[q] = i;
      window.set(q, x1[i], y1[i], x2[i], y2[i], area[i]);
      alive_x[q] = alive[i];
      const double width = static_cast<double>(x2[i]) - static_cast<double>(x1[i]);
      if (width > widest) widest = width;  // NaN (inf - inf) is no width
    }
    const NmsBoxes<A> xb = window.view();
    const A* wx1 = xb.x1;
    for (int64_t i = begin; i < end; ++i) {
      if (!alive[i]) continue;  // i is kept
      // Window bounds in double with a margin: only ever more candidates, the IoU test decides.
      const double lo_x =
          static_cast<double>(x1[i]) - widest - 1e-6 * (std::fabs(static_cast<double>(x1[i])) + widest);
      const int64_t lo =
          std::upper_bound(wx1, wx1 + m, lo_x, [](double v, A x) { return v < static_cast<double>(x); }) -
          wx1;
      const int64_t hi = std::lower_bound(wx1, wx1 + m, x2[i]) - wx1;
      if (lo < hi)
        window_pass(xb, order.data(), lo, hi, NmsKeptBox<A>{x1[i], y1[i], x2[i], y2[i], area[i]},
                    static_cast<int32_t>(i + 1), threshold, alive.data(), alive_x.data());
    }
  };
  // The window pass is serial; it pays on large segments (measured: see docs/nms.md).
  auto run_segment = [&](int64_t begin, int64_t end, bool parallel) {
    if (threshold >= A(0) && end - begin >= kWindowMin)
      segment_windowed(begin, end);
    else
      segment(begin, end, parallel);
  };

  if (p.classes == nullptr) {
    run_segment(0, n, /*parallel=*/true);
  } else {
    std::vector<int64_t> starts;  // class segments of the scan order
    for (int64_t i = 0; i < n; ++i)
      if (i == 0 || p.classes[i] != p.classes[i - 1]) starts.push_back(i);
    starts.push_back(n);
    const int64_t segments = static_cast<int64_t>(starts.size()) - 1;
    if (segments == 1) {
      run_segment(0, n, true);
    } else if (n < kParallelSegmentBoxes) {
      for (int64_t s = 0; s < segments; ++s) run_segment(starts[s], starts[s + 1], false);
    } else {
      at::parallel_for(0, segments, 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) run_segment(starts[s], starts[s + 1], false);
      });
    }
  }

  std::vector<uint8_t> kept_by_score(n, 0);
  for (int64_t s = 0; s < n; ++s) kept_by_score[p.to_score_pos ? p.to_score_pos[s] : s] = alive[s];
  return kept_by_score;
}

std::vector<uint8_t> run_nms_cpu(const NmsPlan& plan) {
  return plan.params.dtype == DType::kFloat64 ? nms_cpu_kept<double>(plan) : nms_cpu_kept<float>(plan);
}

// Kept indices by decreasing score, written into `keep` from the start; returns their count.
int64_t write_kept(const std::vector<uint8_t>& kept, const at::Tensor& score_order, int64_t* keep) {
  const int64_t* order = score_order.const_data_ptr<int64_t>();
  int64_t count = 0;
  for (size_t pos = 0; pos < kept.size(); ++pos)
    if (kept[pos]) keep[count++] = order[pos];
  return count;
}

at::Tensor nms_impl(const char* op, const at::Tensor& boxes, const at::Tensor& scores,
                    const std::optional<at::Tensor>& idxs, double iou_threshold) {
  check_nms_inputs(op, boxes, scores, idxs, iou_threshold);
  const auto long_opts = boxes.options().dtype(at::kLong);
  if (boxes.size(0) == 0) return at::empty({0}, long_opts);
  const NmsPlan plan = plan_nms(boxes, scores, idxs, iou_threshold);
  const std::vector<uint8_t> kept = run_nms_cpu(plan);
  at::Tensor keep = at::empty({std::count(kept.begin(), kept.end(), uint8_t{1})}, long_opts);  // exact size
  write_kept(kept, plan.score_order, keep.data_ptr<int64_t>());
  return keep;
}

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  return nms_impl("opforge.nms", boxes, scores, std::nullopt, iou_threshold);
}

at::Tensor batched_nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                           double iou_threshold) {
  return nms_impl("opforge.batched_nms", boxes, scores, idxs, iou_threshold);
}

std::tuple<at::Tensor, at::Tensor> nms_padded_cpu(const at::Tensor& boxes, const at::Tensor& scores,
                                                  double iou_threshold,
                                                  const std::optional<at::Tensor>& idxs) {
  check_nms_inputs("opforge.nms_padded", boxes, scores, idxs, iou_threshold);
  const auto long_opts = boxes.options().dtype(at::kLong);
  at::Tensor keep = at::full({boxes.size(0)}, -1, long_opts);
  int64_t count = 0;
  if (boxes.size(0) > 0) {
    const NmsPlan plan = plan_nms(boxes, scores, idxs, iou_threshold);
    count = write_kept(run_nms_cpu(plan), plan.score_order, keep.data_ptr<int64_t>());
  }
  return {keep, at::full({}, count, long_opts)};
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("nms", &nms_cpu);
  m.impl("batched_nms", &batched_nms_cpu);
  m.impl("nms_padded", &nms_padded_cpu);
}

}  // namespace opforge
