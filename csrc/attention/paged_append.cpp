#include "attention/paged_append.h"

#include <ATen/MemoryOverlap.h>

#include "common/checks.h"

namespace opforge {

void check_paged_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& block_table, const at::Tensor& kv_lens) {
  const char* op = kAppendOp;
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"k_cache", &k_cache},
                         {"v_cache", &v_cache},
                         {"k", &k},
                         {"v", &v},
                         {"block_table", &block_table},
                         {"kv_lens", &kv_lens}}) {
    check_defined(op, name, *t);
  }
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"k_cache", &k_cache},
                         {"v_cache", &v_cache},
                         {"k", &k},
                         {"v", &v}}) {
    TORCH_CHECK(t->dim() == 4, op, ": ", name, " must be 4-D, got ", t->dim(), "-D");
    check_same_device(op, name, *t, "k_cache", k_cache);
    check_same_dtype(op, name, *t, "k_cache", k_cache);
  }
  check_dtype_in(op, "k_cache", k_cache, {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble});
  TORCH_CHECK(k_cache.sizes().equals(v_cache.sizes()), op,
              ": k_cache and v_cache must have the same shape, got ", k_cache.sizes(), " and ",
              v_cache.sizes());
  TORCH_CHECK(k.sizes().equals(v.sizes()), op, ": k and v must have the same shape, got ", k.sizes(), " and ",
              v.sizes());
  const int64_t kv_heads = k_cache.size(2), head_dim = k_cache.size(3), batch = k.size(0);
  TORCH_CHECK(k.size(1) == kv_heads && k.size(3) == head_dim, op,
              ": k must be (batch, kv_heads, new tokens, head_dim) with the caches' kv_heads and head_dim (",
              kv_heads, ", ", head_dim, "), got ", k.sizes());
  for (auto [name, t] :
       {std::pair<const char*, const at::Tensor*>{"block_table", &block_table}, {"kv_lens", &kv_lens}}) {
    TORCH_CHECK(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong, op, ": ", name,
                " must be one of (int32, int64), got ", dtype_str(t->scalar_type()));
    check_same_device(op, name, *t, "k_cache", k_cache);
  }
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == batch && block_table.size(1) >= 1, op,
              ": block_table must be (batch, max_pages) = (", batch, ", >= 1), got shape ",
              block_table.sizes());
  TORCH_CHECK(kv_lens.dim() == 1 && kv_lens.size(0) == batch, op, ": kv_lens must be (batch,) = (", batch,
              ",), got shape ", kv_lens.sizes());
  TORCH_CHECK(k_cache.size(0) >= 1 && k_cache.size(1) >= 1, op, ": the caches have no pages, shape ",
              k_cache.sizes());
  for (auto [name, t] :
       {std::pair<const char*, const at::Tensor*>{"k_cache", &k_cache}, {"v_cache", &v_cache}}) {
    TORCH_CHECK(at::has_internal_overlap(*t) != at::MemOverlap::Yes, op, ": ", name,
                " has elements that share memory (an expanded or overlapping view); it cannot be written in "
                "place");
  }
}

}  // namespace opforge
