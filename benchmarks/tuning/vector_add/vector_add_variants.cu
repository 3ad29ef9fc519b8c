// Standalone experiment behind vector_add's CUDA kernel design (no torch): times kernel
// variants for a contiguous fp32 / bf16 add at 64M elements with CUDA events, next to a
// device-to-device copy. Build and run on a GPU:
//   nvcc -O3 -arch=sm_90 -o /tmp/va benchmarks/tuning/vector_add/vector_add_variants.cu && /tmp/va
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t err_ = (x);                                                               \
    if (err_ != cudaSuccess) {                                                            \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__);     \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ __nv_bfloat16 add(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
}

template <typename T, int U, bool Stream>
__device__ __forceinline__ void do_tile(T* out, const T* a, const T* b, int64_t first, int64_t step, int64_t nvec) {
  constexpr int V = 16 / sizeof(T);
  using P = Pack<T, V>;
  const P* av = reinterpret_cast<const P*>(a);
  const P* bv = reinterpret_cast<const P*>(b);
  P* ov = reinterpret_cast<P*>(out);
  P ra[U], rb[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = first + u * step;
    if (i < nvec) {
      if (Stream) {
        *reinterpret_cast<float4*>(&ra[u]) = __ldcs(reinterpret_cast<const float4*>(av + i));
        *reinterpret_cast<float4*>(&rb[u]) = __ldcs(reinterpret_cast<const float4*>(bv + i));
      } else {
        ra[u] = av[i];
        rb[u] = bv[i];
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = first + u * step;
    if (i < nvec) {
      P r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = add(ra[u].v[k], rb[u].v[k]);
      if (Stream)
        __stcs(reinterpret_cast<float4*>(ov + i), *reinterpret_cast<float4*>(&r));
      else
        ov[i] = r;
    }
  }
}

// Persistent grid, grid-stride, thread-interleaved unroll (the first version).
template <typename T, int U>
__global__ void persistent_interleaved(T* out, const T* a, const T* b, int64_t nvec) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += U * stride)
    do_tile<T, U, false>(out, a, b, i, stride, nvec);
}

// One contiguous tile of blockDim*U vectors per block (non-persistent grid).
template <typename T, int U, bool Stream>
__global__ void tiled(T* out, const T* a, const T* b, int64_t nvec) {
  const int64_t base = (int64_t)blockIdx.x * blockDim.x * U + threadIdx.x;
  do_tile<T, U, Stream>(out, a, b, base, blockDim.x, nvec);
}

// Contiguous tiles, grid-stride over tiles with a grid of `waves` x resident blocks.
template <typename T, int U>
__global__ void tiled_persistent(T* out, const T* a, const T* b, int64_t nvec) {
  const int64_t tile = (int64_t)blockDim.x * U;
  for (int64_t base = (int64_t)blockIdx.x * tile; base < nvec; base += (int64_t)gridDim.x * tile)
    do_tile<T, U, false>(out, a, b, base + threadIdx.x, blockDim.x, nvec);
}

template <typename F>
float time_ms(F f) {
  cudaEvent_t s, e;
  CK(cudaEventCreate(&s));
  CK(cudaEventCreate(&e));
  for (int i = 0; i < 5; ++i) f();
  std::vector<float> t;
  for (int r = 0; r < 50; ++r) {
    CK(cudaEventRecord(s));
    f();
    CK(cudaEventRecord(e));
    CK(cudaEventSynchronize(e));
    float ms;
    CK(cudaEventElapsedTime(&ms, s, e));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
void run(const char* name, int64_t n, int sms) {
  T *a, *b, *o;
  CK(cudaMalloc(&a, n * sizeof(T)));
  CK(cudaMalloc(&b, n * sizeof(T)));
  CK(cudaMalloc(&o, n * sizeof(T)));
  CK(cudaMemset(a, 0x3c, n * sizeof(T)));
  CK(cudaMemset(b, 0x3d, n * sizeof(T)));
  const double bytes = 3.0 * n * sizeof(T);
  constexpr int V = 16 / sizeof(T);
  const int64_t nvec = n / V;
  auto report = [&](const char* v, float ms) { printf("%-5s %-44s %8.1f us %7.0f GB/s\n", name, v, ms * 1e3, bytes / ms / 1e6); };
  report("copy (cudaMemcpy D2D, 2/3 of the bytes) x1.5", time_ms([&] { CK(cudaMemcpyAsync(o, a, n * sizeof(T), cudaMemcpyDeviceToDevice)); }) * 1.5f);
  report("persistent interleaved U4 256t", time_ms([&] { persistent_interleaved<T, 4><<<sms * 8, 256>>>(o, a, b, nvec); }));
  report("tiled U4 256t", time_ms([&] { tiled<T, 4, false><<<(nvec + 1023) / 1024, 256>>>(o, a, b, nvec); }));
  report("tiled U2 256t", time_ms([&] { tiled<T, 2, false><<<(nvec + 511) / 512, 256>>>(o, a, b, nvec); }));
  report("tiled U8 128t", time_ms([&] { tiled<T, 8, false><<<(nvec + 1023) / 1024, 128>>>(o, a, b, nvec); }));
  report("tiled U4 128t", time_ms([&] { tiled<T, 4, false><<<(nvec + 511) / 512, 128>>>(o, a, b, nvec); }));
  report("tiled U4 256t streaming (ldcs/stcs)", time_ms([&] { tiled<T, 4, true><<<(nvec + 1023) / 1024, 256>>>(o, a, b, nvec); }));
  for (int waves : {1, 2, 4, 8})
    report(waves == 1 ? "tiled persistent U4 256t x1 wave" : waves == 2 ? "tiled persistent U4 256t x2 waves"
           : waves == 4 ? "tiled persistent U4 256t x4 waves" : "tiled persistent U4 256t x8 waves",
           time_ms([&] { tiled_persistent<T, 4><<<sms * 8 * waves, 256>>>(o, a, b, nvec); }));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(o));
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int64_t n : {int64_t{1} << 24, int64_t{1} << 26}) {
    printf("n = %lld\n", (long long)n);
    run<float>("fp32", n, sms);
    run<__nv_bfloat16>("bf16", n, sms);
  }
  return 0;
}
