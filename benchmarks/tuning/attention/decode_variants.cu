// Tuning only (benchmarks/tuning/attention/decode_variants.py builds it with torch's JIT): the tensor-core
// decode kernel (csrc/attention/cuda/attention_decode_kernel.cuh) at other traits (staging depth, blocks
// an SM) and splits (uniform chunk counts; the tokens-present split's waves) than
// the shipped ones, on contiguous bf16 q (B, Hq, 1, D 128) and k, v (B, Hkv, S, D), causal, optional
// per-sequence key counts, contiguous or paged caches (a block table). Not part of the product.
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
template <int kStages, int kMinBlocks>
struct SweepTraits : opforge::attention_cuda::DecodeMmaTraits<128, kStages, 1, kMinBlocks> {};

// variant: 0 (2 stages, 3 blocks: the shipped contiguous and paged kernel at head dim 128), 1 (3
// stages, 2 blocks: the paged kernel before edd7f5d). (The copies without the L2 hint, measured
// against it at edd7f5d, are in git there.)
template <typename F>
auto with_variant(int64_t variant, F&& f) {
  switch (variant) {
    case 0:
      return f(SweepTraits<2, 3>{});
    default:
      return f(SweepTraits<3, 1>{});
  }
}

// out, lse. chunks > 0: the uniform split with that many chunks a (batch, kv head) (kv_lens must be
// absent); waves > 0 (kv_lens): the tokens-present split aiming at waves x slots blocks; both 0: the
// shipped split.
std::vector<at::Tensor> run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& kv_lens, int64_t variant, int64_t chunks,
                            int64_t waves, int64_t slots, const std::optional<at::Tensor>& block_table) {
  at::Tensor out, lse, lens = kv_lens ? kv_lens->to(at::kLong).contiguous() : at::Tensor();
  const opforge::AttentionParams p =
      decode_sweep_params(q, k, v, lens, out, lse, block_table ? *block_table : at::Tensor());
  DecodeSplit s = opforge::decode_split(p, slots, waves > 0 ? static_cast<int>(waves) : opforge::kDecodeWaves);
  TORCH_CHECK(s.rows <= opforge::kDecodeMmaRows);
  if (chunks > 0) {
    TORCH_CHECK(!lens.defined(), "chunks: the uniform split (no kv_lens)");
    s.chunks = static_cast<int>(chunks);
  }
  at::Tensor part = at::empty({p.batch * p.kv_heads * s.chunks * s.rows * opforge::decode_part_stride(128)},
                              q.options().dtype(at::kFloat));
  s.part = part.data_ptr<float>();
  at::Tensor counts;
  if (s.blocks) {
    counts = at::empty({p.batch}, q.options().dtype(at::kInt));
    s.counts = counts.data_ptr<int32_t>();
  }
  AttentionCudaArgs a;
  a.g.fwd = p;
  set_scale_args(a, p.scale, p.softcap);
  const cudaStream_t st = at::cuda::getCurrentCUDAStream().stream();
  (void)cudaGetLastError();  // (an earlier call's error is not this launch's)
  const int err = with_variant(variant, [&](auto tr) {
    return static_cast<int>(opforge::attention_cuda::launch_decode_mma<decltype(tr), __nv_bfloat16>(a, s, st));
  });
  TORCH_CHECK(err == 0, "launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {out, lse};
}

int blocks_per_sm(int64_t variant) {
  return with_variant(variant, [](auto tr) {
    using Tr = decltype(tr);
    int n = 0;
    cudaError_t e = opforge::attention_cuda::configure_decode_mma<Tr, __nv_bfloat16>();
    TORCH_CHECK(e == cudaSuccess, "configure (", Tr::smem_bytes(), " bytes): ", cudaGetErrorString(e));
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, opforge::attention_cuda::attention_decode_mma_kernel<Tr, __nv_bfloat16>,
        opforge::attention_cuda::kDecodeThreads, Tr::smem_bytes());
    TORCH_CHECK(e == cudaSuccess, "occupancy: ", cudaGetErrorString(e));
    return n;
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run);
  m.def("blocks_per_sm", &blocks_per_sm);
}
