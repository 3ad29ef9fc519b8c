// attention CUDA: segment ids as documents, for the persistent Hopper forward's segment-runs form
// (HopperFwdForm::segment_runs). One block scans the (B, S) ids once per call on the device (no host
// sync: CUDA graphs capture it) and writes, into ws: [0] 1 where q's ids equal kv's and never
// decrease along a batch row (each id is then one contiguous run of rows: a document, and attending
// within runs is attending by segment), else 0; [1] the runs' count R; [2, 2 + R] their offsets into
// the B x S rows, R + 1 of them (a run never spans two batch rows: each row's first position starts
// one).
#pragma once

#include <cub/block/block_scan.cuh>

#include "attention/cuda/attention_cuda.h"

namespace opforge {
namespace attention_cuda {

// kThreads threads, kItems ids a thread per round (8: 64 contiguous bytes).
template <int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads)
    segment_runs_kernel(const int64_t* q, const int64_t* kv, int64_t q_bs, int64_t kv_bs, int64_t batch,
                        int64_t seq, int32_t* ws) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  int32_t* const cu = ws + 2;
  const int64_t n = batch * seq;
  int runs = 0;  // the runs before this round (the same in every thread)
  int ok = 1;
  for (int64_t base = 0; base < n; base += int64_t{kThreads} * kItems) {
    const int64_t first = base + int64_t{threadIdx.x} * kItems;
    int64_t b = first / seq, s = first % seq;
    uint32_t starts = 0;
#pragma unroll
    for (int e = 0; e < kItems; ++e) {
      if (first + e < n) {
        const int64_t id = q[b * q_bs + s];
        ok &= id == kv[b * kv_bs + s];
        bool start = s == 0;
        if (!start) {
          const int64_t prev = q[b * q_bs + s - 1];
          ok &= prev <= id;
          start = prev != id;
        }
        starts |= static_cast<uint32_t>(start) << e;
      }
      if (++s == seq) s = 0, ++b;
    }
    int offset = 0, round = 0;
    Scan(scan_storage).ExclusiveSum(__popc(starts), offset, round);
#pragma unroll
    for (int e = 0; e < kItems; ++e) {
      if ((starts >> e) & 1u) cu[runs + offset++] = static_cast<int32_t>(first + e);
    }
    runs += round;
    __syncthreads();  // (the scan's storage is used again)
  }
  ok = __syncthreads_and(ok);
  if (threadIdx.x == 0) {
    cu[runs] = static_cast<int32_t>(n);
    ws[1] = runs;
    ws[0] = ok;
  }
}

// The scan of p's segment ids into ws (p.batch * p.pattern.sq + 3 int32s). (A template: only the
// translation units that launch it hold the kernel.)
template <int kThreads = 1024, int kItems = 8>
cudaError_t launch_segment_runs(const AttentionParams& p, int32_t* ws, cudaStream_t stream) {
  const AttentionPattern& pat = p.pattern;
  if (ws == nullptr || pat.q_segments == nullptr || pat.kv_segments == nullptr || pat.sq != pat.sk)
    return cudaErrorInvalidValue;
  segment_runs_kernel<kThreads, kItems><<<1, kThreads, 0, stream>>>(
      pat.q_segments, pat.kv_segments, pat.q_seg_bs, pat.kv_seg_bs, p.batch, pat.sq, ws);
  return cudaGetLastError();
}

}  // namespace attention_cuda
}  // namespace opforge
