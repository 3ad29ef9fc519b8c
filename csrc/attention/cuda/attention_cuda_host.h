// attention CUDA, host side: the helpers attention_cuda.cpp defines (namespace attention_host) that
// the FP8 entry (attention_fp8_cuda.cpp) shares with it.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

#include "attention/attention.h"
#include "attention/cuda/attention_cuda.h"

namespace opforge {
namespace attention_host {

// Varlen offsets checked on the host, except while the current stream is being captured into a
// CUDA graph: the rows in sequences ((total_q, total_k) without varlen), or nullopt while capturing.
std::optional<std::pair<int64_t, int64_t>> check_varlen_offsets_unless_capturing(
    const char* op, const AttentionPatternArgs& args, int64_t total_q, int64_t total_k);
// The kernels' per-32-row segment summaries of the plan's segment ids (held by plan.keep).
void add_segment_blocks(AttentionPlan& plan);
// The kernels' arguments from a plan's parameters (the scale's and softcap's factors, the SMs).
AttentionCudaArgs cuda_args(const AttentionParams& p);
// A RuntimeError naming op for a launch's error code (a build without code for the GPU, a failure).
void check_launch(const char* op, int err);

}  // namespace attention_host
}  // namespace opforge
