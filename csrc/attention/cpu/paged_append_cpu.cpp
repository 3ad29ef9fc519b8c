// opforge::paged_kv_append on the CPU: every token's place checked first (the first that cannot be
// written, in (sequence, token) order, is a ValueError naming why), then the rows copied in parallel.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "attention/paged_append.h"

namespace opforge {
namespace {

// (block_table, kv_lens: int64)
void place_tokens(const at::Tensor& block_table, const at::Tensor& kv_lens, int64_t s_new, int64_t pages,
                  int64_t page_size, std::vector<int64_t>& page, std::vector<int64_t>& row) {
  const int64_t batch = block_table.size(0), max_pages = block_table.size(1);
  const int64_t* table = block_table.const_data_ptr<int64_t>();
  const int64_t ts0 = block_table.stride(0), ts1 = block_table.stride(1);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t before = kv_lens.const_data_ptr<int64_t>()[b * kv_lens.stride(0)];
    for (int64_t i = 0; i < s_new; ++i) {
      const int64_t p = before + i;
      TORCH_CHECK_VALUE(before >= 0, kAppendOp, ": sequence ", b, "'s new token ", i, " goes to position ", p,
                        ": kv_lens[", b, "] = ", before, " is negative");
      const int64_t j = p / page_size;
      TORCH_CHECK_VALUE(j < max_pages, kAppendOp, ": sequence ", b, "'s new token ", i, " goes to position ",
                        p, ": past its block_table row (", max_pages, " pages x ", page_size, " positions)");
      const int64_t e = table[b * ts0 + j * ts1];
      TORCH_CHECK_VALUE(e >= 0 && e < pages, kAppendOp, ": sequence ", b, "'s new token ", i,
                        " goes to position ", p, ": block_table[", b, ", ", j, "] = ", e,
                        " is not a page of the caches (0 to ", pages - 1, ")");
      page[b * s_new + i] = e;
      row[b * s_new + i] = p % page_size;
    }
  }
}

template <typename T>
void copy_tokens(const at::Tensor& cache, const at::Tensor& src, const std::vector<int64_t>& page,
                 const std::vector<int64_t>& row) {
  const int64_t s_new = src.size(2), heads = src.size(1), dim = src.size(3);
  const int64_t tokens = src.size(0) * s_new;
  T* c = cache.data_ptr<T>();
  const T* s = src.const_data_ptr<T>();
  const int64_t c0 = cache.stride(0), c1 = cache.stride(1), c2 = cache.stride(2), c3 = cache.stride(3);
  const int64_t s0 = src.stride(0), s1 = src.stride(1), s2 = src.stride(2), s3 = src.stride(3);
  const bool rows = c3 == 1 && s3 == 1;  // (a head's D values contiguous on both sides: one memcpy)
  at::parallel_for(0, tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(heads * dim, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t t = begin; t < end; ++t) {
                       const int64_t b = t / s_new, i = t % s_new;
                       T* dst = c + page[t] * c0 + row[t] * c1;
                       const T* from = s + b * s0 + i * s2;
                       for (int64_t h = 0; h < heads; ++h) {
                         if (rows) {
                           std::memcpy(dst + h * c2, from + h * s1, sizeof(T) * dim);
                         } else {
                           for (int64_t d = 0; d < dim; ++d) dst[h * c2 + d * c3] = from[h * s1 + d * s3];
                         }
                       }
                     }
                   });
}

void paged_kv_append_cpu(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& block_table, const at::Tensor& kv_lens) {
  check_paged_append(k_cache, v_cache, k, v, block_table, kv_lens);
  const int64_t batch = k.size(0), s_new = k.size(2);
  if (batch == 0 || s_new == 0) return;
  const at::Tensor table = block_table.to(at::kLong), lens = kv_lens.to(at::kLong);
  std::vector<int64_t> page(batch * s_new), row(batch * s_new);
  place_tokens(table, lens, s_new, k_cache.size(0), k_cache.size(1), page, row);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, k_cache.scalar_type(), "paged_kv_append", [&] {
    copy_tokens<scalar_t>(k_cache, k, page, row);
    copy_tokens<scalar_t>(v_cache, v, page, row);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("paged_kv_append", &paged_kv_append_cpu);
}

}  // namespace opforge
