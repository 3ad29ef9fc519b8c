// What the "mma" rung's inner loop can issue, without any memory traffic from L2: SM cycles per
// HMMA.16816 per scheduler (clock64) for the loop's instruction mix, built up one ingredient at
// a time, with one and two warps per scheduler (blocks of 4 warps, 1 or 2 blocks per SM):
//   0 peak: 32 accumulators, the same a and b fragments for every mma (tensor_peak.cu's loop);
//   1 operands: the rung's order (4 a fragments x 8 b fragments, a reused along a row), fixed;
//   2 ldmatrix: 1 plus the fragments read from shared memory a step ahead (double-buffered, 8
//     ldmatrix.x4 per 32 mma, the rung's 128-byte-swizzled addresses), as in consume_ring;
//   3 boundary: 2 plus, every 4 steps (a 64-deep k tile), the rung's hand-over without its
//     waiting: __syncwarp, lane 0's acq_rel count in shared memory, an mbarrier try_wait on a
//     phase that has completed;
//   4 the same hand-over every other k tile; 5 with a relaxed count (no fence); 6 without the wait;
//   7 the wait replaced by a non-blocking test in step 1 (its result used at the boundary);
//   8 3 with the count issued in step 2, right after the last fragments of the tile are loaded
//     (its result used at the boundary); 9 the count amid step 2's mma (after half of them);
//   10 9 without the wait; 11 3 with 96-deep k tiles (the hand-over every 6 steps).
// The rung's own kernel, traced (matmul_tune.py --trace), takes ~1800 cycles per k tile per warp,
// 7.0 per HMMA per scheduler; its diagnostic without refills or waits ~1684 (6.58). This says
// which ingredient costs what. 6.00 is the ceiling (tensor_peak.cu, two warps per scheduler).
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o /tmp/mix benchmarks/tuning/matmul/mma_mix.cu && /tmp/mix
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/cuda/mma_sync.cuh"

namespace {

using opforge::cuda::ldmatrix_x4;
using opforge::cuda::ldmatrix_x4_trans;

// The rung's mma (bf16 inputs, float32 accumulation).
__device__ __forceinline__ void mma(float* d, const uint32_t* a, const uint32_t* b) {
  opforge::cuda::mma_m16n8k16<__nv_bfloat16>(d, a, b);
}

// The rung's fragment addresses in one 128 x 64 (a) + 64 x 256 (b, four 64-column boxes) stage,
// 128-byte swizzle: a warp's 64 x 64 piece at rows row0, columns col0.
struct Frags {
  uint32_t a[4], b[4];
  __device__ Frags(uint32_t a_sm, uint32_t b_sm, int row0, int col0, int lane) {
    for (int q = 0; q < 4; ++q) {
      const int r = row0 + lane % 16, k = q * 16 + (lane / 16) * 8;
      a[q] = a_sm + 2 * (r * 64 + (((k / 8) ^ (r & 7)) * 8));
    }
    for (int p = 0; p < 4; ++p) {
      const int r = lane % 8 + ((lane / 8) % 2) * 8, n = col0 + p * 16 + (lane / 16) * 8;
      b[p] = b_sm + 2 * ((n / 64) * 64 * 64 + r * 64 + ((((n % 64) / 8) ^ (r & 7)) * 8));
    }
  }
  __device__ __forceinline__ void load(int q, uint32_t (&fa)[4][4], uint32_t (&fb)[8][2]) const {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldmatrix_x4(fa[mi], a[q] + mi * 16 * 64 * 2);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t r4[4];
      ldmatrix_x4_trans(r4, b[p] + q * 16 * 64 * 2);
      fb[2 * p][0] = r4[0];
      fb[2 * p][1] = r4[1];
      fb[2 * p + 1][0] = r4[2];
      fb[2 * p + 1][1] = r4[3];
    }
  }
};

constexpr int kSmem = (128 * 64 + 64 * 256) * 2;

template <int kMix>
__global__ void __launch_bounds__(128) mix_kernel(float* out, long long* cycles, int tiles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ uint32_t counter;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int i = tid; i < kSmem / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ (static_cast<uint32_t>(i) & 0x00ff00ffu);
  const uint32_t a_sm = static_cast<uint32_t>(__cvta_generic_to_shared(smem)), b_sm = a_sm + 128 * 64 * 2;
  const uint32_t bar_a = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  const uint32_t cnt_a = static_cast<uint32_t>(__cvta_generic_to_shared(&counter));
  if (tid == 0) {
    counter = 0;
    asm volatile("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(bar_a) : "memory");
    asm volatile("mbarrier.arrive.shared.b64 _, [%0];\n" ::"r"(bar_a) : "memory");  // phase 0 completes
  }
  __syncthreads();
  const Frags fr(a_sm, b_sm, (warp / 2) * 64, (warp % 2) * 64 + (warp / 2) * 128, lane);
  float acc[4][8][4] = {};
  uint32_t fa[2][4][4], fb[2][8][2];
  fr.load(0, fa[0], fb[0]);
  fr.load(1, fa[1], fb[1]);
  __syncthreads();
  const long long t0 = clock64();
  const auto count = [&] {  // the warp's count: lane 0's acq_rel add, after the warp's reads
    __syncwarp();
    uint32_t before = 0;
    if (lane == 0) {
      if constexpr (kMix == 5)
        asm volatile("atom.relaxed.cta.shared::cta.add.u32 %0, [%1], 1;\n" : "=r"(before) : "r"(cnt_a) : "memory");
      else
        asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], 1;\n" : "=r"(before) : "r"(cnt_a) : "memory");
    }
    return before;
  };
  constexpr int kSteps = kMix == 11 ? 6 : 4;  // 16-deep steps per k tile
  for (int t = 0; t < tiles * 4 / kSteps; ++t) {
    uint32_t ready = 0, before = 0;
#pragma unroll
    for (int q = 0; q < kSteps; ++q) {
      if constexpr (kMix >= 2) {
        if (q + 1 < kSteps) {
          fr.load((q + 1) % 4, fa[(q + 1) & 1], fb[(q + 1) & 1]);
          if (kMix == 8 && q == 2) before = count();
          if (kMix == 7 && q == 1)
            asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(ready)
                         : "r"(bar_a), "r"(0u)
                         : "memory");
        } else {
          if (kMix >= 3 && (kMix != 4 || t % 2 == 1)) {
            if (kMix < 8) before = count();
            if (lane == 0 && before == 0xffffffffu) out[0] = 1.f;  // (never: keeps the count)
            uint32_t done = kMix == 6 || kMix == 10 || (kMix == 7 && ready);
            while (!done)
              asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                           : "=r"(done)
                           : "r"(bar_a), "r"(0u)
                           : "memory");
          }
          fr.load(0, fa[0], fb[0]);
        }
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        if (kMix >= 9 && q == 2 && mi == 2) before = count();
#pragma unroll
        for (int nj = 0; nj < 8; ++nj) {
          if constexpr (kMix == 0)
            mma(acc[mi][nj], fa[0][0], fb[0][0]);
          else
            mma(acc[mi][nj], fa[q & 1][mi], fb[q & 1][nj]);
        }
      }
    }
  }
  const long long t1 = clock64();
  float s = 0;
  for (int mi = 0; mi < 4; ++mi)
    for (int nj = 0; nj < 8; ++nj) s += acc[mi][nj][0] + acc[mi][nj][1] + acc[mi][nj][2] + acc[mi][nj][3];
  out[blockIdx.x * blockDim.x + tid] = s;
  __shared__ long long span[4];
  if (lane == 0) span[warp] = t1 - t0;
  __syncthreads();
  if (tid == 0) {
    long long m = 0;
    for (int w = 0; w < 4; ++w) m = span[w] > m ? span[w] : m;
    cycles[blockIdx.x] = m;
  }
}

template <int kMix>
void run(const char* name, int sms, float* out, long long* cycles, long long* host) {
  cudaFuncSetAttribute(mix_kernel<kMix>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int per_sm : {1, 2}) {
    const int blocks = sms * per_sm, tiles = 4096;
    mix_kernel<kMix><<<blocks, 128, kSmem>>>(out, cycles, tiles);
    cudaEventRecord(e0);
    mix_kernel<kMix><<<blocks, 128, kSmem>>>(out, cycles, tiles);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaMemcpy(host, cycles, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
    double mean = 0;
    for (int i = 0; i < blocks; ++i) mean += double(host[i]) / blocks;
    const double hmma = double(per_sm) * tiles * 128;  // per scheduler
    const double flop = double(blocks) * 4 * tiles * 128 * 16 * 8 * 16 * 2;
    std::printf("%-10s %d warp(s)/scheduler: %.2f cycles per HMMA per scheduler (%.0f per 64-deep k tile per warp), "
                "%6.1f TFLOP/s, SM clock %.0f MHz (%s)\n",
                name, per_sm, mean / hmma, mean / tiles, flop / ms / 1e9, mean / (ms * 1e3),
                cudaGetErrorString(cudaGetLastError()));
  }
}

// Mix kMix with two warps per scheduler, launched back to back for `ms` milliseconds (for power
// sampling at the board's cap: matmul_tune.py --power): prints the sustained TFLOP/s.
template <int kMix>
void sustain(const char* name, int sms, float* out, long long* cycles, double ms) {
  cudaFuncSetAttribute(mix_kernel<kMix>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  const int blocks = sms * 2, tiles = 4096;
  const double flop_per_launch = double(blocks) * 4 * tiles * 128 * 16 * 8 * 16 * 2;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  mix_kernel<kMix><<<blocks, 128, kSmem>>>(out, cycles, tiles);
  cudaEventRecord(e0);
  int launches = 0;
  for (float done = 0; done < ms; launches += 10) {
    for (int i = 0; i < 10; ++i) mix_kernel<kMix><<<blocks, 128, kSmem>>>(out, cycles, tiles);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&done, e0, e1);
  }
  float total = 0;
  cudaEventElapsedTime(&total, e0, e1);
  std::printf("mix %s: %.1f TFLOP/s sustained over %.0f ms (%s)\n", name, flop_per_launch * launches / total / 1e9,
              total, cudaGetErrorString(cudaGetLastError()));
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out;
  long long* cycles;
  cudaMalloc(&out, sizeof(float) * sms * 2 * 128);
  cudaMalloc(&cycles, sizeof(long long) * sms * 2);
  if (argc == 4 && std::string(argv[1]) == "sustain") {  // mma_mix sustain {peak,ldmatrix,bk96} MS
    const std::string mix = argv[2];
    const double ms = std::atof(argv[3]);
    if (mix == "peak") sustain<0>("peak", sms, out, cycles, ms);
    else if (mix == "ldmatrix") sustain<2>("ldmatrix", sms, out, cycles, ms);
    else if (mix == "bk96") sustain<11>("bk96", sms, out, cycles, ms);
    else return 2;
    return 0;
  }
  long long* host = new long long[sms * 2];
  run<0>("peak", sms, out, cycles, host);
  run<1>("operands", sms, out, cycles, host);
  run<2>("ldmatrix", sms, out, cycles, host);
  run<3>("boundary", sms, out, cycles, host);
  run<4>("bnd/2", sms, out, cycles, host);
  run<5>("relaxed", sms, out, cycles, host);
  run<6>("no-wait", sms, out, cycles, host);
  run<7>("early", sms, out, cycles, host);
  run<8>("cnt-step2", sms, out, cycles, host);
  run<9>("cnt-mid2", sms, out, cycles, host);
  run<10>("mid2-nowait", sms, out, cycles, host);
  run<11>("bk96", sms, out, cycles, host);
  delete[] host;
  return 0;
}
