// vector_add: CUDA device code. Includes only CUDA headers (no torch): the launcher in
// vector_add_cuda.cpp hands it a VectorAddParams and a stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda/launch.cuh"
#include "common/cuda/vector.cuh"
#include "vector_add/vector_add_params.h"

namespace opforge {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // independent 16-byte loads per operand in flight per thread

// a + b computed in float for the 16-bit types, then rounded once: the result is the
// correctly rounded sum, bit-identical to torch.add.
__device__ __forceinline__ float add(float a, float b) {
  return a + b;
}
__device__ __forceinline__ double add(double a, double b) {
  return a + b;
}
__device__ __forceinline__ __half add(__half a, __half b) {
  return __float2half_rn(__half2float(a) + __half2float(b));
}
__device__ __forceinline__ __nv_bfloat16 add(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
}

// Dense operands: each block adds tiles of kThreads * kUnroll packs of kVec elements, the
// kUnroll loads per operand of a thread issued before any add (independent loads in flight),
// consecutive threads on consecutive packs (coalesced). kVec = 16 / sizeof(T) gives 16-byte
// LDG.128/STG.128 when all pointers are 16-byte aligned; kVec = 1 serves unaligned slices.
// Tiles are contiguous per block and the grid strides over them: measured on an H200
// (benchmarks/tuning/vector_add/vector_add_variants.cu), this is 6% faster than interleaving a
// persistent grid's threads over the whole array.
template <typename T, int kVec, int kUnroll>
__global__ void __launch_bounds__(kThreads)
    add_flat_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  using P = cuda::Pack<T, kVec>;
  const P* __restrict__ av = reinterpret_cast<const P*>(a);
  const P* __restrict__ bv = reinterpret_cast<const P*>(b);
  P* __restrict__ ov = reinterpret_cast<P*>(out);
  const int64_t npack = n / kVec;
  constexpr int64_t kTile = int64_t{kThreads} * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x; base < npack;
       base += static_cast<int64_t>(gridDim.x) * kTile) {
    P ra[kUnroll], rb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < npack) {
        ra[u] = av[i];
        rb[u] = bv[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < npack) {
        P r;
#pragma unroll
        for (int k = 0; k < kVec; ++k) r.v[k] = add(ra[u].v[k], rb[u].v[k]);
        ov[i] = r;
      }
    }
  }
  if (kVec > 1 && blockIdx.x == 0) {  // the n % kVec elements after the last full pack
    const int64_t t = npack * kVec + threadIdx.x;
    if (t < n) out[t] = add(a[t], b[t]);
  }
}

// Division by a run-time constant with a multiply-high and a shift (Granlund-Montgomery), for
// the strided kernel's index arithmetic: valid for dividends and divisors below 2^31.
struct FastDivmod {
  uint32_t divisor = 1, multiplier = 0, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t x) const { return (__umulhi(x, multiplier) + x) >> shift; }
};

// The strided kernel's view of the geometry when every index and offset fits in 31 bits.
struct Geometry32 {
  int ndim;
  uint32_t numel;
  FastDivmod sizes[kMaxDims];
  uint32_t strides[3][kMaxDims];
};

constexpr int kStridedUnroll = 4;

// Any strides (transposed, sliced, expanded inputs): each element's offsets from its linear
// index over the collapsed dims (innermost last), kStridedUnroll elements per thread in flight.
template <typename T>
__global__ void __launch_bounds__(kThreads) add_strided32_kernel(T* __restrict__ out, const T* __restrict__ a,
                                                                 const T* __restrict__ b, Geometry32 g) {
  constexpr uint32_t kTile = kThreads * kStridedUnroll;
  for (uint32_t base = blockIdx.x * kTile + threadIdx.x; base < g.numel; base += gridDim.x * kTile) {
    uint32_t oo[kStridedUnroll], oa[kStridedUnroll], ob[kStridedUnroll];
    T va[kStridedUnroll], vb[kStridedUnroll];
#pragma unroll
    for (int u = 0; u < kStridedUnroll; ++u) {
      uint32_t rem = base + u * kThreads;
      oo[u] = oa[u] = ob[u] = 0;
#pragma unroll
      for (int d = kMaxDims - 1; d >= 0; --d) {
        if (d < g.ndim) {
          const uint32_t q = g.sizes[d].div(rem);
          const uint32_t idx = rem - q * g.sizes[d].divisor;
          rem = q;
          oo[u] += idx * g.strides[0][d];
          oa[u] += idx * g.strides[1][d];
          ob[u] += idx * g.strides[2][d];
        }
      }
      if (base + u * kThreads < g.numel) {
        va[u] = a[oa[u]];
        vb[u] = b[ob[u]];
      }
    }
#pragma unroll
    for (int u = 0; u < kStridedUnroll; ++u)
      if (base + u * kThreads < g.numel) out[oo[u]] = add(va[u], vb[u]);
  }
}

// The same with 64-bit indices, for more than 2^31 elements or offsets.
template <typename T>
__global__ void __launch_bounds__(kThreads) add_strided64_kernel(T* __restrict__ out, const T* __restrict__ a,
                                                                 const T* __restrict__ b, Geometry<3> g) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < g.numel; i += stride) {
    int64_t rem = i, oo = 0, oa = 0, ob = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d < g.ndim) {
        const int64_t idx = rem % g.sizes[d];
        rem /= g.sizes[d];
        oo += idx * g.strides[0][d];
        oa += idx * g.strides[1][d];
        ob += idx * g.strides[2][d];
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
  const Geometry<3>& g = p.geom;
  const int64_t n = g.numel;
  constexpr int64_t kMax32 = (int64_t{1} << 31) - 1;
  if (g.is_flat()) {
    if (cuda::is_aligned(out, 16) && cuda::is_aligned(a, 16) && cuda::is_aligned(b, 16)) {
      constexpr int kVec = 16 / sizeof(T);
      const int64_t tiles = (n / kVec + kThreads * kUnroll - 1) / (kThreads * kUnroll);
      add_flat_kernel<T, kVec, kUnroll>
          <<<cuda::grid_for_tiles(tiles, kThreads, p.num_sms), kThreads, 0, stream>>>(out, a, b, n);
    } else {
      constexpr int kScalarUnroll = 4 * kUnroll;  // same bytes in flight as the vector path
      const int64_t tiles = (n + kThreads * kScalarUnroll - 1) / (kThreads * kScalarUnroll);
      add_flat_kernel<T, 1, kScalarUnroll>
          <<<cuda::grid_for_tiles(tiles, kThreads, p.num_sms), kThreads, 0, stream>>>(out, a, b, n);
    }
  } else if (n <= kMax32 / 2 && g.max_offset(0) <= kMax32 && g.max_offset(1) <= kMax32 &&
             g.max_offset(2) <= kMax32) {
    // 32-bit indexing; n <= 2^30 keeps base + a grid stride below 2^31 in the loop.
    Geometry32 g32{};
    g32.ndim = g.ndim;
    g32.numel = static_cast<uint32_t>(n);
    for (int d = 0; d < g.ndim; ++d) {
      g32.sizes[d] = FastDivmod(static_cast<uint32_t>(g.sizes[d]));
      for (int op = 0; op < 3; ++op) g32.strides[op][d] = static_cast<uint32_t>(g.strides[op][d]);
    }
    const int64_t tiles = (n + kThreads * kStridedUnroll - 1) / (kThreads * kStridedUnroll);
    add_strided32_kernel<T>
        <<<cuda::grid_for_tiles(tiles, kThreads, p.num_sms), kThreads, 0, stream>>>(out, a, b, g32);
  } else {
    add_strided64_kernel<T>
        <<<cuda::grid_for_tiles((n + kThreads - 1) / kThreads, kThreads, p.num_sms), kThreads, 0, stream>>>(
            out, a, b, g);
  }
  return cudaGetLastError();
}

}  // namespace

int run_vector_add_cuda(const VectorAddParams& p, void* stream) {
  if (p.geom.numel == 0) return cudaSuccess;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat32:
      return launch<float>(p, s);
    case DType::kFloat64:
      return launch<double>(p, s);
    case DType::kFloat16:
      return launch<__half>(p, s);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(p, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace opforge
