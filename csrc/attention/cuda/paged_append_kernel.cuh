// opforge::paged_kv_append's CUDA kernel: one block a new token, its place looked up on the device
// (nothing read on the host), a token whose place is not in the table (a negative position, past the
// table's row, a page outside the caches) written nowhere; its kv heads' rows copied in 16-byte pieces
// where every row allows. run_paged_append<kElemBytes> returns a cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention/cuda/paged_append_kernel.h"

namespace opforge {
namespace attention_cuda {

constexpr int kAppendThreads = 128;

__device__ __forceinline__ int64_t read_index(const void* base, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
}

// Copies one token's kv heads (kv_heads rows of `units` pieces of U) from src into dst.
template <typename U>
__device__ __forceinline__ void copy_rows(U* dst, const U* src, int64_t dst_head, int64_t src_head,
                                          int64_t dst_unit, int64_t src_unit, int64_t kv_heads,
                                          int64_t units) {
  for (int64_t e = threadIdx.x; e < kv_heads * units; e += kAppendThreads) {
    const int64_t h = e / units, u = e % units;
    dst[h * dst_head + u * dst_unit] = src[h * src_head + u * src_unit];
  }
}

// U: the piece copied (uint4 where every row is contiguous and 16-byte aligned, else the element's
// own width); strides in elements (kElemBytes each), converted to pieces by `per` (elements a piece).
template <int kElemBytes, typename U>
__global__ void __launch_bounds__(kAppendThreads) paged_kv_append_kernel(const PagedAppendParams p, int per) {
  const int64_t t = blockIdx.x, b = t / p.s_new, i = t % p.s_new;
  const int64_t before = read_index(p.kv_lens, p.lens_64, b * p.l_s0);
  const int64_t pos = before + i;
  if (pos < 0) return;
  const int64_t j = pos / p.page_size;
  if (j >= p.max_pages) return;
  const int64_t page = read_index(p.block_table, p.table_64, b * p.t_s0 + j * p.t_s1);
  if (page < 0 || page >= p.pages) return;
  const int64_t row = pos % p.page_size, units = p.head_dim / per;
  // (byte offsets: the strides are in elements)
  auto at = [&](const void* base, int64_t off) {
    return reinterpret_cast<const U*>(static_cast<const char*>(base) + off * kElemBytes);
  };
  U* kd = const_cast<U*>(at(p.k_cache, page * p.c_s[0] + row * p.c_s[1]));
  U* vd = const_cast<U*>(at(p.v_cache, page * p.vc_s[0] + row * p.vc_s[1]));
  const U* ks = at(p.k, b * p.k_s[0] + i * p.k_s[2]);
  const U* vs = at(p.v, b * p.v_s[0] + i * p.v_s[2]);
  // (pieces: a head's stride in pieces when per > 1 is exact: the launcher checked it)
  copy_rows(kd, ks, p.c_s[2] / per, p.k_s[1] / per, per > 1 ? 1 : p.c_s[3], per > 1 ? 1 : p.k_s[3],
            p.kv_heads, units);
  copy_rows(vd, vs, p.vc_s[2] / per, p.v_s[1] / per, per > 1 ? 1 : p.vc_s[3], per > 1 ? 1 : p.v_s[3],
            p.kv_heads, units);
}

template <int kElemBytes, typename U>
cudaError_t launch_paged_append(const PagedAppendParams& p, int per, cudaStream_t stream) {
  paged_kv_append_kernel<kElemBytes, U>
      <<<static_cast<unsigned>(p.batch * p.s_new), kAppendThreads, 0, stream>>>(p, per);
  return cudaGetLastError();
}

// Whether every row (the caches', k's and v's) is contiguous and 16-byte aligned, and each head's
// stride a whole number of 16-byte pieces.
inline bool rows_in_pieces(const PagedAppendParams& p, int elem_bytes) {
  const int64_t per = 16 / elem_bytes;
  if ((p.head_dim * elem_bytes) % 16 != 0) return false;
  const void* bases[4] = {p.k_cache, p.v_cache, p.k, p.v};
  const int64_t* strides[4] = {p.c_s, p.vc_s, p.k_s, p.v_s};
  for (int n = 0; n < 4; ++n) {
    if (reinterpret_cast<uintptr_t>(bases[n]) % 16 != 0 || strides[n][3] != 1) return false;
    for (int d = 0; d < 3; ++d) {
      if (strides[n][d] % per != 0) return false;
    }
  }
  return true;
}

template <int kElemBytes>
int run_paged_append(const PagedAppendParams& p, void* stream) {
  static_assert(kElemBytes == 2 || kElemBytes == 4 || kElemBytes == 8);
  using Elem =
      std::conditional_t<kElemBytes == 2, uint16_t, std::conditional_t<kElemBytes == 4, uint32_t, uint64_t>>;
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.batch * p.s_new == 0) return cudaSuccess;
  if (p.batch * p.s_new > 0x7fffffff) return cudaErrorInvalidValue;
  if (rows_in_pieces(p, kElemBytes)) return launch_paged_append<kElemBytes, uint4>(p, 16 / kElemBytes, st);
  return launch_paged_append<kElemBytes, Elem>(p, 1, st);
}

}  // namespace attention_cuda
}  // namespace opforge
