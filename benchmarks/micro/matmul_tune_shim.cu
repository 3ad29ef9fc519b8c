// C entry point of the matmul tuning library (benchmarks/micro/matmul_tune.py builds it with the
// CUDA rungs' files; no torch): runs one rung in one of its configurations.
#include <cstdint>

#include "matmul/cuda/matmul_kernels.h"

extern "C" int opforge_tune_matmul(int rung, int config, const void* a, const void* b, void* c, int64_t batch,
                                   int64_t m, int64_t n, int64_t k, int64_t a_rs, int64_t b_rs, int64_t b_cs, int64_t c_rs,
                                   int64_t a_bs, int64_t b_bs, int64_t c_bs, int dtype, void* stream) {
  opforge::GemmParams p;
  p.a = a;
  p.b = b;
  p.c = c;
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a_rs = a_rs;
  p.a_cs = 1;
  p.b_rs = b_rs;
  p.b_cs = b_cs;
  p.c_rs = c_rs;
  p.a_bs = a_bs;
  p.b_bs = b_bs;
  p.c_bs = c_bs;
  p.dtype = static_cast<opforge::DType>(dtype);
  switch (rung) {
    case 0: return opforge::matmul_warp_tiled_cuda_config(p, stream, config);
    case 1: return opforge::matmul_mma_cuda_config(p, stream, config);
    case 2: return opforge::matmul_wgmma_cuda_config(p, stream, config);
    default: return -1;
  }
}
