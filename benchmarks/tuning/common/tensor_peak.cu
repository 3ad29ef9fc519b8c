// Tensor-core ceilings of this GPU, without memory traffic: how many bf16 TFLOP/s mma.sync
// (m16n8k16, the "mma" rung's instruction) and wgmma (m64n256k16, the "wgmma" rung's) can issue
// when every operand is already in registers or shared memory. The ratio of the two bounds what
// an mma.sync kernel can reach against cuBLAS on Hopper. The mma.sync runs also report the SM
// cycles an HMMA.16816 takes per scheduler (clock64, independent of the clock) and the clock they
// ran at (cycles over event time): a long run shows the clock a sustained load settles to.
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o /tmp/peak benchmarks/tuning/common/tensor_peak.cu && /tmp/peak
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "common/cuda/wgmma.cuh"

constexpr int kIters = 4096;

__global__ void mma_sync_peak(float* out, long long* cycles, int iters) {
  const long long t0 = clock64();
  float acc[8][4] = {};
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ (threadIdx.x << i);
  for (int i = 0; i < 2; ++i) b[i] = 0x3f803f80u ^ (threadIdx.x << (i + 4));
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j)  // 8 independent accumulators: no dependency stalls
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0;
  for (int j = 0; j < 8; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

// Two warpgroups a block, each issuing 4 m64n256k16 per group with one group in flight.
__global__ void __launch_bounds__(256, 1) wgmma_peak(float* out) {
  __shared__ __align__(1024) unsigned char smem[64 * 128 + 256 * 128];
  for (int i = threadIdx.x; i < (int)sizeof(smem) / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0x3f803f80u;
  __syncthreads();
  float d[128] = {};
  const uint64_t base_a = (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) & 0x3ffff) >> 4;
  const uint64_t base_b = (static_cast<uint32_t>(__cvta_generic_to_shared(smem + 64 * 128)) & 0x3ffff) >> 4;
  auto desc = [](uint64_t addr16) { return addr16 | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62); };
  for (int it = 0; it < kIters / 4; ++it) {
    opforge::cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) opforge::cuda::Wgmma<__nv_bfloat16, 256>::mma(d, desc(base_a + kk * 2), desc(base_b + kk * 2), 1);
    opforge::cuda::wgmma_commit();
    opforge::cuda::wgmma_wait<1>();
  }
  opforge::cuda::wgmma_wait<0>();
  float s = 0;
  for (int i = 0; i < 128; ++i) s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out;
  cudaMalloc(&out, sizeof(float) * sms * 8 * 256);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float ms = 0;
  long long* cycles;
  cudaMalloc(&cycles, sizeof(long long) * sms * 4);
  long long* host = new long long[sms * 4];
  for (int warps : {4, 8, 16, -8}) {  // warps per SM (-8: 8, a run 64 times longer)
    const int iters = warps < 0 ? kIters * 64 : kIters;
    warps = warps < 0 ? -warps : warps;
    const int blocks = sms * warps / 4;
    mma_sync_peak<<<blocks, 128>>>(out, cycles, iters);
    cudaEventRecord(e0);
    mma_sync_peak<<<blocks, 128>>>(out, cycles, iters);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    cudaMemcpy(host, cycles, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
    double mean = 0;
    for (int i = 0; i < blocks; ++i) mean += double(host[i]) / blocks;
    const double flop = double(blocks) * 4 * iters * 8 * 16 * 8 * 16 * 2;
    // Each scheduler issues warps / 4 warps x 8 x iters HMMA in `mean` cycles (blocks of one wave).
    std::printf(
        "mma.sync m16n8k16 bf16, %2d warps/SM, %7.2f ms: %7.1f TFLOP/s, %.2f cycles per HMMA per scheduler, "
        "SM clock %.0f MHz\n",
        warps, ms, flop / ms / 1e9, mean / (warps / 4.0 * 8 * iters), mean / (ms * 1e3));
  }
  delete[] host;
  wgmma_peak<<<sms, 256>>>(out);
  cudaEventRecord(e0);
  wgmma_peak<<<sms, 256>>>(out);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  cudaEventElapsedTime(&ms, e0, e1);
  const double flop = double(sms) * 2 * kIters * 64 * 256 * 16 * 2;
  std::printf("wgmma m64n256k16 bf16, 2 warpgroups/SM: %7.1f TFLOP/s (%s)\n", flop / ms / 1e9,
              cudaGetErrorString(cudaGetLastError()));
  return 0;
}
