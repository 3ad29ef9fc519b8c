// vector_add: CUDA device code. Includes only CUDA headers (no torch): the launcher in
// vector_add_cuda.cpp hands it a VectorAddParams and a stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda_utils.cuh"
#include "vector_add/vector_add_params.h"

namespace opforge {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // independent 16-byte loads per operand in flight per thread

// a + b computed in float for the 16-bit types, then rounded once: the result is the
// correctly rounded sum, bit-identical to torch.add.
__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ double add(double a, double b) { return a + b; }
__device__ __forceinline__ __half add(__half a, __half b) {
  return __float2half_rn(__half2float(a) + __half2float(b));
}
__device__ __forceinline__ __nv_bfloat16 add(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
}

// Dense operands, all 16-byte aligned: 16-byte loads/stores, kUnroll of them in flight per
// thread, grid-stride over the vectors; the n % kVec tail is done by the first threads.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    add_flat_vec_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  constexpr int kVec = 16 / sizeof(T);
  using P = cuda::Pack<T, kVec>;
  const P* __restrict__ av = reinterpret_cast<const P*>(a);
  const P* __restrict__ bv = reinterpret_cast<const P*>(b);
  P* __restrict__ ov = reinterpret_cast<P*>(out);
  const int64_t nvec = n / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;

  int64_t i = tid;
  for (; i + (kUnroll - 1) * stride < nvec; i += kUnroll * stride) {
    P ra[kUnroll], rb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      ra[u] = av[i + u * stride];
      rb[u] = bv[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      P r;
#pragma unroll
      for (int k = 0; k < kVec; ++k) r.v[k] = add(ra[u].v[k], rb[u].v[k]);
      ov[i + u * stride] = r;
    }
  }
  for (; i < nvec; i += stride) {
    const P ra = av[i], rb = bv[i];
    P r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.v[k] = add(ra.v[k], rb.v[k]);
    ov[i] = r;
  }
  const int64_t t = nvec * kVec + tid;
  if (t < n) out[t] = add(a[t], b[t]);
}

// Dense operands that are not all 16-byte aligned (e.g. a slice starting at an odd element).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    add_flat_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    out[i] = add(a[i], b[i]);
}

// Any strides (transposed, sliced, expanded inputs): each element's offsets from its linear
// index over the collapsed dims. IndexT is 32-bit when every offset fits, which makes the
// divisions cheaper; 64-bit otherwise (> 2^31 elements).
template <typename T, typename IndexT>
__global__ void __launch_bounds__(kThreads)
    add_strided_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, Geometry<3> g) {
  const IndexT n = static_cast<IndexT>(g.numel);
  const IndexT stride = static_cast<IndexT>(gridDim.x) * kThreads;
  for (IndexT i = static_cast<IndexT>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    IndexT rem = i, oo = 0, oa = 0, ob = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d < g.ndim) {
        const IndexT size = static_cast<IndexT>(g.sizes[d]);
        const IndexT idx = rem % size;
        rem /= size;
        oo += idx * static_cast<IndexT>(g.strides[0][d]);
        oa += idx * static_cast<IndexT>(g.strides[1][d]);
        ob += idx * static_cast<IndexT>(g.strides[2][d]);
      }
    }
    out[oo] = add(a[oa], b[ob]);
  }
}

template <typename T>
cudaError_t launch(const VectorAddParams& p, cudaStream_t stream) {
  T* out = static_cast<T*>(p.out);
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  const int64_t n = p.geom.numel;
  if (p.geom.is_flat()) {
    if (cuda::is_aligned(out, 16) && cuda::is_aligned(a, 16) && cuda::is_aligned(b, 16)) {
      constexpr int kVec = 16 / sizeof(T);
      const int64_t work = n / kVec > 0 ? n / kVec : 1;
      add_flat_vec_kernel<T><<<cuda::persistent_grid(work, kThreads, p.num_sms), kThreads, 0, stream>>>(out, a, b, n);
    } else {
      add_flat_kernel<T><<<cuda::persistent_grid(n, kThreads, p.num_sms), kThreads, 0, stream>>>(out, a, b, n);
    }
  } else {
    const unsigned int grid = cuda::persistent_grid(n, kThreads, p.num_sms);
    constexpr int64_t kMax32 = (int64_t{1} << 31) - 1;
    // The index loop adds one grid stride past n before it stops: keep that inside 32 bits too.
    const bool fits32 = n + static_cast<int64_t>(grid) * kThreads <= kMax32 && p.geom.max_offset(0) <= kMax32 &&
                        p.geom.max_offset(1) <= kMax32 && p.geom.max_offset(2) <= kMax32;
    if (fits32)
      add_strided_kernel<T, uint32_t><<<grid, kThreads, 0, stream>>>(out, a, b, p.geom);
    else
      add_strided_kernel<T, int64_t><<<grid, kThreads, 0, stream>>>(out, a, b, p.geom);
  }
  return cudaGetLastError();
}

}  // namespace

int run_vector_add_cuda(const VectorAddParams& p, void* stream) {
  if (p.geom.numel == 0) return cudaSuccess;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat32: return launch<float>(p, s);
    case DType::kFloat64: return launch<double>(p, s);
    case DType::kFloat16: return launch<__half>(p, s);
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace opforge
