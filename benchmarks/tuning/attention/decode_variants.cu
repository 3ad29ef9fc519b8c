// Tuning only (benchmarks/tuning/attention/decode_variants.py builds it with torch's JIT): the tensor-core
// decode kernel (csrc/attention/cuda/attention_decode_kernel.cuh) at other staging depths and chunk
// counts than the shipped ones, on contiguous bf16 q (B, Hq, 1, D) and k, v (B, Hkv, S, D), causal,
// optional per-sequence key counts. Not part of the product.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "decode_sweep_params.h"

#include "attention/cuda/attention_decode_kernel.cuh"

namespace {

using opforge::AttentionCudaArgs;
using opforge::DecodeSplit;

// The sweep's own traits type: kernels of this module must not share a mangled name with those of
// opforge._C, loaded in the same process (the two-stage variant, named like the shipped kernel,
// failed to launch with "invalid argument" when it did).
template <int kStages>
struct SweepTraits : opforge::attention_cuda::DecodeMmaTraits<128, kStages> {};

template <int kStages>
int launch(const AttentionCudaArgs& a, const DecodeSplit& s, cudaStream_t st) {
  using Tr = SweepTraits<kStages>;
  return opforge::attention_cuda::launch_decode_mma<Tr, __nv_bfloat16>(a, s, st);
}

// out, lse; `chunks` blocks a (batch, kv head), `stages` K/V stages.
std::vector<at::Tensor> run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& kv_lens, int64_t stages, int64_t chunks) {
  at::Tensor out, lse, lens = kv_lens ? kv_lens->to(at::kLong).contiguous() : at::Tensor();
  const opforge::AttentionParams p = decode_sweep_params(q, k, v, lens, out, lse);
  DecodeSplit s;
  s.rows = static_cast<int>(p.heads / p.kv_heads);
  TORCH_CHECK(s.rows <= opforge::kDecodeMmaRows);
  s.chunks = static_cast<int>(chunks);
  at::Tensor part = at::empty({p.batch * p.kv_heads * s.chunks * s.rows * opforge::decode_part_stride(128)}, q.options().dtype(at::kFloat));
  s.part = part.data_ptr<float>();
  AttentionCudaArgs a;
  a.g.fwd = p;
  set_scale_args(a, p.scale, p.softcap);
  const cudaStream_t st = at::cuda::getCurrentCUDAStream().stream();
  (void)cudaGetLastError();  // (an earlier call's error is not this launch's)
  int err = stages == 2 ? launch<2>(a, s, st) : stages == 3 ? launch<3>(a, s, st) : launch<4>(a, s, st);
  TORCH_CHECK(err == 0, "launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {out, lse};
}

int blocks_per_sm(int64_t stages, int64_t rows) {
  int n = 0;
  const auto occ = [&](auto tr) {
    using Tr = decltype(tr);
    cudaError_t e = opforge::attention_cuda::configure_decode_mma<Tr, __nv_bfloat16>();
    TORCH_CHECK(e == cudaSuccess, "configure (", Tr::smem_bytes(), " bytes): ", cudaGetErrorString(e));
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, opforge::attention_cuda::attention_decode_mma_kernel<Tr, __nv_bfloat16>,
                                                      opforge::attention_cuda::kDecodeThreads, Tr::smem_bytes());
    TORCH_CHECK(e == cudaSuccess, "occupancy: ", cudaGetErrorString(e));
  };
  using namespace opforge::attention_cuda;
  if (stages == 2) occ(SweepTraits<2>{});
  else if (stages == 3) occ(SweepTraits<3>{});
  else occ(SweepTraits<4>{});
  return n;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run);
  m.def("blocks_per_sm", &blocks_per_sm);
}
