// torch.ops.opforge._attention_form (schema in registration.cpp): the kernel a call gets and, on the
// Hopper kernels, which form of them (attention_heuristics.h: the same HopperFwdForm / HopperBwdForm
// the CUDA launcher computes, from the call's sizes and pattern), by name: "tiled", "decode",
// "mma_sync", "hopper", "hopper/mask", "hopper/cache", "hopper/cache_mask", "hopper/persistent",
// "hopper/persistent_runs", "hopper/deterministic".
#include <ATen/Context.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "attention/attention.h"
#include "attention/attention_heuristics.h"

namespace opforge {
namespace {

std::string attention_form_op(at::Device device, int64_t heads, int64_t kv_heads, int64_t sq, int64_t sk,
                              int64_t head_dim, bool kv_lens, c10::string_view variant, bool backward,
                              int64_t batch, int64_t page_size, bool causal, int64_t window_left,
                              int64_t window_right, int64_t prefix_len, bool segments, bool block_mask,
                              bool varlen, std::optional<bool> deterministic) {
  constexpr const char* op = "opforge._attention_form";
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(), op, ": no kernels on ", device);
  TORCH_CHECK_VALUE(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && sq >= 0 && sk >= 0 &&
                        head_dim > 0 && batch > 0 && page_size >= 0,
                    op, ": needs heads a multiple of kv_heads (both > 0), sizes >= 0, batch > 0, got heads ",
                    heads, ", kv_heads ", kv_heads, ", sq ", sq, ", sk ", sk, ", head_dim ", head_dim,
                    ", batch ", batch, ", page_size ", page_size);
  AttentionCall call;
  call.cuda = device.is_cuda();
  call.heads = heads, call.kv_heads = kv_heads, call.sq = sq, call.sk = sk, call.head_dim = head_dim;
  call.kv_lens = kv_lens || page_size > 0;
  // (CUDA reads pages in place at its kernels' head dims 64 / 128 / 256 only: other calls run on the
  // gathered pages, where the page size does not count; attention_paged_cuda)
  call.page_size = call.cuda && attention_cuda_head_dim(head_dim) != head_dim ? 0 : page_size;
  call.backward = backward;
  call.varlen = varlen;
  if (call.cuda) call.hopper_missing = attention_hopper_missing(device);
  const AttentionKernel kernel =
      choose_attention_kernel(backward ? "opforge.attention_backward" : "opforge.attention", call, variant);
  if (kernel != AttentionKernel::kHopper) return attention_kernel_name(kernel);
  call.batch = batch;
  call.window_left = window_left;
  call.band_right = causal ? 0 : window_right;
  call.prefix_len = prefix_len;
  call.segments = segments;
  call.block_mask = block_mask;
  call.deterministic = deterministic.value_or(at::globalContext().deterministicAlgorithms());
  return backward ? hopper_bwd_form(call).name() : hopper_fwd_form(call).name();
}

}  // namespace
}  // namespace opforge

// (no tensor argument: one kernel serves every dispatch key)
TORCH_LIBRARY_IMPL(opforge, CompositeExplicitAutograd, m) {
  m.impl("_attention_form", &opforge::attention_form_op);
}
