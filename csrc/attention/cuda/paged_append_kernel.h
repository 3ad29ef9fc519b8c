// opforge::paged_kv_append on CUDA: what the launcher (paged_append_cuda.cpp) hands the kernel
// (paged_append_kernel.cu), with no torch types.
#pragma once

#include <cstdint>

namespace opforge {

struct PagedAppendParams {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* block_table = nullptr;  // (batch, max_pages), int32 or int64 (table_64)
  const void* kv_lens = nullptr;      // (batch,), int32 or int64 (lens_64)
  bool table_64 = false, lens_64 = false;
  int64_t batch = 0, s_new = 0, kv_heads = 0, head_dim = 0, pages = 0, page_size = 0, max_pages = 0;
  int elem_bytes = 2;  // 2, 4 or 8
  // Strides in elements: caches (page, row, head, dim); k, v (batch, head, token, dim); the table's
  // (batch, page) and kv_lens'.
  int64_t c_s[4] = {}, vc_s[4] = {}, k_s[4] = {}, v_s[4] = {};
  int64_t t_s0 = 0, t_s1 = 0, l_s0 = 0;
};

// One block a new token: its place looked up on the device (nothing read on the host), a token
// whose place is not in the table (a negative position, past the table's row, a page outside
// the caches) written nowhere; its kv heads' rows copied in 16-byte pieces where every row allows.
// Returns a cudaError_t.
int run_paged_kv_append_cuda(const PagedAppendParams& p, void* stream);

}  // namespace opforge
