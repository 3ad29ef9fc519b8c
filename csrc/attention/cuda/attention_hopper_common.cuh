// attention CUDA, Hopper kernels (sm_90a): what the forward and backward kernels share: on the
// host side the one-time setup that refuses a binary without their code and the TMA maps of the
// operands; on the device the epilogue that stores a warpgroup's accumulator rows.
#pragma once

#include <cuda.h>

#include "attention/cuda/attention_cuda.h"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/ptx.cuh"
#include "common/cuda/swizzle.cuh"
#include "common/cuda/tma.cuh"

namespace opforge {
namespace attention_cuda {

// A warpgroup's 64 x kD accumulator (wgmma layout: warp w holds rows 16 w .. 16 w + 15, thread
// (g, t4) rows g and g + 8, columns 8 n + 2 t4 and + 1), times scale[r] for the thread's row r,
// stored as T to global rows first .. first + 63 (those at or past `end` skipped) of dst (row
// stride ld elements, rows 16-byte aligned). It goes through the warpgroup's own 64 rows of a
// 128-byte-swizzled tile in shared memory (`rows`; 64-column panels panel_bytes apart, free once
// the warpgroup's last wgmma is done), so that each lane stores 16 bytes: a warp writes whole
// rows instead of 16-byte pieces of eight. barrier: a named barrier id for the warpgroup alone.
template <int kD, typename T>
__device__ __forceinline__ void store_accumulator_rows(const float (&acc)[kD / 8][4], const float (&scale)[2],
                                                       unsigned char* rows, int panel_bytes, T* dst,
                                                       int64_t ld, int64_t first, int64_t end, int t,
                                                       int barrier) {
  const int warp = t / 32, lane = t % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + 8 * r, pn = n / 8, chunk = n % 8;
      cuda::st_shared_u32(cuda::smem_addr(rows + pn * panel_bytes + row * 128 +
                                          cuda::swizzle128_chunk(row, chunk) * 16 + t4 * 4),
                          cuda::pack2<T>(acc[n][2 * r] * scale[r], acc[n][2 * r + 1] * scale[r]));
    }
  }
  cuda::named_barrier_sync<128>(barrier);
  constexpr int kChunks = kD / 8;
#pragma unroll 4
  for (int idx = t; idx < 64 * kChunks; idx += 128) {
    const int row = idx / kChunks, c = idx % kChunks, pn = c / 8, chunk = c % 8;
    if (first + row < end) {
      const uint4 v = *reinterpret_cast<const uint4*>(rows + pn * panel_bytes + row * 128 +
                                                      cuda::swizzle128_chunk(row, chunk) * 16);
      *reinterpret_cast<uint4*>(dst + (first + row) * ld + c * 8) = v;
    }
  }
}

// padded_tile for a tile every lane of the (converged) warp asks about: the sequence found by a
// 32-way search, one round of loads for 32 sequences (two for 1024) instead of a binary search's
// chain of dependent loads. Offsets a valid partition: the same answer as padded_tile.
__device__ __forceinline__ bool padded_tile_warp(const int32_t* cu, int64_t total, int64_t batch,
                                                 int64_t rows, int64_t tile, int64_t& b, int64_t& local) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = tile * rows;
  if (batch <= 0 || padded_start(cu, total, 0, rows) > row) return false;
  int64_t lo = 0,
          n = batch;  // the last sequence starting at or before `row` is in [lo, lo + n); lo's starts there
  while (n > 1) {
    const int64_t stride = (n + 31) / 32, idx = lo + lane * stride;
    const bool before = idx < lo + n && padded_start(cu, total, idx, rows) <= row;
    const int last =
        31 - __clz(static_cast<int>(__ballot_sync(0xffffffffu, before)));  // (lane 0's is lo: set)
    const int64_t end = lo + n;
    lo += last * stride;
    n = min(stride, end - lo);
  }
  b = lo;
  local = (row - padded_start(cu, total, lo, rows)) / rows;
  const int64_t q0 = AttentionPattern::clamp_row(cu[lo], total),
                q1 = AttentionPattern::clamp_row(cu[lo + 1], total);
  return local * rows < q1 - q0;
}

// Raises the kernel's shared-memory limit once; refuses a binary without its sm_90a code
// (cudaErrorNoKernelImageForDevice: the trap-only stand-in of another build uses a handful of
// registers, the kernels 128 or more).
template <typename Kernel>
cudaError_t prepare_hopper(Kernel kernel, int smem_bytes, signed char (&state)[64]) {
  const cudaError_t err = cuda::configure_once(kernel, smem_bytes, state, [](const cudaFuncAttributes& f) {
    return f.ptxVersion >= 90 && f.numRegs >= 64;
  });
  return err == cudaErrorInvalidConfiguration ? cudaErrorNoKernelImageForDevice : err;
}

// 4-D maps (head dim, sequence, heads, batch; varlen: the packed sequences in a batch of one) of q, k, v (and
// grad_out, when mdo is given) in boxes of 128 bytes (64 16-bit or 128 float8 columns) x q_rows / kv_rows
// rows, for the kernel's head dims d (q, k) and dv (v, grad_out): operands narrower than those
// (p.head_dim, p.head_dim_v) are mapped at their own width, and TMA reads the columns past it as
// zeros; false where TMA cannot address an operand.
inline bool make_attention_maps(const AttentionCudaArgs& a, int d, int dv, uint32_t q_rows, uint32_t kv_rows,
                                CUtensorMap* mq, CUtensorMap* mk, CUtensorMap* mv,
                                CUtensorMap* mdo = nullptr) {
  const AttentionParams& p = a.g.fwd;
  // (Varlen: the packed dims of the tensors' one batch row. A paged cache (the forward's): K and V
  // as (D, page_size, Hkv, num_pages), boxes of min(page_size, kv_rows) rows: fwd_load_kv_tile.)
  const int64_t sq = p.pattern.sq, nb = p.pattern.varlen() ? 1 : p.batch;
  const bool paged = p.block_table != nullptr;
  const int64_t sk = paged ? p.page_size : p.pattern.sk, kv_nb = paged ? p.num_pages : nb;
  const uint32_t kv_box = paged && p.page_size < kv_rows ? static_cast<uint32_t>(p.page_size) : kv_rows;
  const uint32_t box = p.dtype == DType::kFloat8E4M3 ? 128 : 64;
  if (paged && (mdo != nullptr || !attention_hopper_fwd_pages_at(p.page_size, kv_rows))) return false;
  const int64_t cols = std::min<int64_t>(p.head_dim > 0 ? p.head_dim : d, d);
  const int64_t cols_v = std::min<int64_t>(p.head_dim_v > 0 ? p.head_dim_v : dv, dv);
  return cuda::make_tma_map_4d(mq, p.q, p.dtype, sq, cols, p.heads, nb, p.q_ss, p.q_hs, p.q_bs, box,
                               q_rows) &&
         cuda::make_tma_map_4d(mk, p.k, p.dtype, sk, cols, p.kv_heads, kv_nb, p.k_ss, p.k_hs, p.k_bs, box,
                               kv_box) &&
         cuda::make_tma_map_4d(mv, p.v, p.dtype, sk, cols_v, p.kv_heads, kv_nb, p.v_ss, p.v_hs, p.v_bs, box,
                               kv_box) &&
         (mdo == nullptr || cuda::make_tma_map_4d(mdo, a.g.grad_out, p.dtype, sq, cols_v, p.heads, nb,
                                                  a.g.g_ss, a.g.g_hs, a.g.g_bs, box, q_rows));
}

}  // namespace attention_cuda
}  // namespace opforge
