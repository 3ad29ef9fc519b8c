// opforge::paged_kv_append: new tokens written into paged K/V caches, in place. Sequence b's new token
// i goes to position p = kv_lens[b] + i, that is row p % page_size of page block_table[b, p / page_size].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace opforge {

inline constexpr const char* kAppendOp = "opforge.paged_kv_append";

// The shapes, dtypes and devices (the Python wrapper's and fake kernel's checks, same words):
// k_cache, v_cache (num_pages, page_size, Hkv, D) of one float dtype; k, v (B, Hkv, S_new, D) in it;
// block_table (B, >= 1 pages) and kv_lens (B,) int32 / int64; everything on k_cache's device.
void check_paged_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& block_table, const at::Tensor& kv_lens);

}  // namespace opforge
