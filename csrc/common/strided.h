// Torch-free description of an elementwise iteration space over several operands
// ("geometry"), and the dimension collapsing shared by the CPU and CUDA kernels.
#pragma once

#include <algorithm>
#include <cstdint>

namespace opforge {

// Enough for any collapsed layout we meet in practice; more dims fall back to a copy.
constexpr int kMaxDims = 8;

template <int NumOperands>
struct Geometry {
  int ndim = 0;  // 0 means a single element
  int64_t numel = 1;
  int64_t sizes[kMaxDims] = {};
  // strides[operand][dim], in elements (plain arrays: the struct is passed to CUDA kernels by value)
  int64_t strides[NumOperands][kMaxDims] = {};

  // True when every operand walks the same dense, contiguous range: one flat loop serves.
  // Largest element offset operand `op` reaches (for choosing 32-bit indexing).
  int64_t max_offset(int op) const {
    int64_t off = 0;
    for (int d = 0; d < ndim; ++d) off += (sizes[d] - 1) * strides[op][d];
    return off;
  }

  bool is_flat() const {
    if (ndim == 0) return true;
    if (ndim != 1) return false;
    for (int op = 0; op < NumOperands; ++op)
      if (strides[op][0] != 1) return false;
    return true;
  }
};

// Builds a geometry from sizes and per-operand strides (operand 0 is the output): size-1
// dims are dropped, dims are ordered by the output's strides (outermost first), and
// neighbouring dims that every operand walks contiguously are merged. Returns false when
// more than kMaxDims dims remain.
template <int NumOperands>
bool make_geometry(int ndim, const int64_t* sizes, const int64_t* const* strides, Geometry<NumOperands>& g) {
  constexpr int kMaxInputDims = 64;  // more dims: the caller's fallback (a copy into one layout)
  g = Geometry<NumOperands>{};
  if (ndim > kMaxInputDims) return false;
  for (int d = 0; d < ndim; ++d) g.numel *= sizes[d];
  if (g.numel == 0) {  // nothing to iterate; callers return early
    g.ndim = 1;
    g.sizes[0] = 0;
    for (int op = 0; op < NumOperands; ++op) g.strides[op][0] = 1;
    return true;
  }

  // Dims that matter, ordered by the output's stride, largest first (stable: ties keep order).
  int order[kMaxInputDims];
  int n = 0;
  for (int d = 0; d < ndim; ++d)
    if (sizes[d] != 1) order[n++] = d;
  std::stable_sort(order, order + n, [&](int x, int y) { return strides[0][x] > strides[0][y]; });

  int m = 0;
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    if (m > 0) {
      // Merge into the previous (outer) dim when every operand steps through both as one.
      bool mergeable = true;
      for (int op = 0; op < NumOperands; ++op)
        mergeable = mergeable && g.strides[op][m - 1] == strides[op][d] * sizes[d];
      if (mergeable) {
        g.sizes[m - 1] *= sizes[d];
        for (int op = 0; op < NumOperands; ++op) g.strides[op][m - 1] = strides[op][d];
        continue;
      }
    }
    if (m == kMaxDims) return false;
    g.sizes[m] = sizes[d];
    for (int op = 0; op < NumOperands; ++op) g.strides[op][m] = strides[op][d];
    ++m;
  }
  g.ndim = m;
  return true;
}

}  // namespace opforge
