// attention CPU: the kernels' entries (attention_cpu_forward.cpp, _decode.cpp, _backward.cpp), each
// dispatching on its params' dtype; attention_cpu.cpp's ops call them. The kernels' shared helpers
// (attention_cpu_common.h) sit in namespace opforge::attention_cpu, as the CUDA kernels' sit in
// attention_cuda: the ops' file, whose op is the function attention_cpu(), does not include them.
#pragma once

#include "attention/attention_params.h"

namespace opforge {

// The tiled forward: out and lse of p.
void attention_cpu_forward(const AttentionParams& p);
// The decode kernel (few query rows against a long KV cache, paged or not): out and lse of p.
void attention_cpu_decode(const AttentionParams& p);
// The tiled backward: g's dq, dk and dv.
void attention_cpu_backward(const AttentionGradParams& g);

}  // namespace opforge
