// opforge::paged_kv_append on CUDA: what the launcher (paged_append_cuda.cpp) hands the kernel
// (paged_append_kernel.cuh, instantiated in instantiations/attention_paged_append.cu), with no torch
// types.
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
  // Strides in elements: caches (page, row, head, dim); k, v (batch, head, token, dim); the table's
  // (batch, page) and kv_lens'.
  int64_t c_s[4] = {}, vc_s[4] = {}, k_s[4] = {}, v_s[4] = {};
  int64_t t_s0 = 0, t_s1 = 0, l_s0 = 0;
};

}  // namespace opforge
