// attention CUDA forward for Hopper: the host side: the kernels' one-time setup, their grids and
// schedules, run_hopper_fwd (the generated instantiations' entry).
#pragma once

#include "attention/cuda/attention_fwd_hopper_persistent.cuh"
#include "attention/cuda/attention_segment_runs.cuh"

namespace opforge {
namespace attention_cuda {

// The kernel's one-time setup on the current device (prepare_hopper).
template <typename Tr, typename T>
cudaError_t prepare_hopper_fwd() {
  static signed char state[64] = {};
  return prepare_hopper(attention_fwd_hopper_kernel<Tr, T>, Tr::kSmemBytes, state);
}

// cudaSuccess where this binary runs the Hopper kernels on the current GPU, else
// cudaErrorNoKernelImageForDevice (every Hopper kernel is built for the same arches, so one stands
// for all).
template <typename Tr>
int hopper_status() {
  return prepare_hopper_fwd<Tr, __nv_bfloat16>();
}

// (batch row, head) pairs a group of the dense forward's order: where blocks see different numbers
// of keys (a band), as many as have their K and V (shared by a GQA group's heads) within about a
// third of the H100 / H200's 50 MB L2, so that each group's longest blocks start first; else one (the
// longest-first order gains nothing and more pairs at once would share L2 among more K and V).
template <typename Tr>
int fwd_group_pairs(const AttentionParams& p) {
  const AttentionPattern& pat = p.pattern;
  const int64_t pairs = p.batch * p.heads;
  const int64_t pair_bytes =
      pat.sk * (Tr::kD + Tr::kDV) * Tr::kElemBytes / std::max<int64_t>(p.heads / p.kv_heads, 1);
  const int64_t fit = pat.has_band() ? (int64_t{16} << 20) / std::max<int64_t>(pair_bytes, 1) : 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pairs, fit)));
}

// The one-item kernels' grid (fwd_block_item reads it with group_pairs); false where it is too large.
template <typename Tr>
bool fwd_item_grid(const AttentionParams& p, dim3& grid, int& group_pairs) {
  const AttentionPattern& pat = p.pattern;
  group_pairs = 0;
  if (pat.varlen()) {
    int64_t x, z;
    tile_grid(p, false, Tr::kBlockM, x, z);
    if (x > 0x7fffffff) return false;
    grid = dim3(static_cast<unsigned>(x), static_cast<unsigned>(p.heads), static_cast<unsigned>(z));
    return true;
  }
  const int64_t pairs = p.batch * p.heads, blocks = (pat.sq + Tr::kBlockM - 1) / Tr::kBlockM;
  if (pairs * blocks > 0x7fffffff) return false;
  group_pairs = fwd_group_pairs<Tr>(p);
  grid = dim3(static_cast<unsigned>(pairs * blocks));
  return true;
}

// A one-item kernel of traits Tr (the 16-bit one, the FP8 one) on its maps and grid, set up already
// (prepare_hopper).
template <typename Tr, typename Kernel>
cudaError_t launch_fwd_items(Kernel kernel, const AttentionCudaArgs& a, cudaStream_t stream) {
  CUtensorMap mq, mk, mv;
  if (!make_attention_maps(a, Tr::kD, Tr::kDV, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv))
    return cudaErrorInvalidValue;
  dim3 grid;
  int group_pairs = 0;
  if (!fwd_item_grid<Tr>(a.g.fwd, grid, group_pairs)) return cudaErrorInvalidValue;
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, a, group_pairs);
  return cudaGetLastError();
}

template <typename Tr, typename T>
cudaError_t launch_hopper_fwd(const AttentionCudaArgs& a, cudaStream_t stream) {
  const cudaError_t err = prepare_hopper_fwd<Tr, T>();
  if (err != cudaSuccess) return err;
  return launch_fwd_items<Tr>(attention_fwd_hopper_kernel<Tr, T>, a, stream);
}

// kRuns: the form that reads segment ids' runs (a.seg_runs, written by launch_segment_runs first; its
// walk's state spills a little at item boundaries), else without that code.
template <typename Tr, typename T, bool kRuns>
cudaError_t launch_hopper_fwd_persistent(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  cudaError_t err =
      prepare_hopper(attention_fwd_hopper_persistent_kernel<Tr, T, kRuns>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  if (a.fwd_counter == nullptr) return cudaErrorInvalidValue;
  CUtensorMap mq, mk, mv;
  if (!make_attention_maps(a, Tr::kD, Tr::kDV, Tr::kBlockM, Tr::kBlockN, &mq, &mk, &mv))
    return cudaErrorInvalidValue;
  const AttentionParams& p = a.g.fwd;
  const AttentionPattern& pat = p.pattern;
  FwdSchedule sched;
  sched.counter = a.fwd_counter;
  sched.runs = a.seg_runs;
  sched.run_rows = pat.sq;
  if (pat.varlen()) {  // (the padded tiles of the packed queries, a head at a time)
    int64_t x, z;
    tile_grid(p, false, Tr::kBlockM, x, z);
    sched.blocks = x, sched.total = x * p.heads;
  } else {
    sched.blocks = (pat.sq + Tr::kBlockM - 1) / Tr::kBlockM, sched.total = p.batch * p.heads * sched.blocks;
    sched.group_pairs = fwd_group_pairs<Tr>(p);
  }
  // (items and the counter's values, up to items + blocks, in an int)
  if (sched.total > 0x7fffffff - (1 << 20)) return cudaErrorInvalidValue;
  if (sched.total == 0) return cudaSuccess;
  static int per_sm[64] = {};
  unsigned int blocks = 0;
  const auto kernel = attention_fwd_hopper_persistent_kernel<Tr, T, kRuns>;
  // (with runs the device's items may outnumber the host's count: a grid of their most, if fewer
  // than the GPU holds)
  const int64_t items =
      kRuns ? std::max(sched.total, hopper_fwd_run_items(p.batch, pat.sq, p.heads)) : sched.total;
  err = cuda::resident_grid(kernel, Tr::kThreads, Tr::kSmemBytes, items, a.num_sms, per_sm, blocks);
  if (err != cudaSuccess) return err;
  kernel<<<blocks, Tr::kThreads, Tr::kSmemBytes, stream>>>(mq, mk, mv, a, sched);
  return cudaGetLastError();
}

// The forward of traits Tr (its persistent form where Tr::kPersistent; kRuns: the segment runs'
// form, which first scans the segment ids into a.seg_runs) at the call's dtype.
template <typename Tr, bool kRuns = false>
int run_hopper_fwd(const AttentionCudaArgs& a, void* stream) {
  static_assert(Tr::kPersistent || !kRuns, "segment runs are the persistent form's");
  const auto s = static_cast<cudaStream_t>(stream);
  const DType dtype = a.g.fwd.dtype;
  if constexpr (Tr::kPersistent) {
    if constexpr (kRuns) {
      const cudaError_t err = launch_segment_runs(a.g.fwd, a.seg_runs, s);
      if (err != cudaSuccess) return err;
    }
    if (dtype == DType::kBFloat16) return launch_hopper_fwd_persistent<Tr, __nv_bfloat16, kRuns>(a, s);
    if (dtype == DType::kFloat16) return launch_hopper_fwd_persistent<Tr, __half, kRuns>(a, s);
  } else {
    if (dtype == DType::kBFloat16) return launch_hopper_fwd<Tr, __nv_bfloat16>(a, s);
    if (dtype == DType::kFloat16) return launch_hopper_fwd<Tr, __half>(a, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attention_cuda
}  // namespace opforge
