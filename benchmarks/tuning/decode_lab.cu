// Tuning only (benchmarks/tuning/decode_lab.py): decode_lab_kernel.cuh's variants on contiguous bf16
// q (B, Hq, 1, D) and k, v (B, Hkv, S, D), D 128, causal, optional per-sequence key counts.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "decode_sweep_params.h"

#include "decode_lab_kernel.cuh"

namespace {

using opforge::decode_lab::LabSplit;
using opforge::decode_lab::LabTraits;

template <int kStages, int kTile>
int launch(const opforge::AttentionCudaArgs& a, const LabSplit& s, cudaStream_t st) {
  return opforge::decode_lab::lab_launch<LabTraits<128, kStages, kTile>, __nv_bfloat16>(a, s, st);
}

int dispatch(int stages, int tile, const opforge::AttentionCudaArgs& a, const LabSplit& s, cudaStream_t st) {
  if (tile == 64) return stages == 2 ? launch<2, 64>(a, s, st) : stages == 3 ? launch<3, 64>(a, s, st) : launch<4, 64>(a, s, st);
  return launch<2, 128>(a, s, st);
}

int64_t blocks_per_sm(int64_t stages, int64_t tile) {
  using opforge::decode_lab::lab_blocks_per_sm;
  if (tile == 64) {
    return stages == 2 ? lab_blocks_per_sm<LabTraits<128, 2, 64>>()
           : stages == 3 ? lab_blocks_per_sm<LabTraits<128, 3, 64>>()
                         : lab_blocks_per_sm<LabTraits<128, 4, 64>>();
  }
  return lab_blocks_per_sm<LabTraits<128, 2, 128>>();
}

// out, lse; `chunks` blocks a (batch, kv head).
std::vector<at::Tensor> run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& kv_lens, int64_t stages, int64_t tile, int64_t chunks,
                            bool direct, bool programmatic) {
  at::Tensor out, lse, lens = kv_lens ? kv_lens->to(at::kLong).contiguous() : at::Tensor();
  const opforge::AttentionParams p = decode_sweep_params(q, k, v, lens, out, lse);
  LabSplit s;
  s.rows = static_cast<int>(p.heads / p.kv_heads);
  TORCH_CHECK(s.rows <= opforge::kDecodeMmaRows);
  s.chunks = static_cast<int>(chunks), s.direct = direct, s.programmatic = programmatic;
  at::Tensor part;
  if (chunks > 1 || !direct) {
    part = at::empty({p.batch * p.kv_heads * s.chunks * s.rows * opforge::decode_part_stride(128)},
                     q.options().dtype(at::kFloat));
    s.part = part.data_ptr<float>();
  }
  opforge::AttentionCudaArgs a;
  a.g.fwd = p;
  a.scale = static_cast<float>(p.scale);
  (void)cudaGetLastError();
  const int err = dispatch(static_cast<int>(stages), static_cast<int>(tile), a, s, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {out, lse};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run);
  m.def("blocks_per_sm", &blocks_per_sm);
}
