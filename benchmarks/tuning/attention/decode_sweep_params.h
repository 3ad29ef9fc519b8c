// Tuning only: the decode sweep's (decode_variants.cu) view of a call on contiguous
// bf16 q (B, Hq, 1, D 128) and k, v (B, Hkv, S, 128), causal, optional per-sequence key counts
// (`lens`: int64, kept alive by the caller), writing into out and lse; with `table` (int32 (B, pages a
// sequence)), k and v are paged caches (num_pages, page_size, Hkv, 128) and lens is required.
#pragma once

#include <torch/extension.h>

#include <cmath>

#include "attention/attention_params.h"

inline opforge::AttentionParams decode_sweep_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const at::Tensor& lens, at::Tensor& out, at::Tensor& lse,
                                                    const at::Tensor& table = at::Tensor()) {
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && q.scalar_type() == at::kBFloat16 &&
              q.size(3) == 128 && q.size(2) == 1);
  TORCH_CHECK(!table.defined() || (lens.defined() && table.scalar_type() == at::kInt && table.is_contiguous()));
  out = at::empty_like(q), lse = at::empty({q.size(0), q.size(1), 1}, q.options().dtype(at::kFloat));
  opforge::AttentionParams p;
  p.q = q.const_data_ptr(), p.k = k.const_data_ptr(), p.v = v.const_data_ptr();
  p.q_bs = q.stride(0), p.q_hs = q.stride(1), p.q_ss = q.stride(2);
  p.k_bs = k.stride(0), p.k_hs = k.stride(1), p.k_ss = k.stride(2);
  p.v_bs = v.stride(0), p.v_hs = v.stride(1), p.v_ss = v.stride(2);
  p.out = out.data_ptr(), p.o_bs = out.stride(0), p.o_hs = out.stride(1), p.o_ss = out.stride(2);
  p.lse = lse.data_ptr();
  p.batch = q.size(0), p.heads = q.size(1), p.kv_heads = k.size(1), p.head_dim = 128;
  p.dtype = opforge::DType::kBFloat16;
  p.scale = 1.0 / std::sqrt(128.0);
  p.pattern.sq = 1, p.pattern.sk = k.size(2), p.pattern.causal = true;
  if (lens.defined()) p.pattern.kv_lens = lens.const_data_ptr<int64_t>();
  if (table.defined()) {  // (pages: (num_pages, page_size, Hkv, D); a page's rows, then its heads)
    p.k_bs = k.stride(0), p.k_ss = k.stride(1), p.k_hs = k.stride(2);
    p.v_bs = v.stride(0), p.v_ss = v.stride(1), p.v_hs = v.stride(2);
    p.kv_heads = k.size(2);
    p.block_table = table.const_data_ptr<int32_t>();
    p.table_bs = table.size(1), p.page_size = k.size(1), p.num_pages = k.size(0);
    p.pattern.sk = table.size(1) * k.size(1);
  }
  return p;
}
