// The CPU GEMM of common/cpu/gemm.h, compiled once per CPU variant: the including file defines
// CPU_CAPABILITY (and CPU_CAPABILITY_AVX2 for that variant) and OPFORGE_CPU_VARIANT_NS first.
//
// The classic blocked GEMM (Goto / BLIS): for each kc-deep slice of k, a kc x nc block of b is
// packed into NR-wide column panels (L3), an mc x kc block of a into MR-tall row panels (L2),
// and an MR x NR micro-kernel keeps its whole tile of c in registers while it streams one panel
// of each: per k step, 2 vector loads of b, MR broadcasts of a and 2*MR fused multiply-adds. With
// AVX2 (8 floats a vector) MR x NR = 6 x 16: 12 accumulators + 2 b vectors + 1 broadcast = 15 of
// the 16 ymm registers. Packing converts 16-bit inputs to float, so fp16/bf16 multiply and
// accumulate in fp32 (c is float; the driver rounds it once); strided and transposed operands
// are read by their strides while packing, with no copy. Edge tiles are padded with zeros in the
// packs and written through a small buffer.
// Like every variant file, this one uses no function that another variant could share (std
// containers, c10 conversions): one compiled for AVX2 could be picked by the linker for both.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cpu/gemm.h"

namespace opforge {
namespace OPFORGE_CPU_VARIANT_NS {
namespace {

template <typename Acc>
struct Blocking {
  using Vec = at::vec::Vectorized<Acc>;
  static constexpr int kMR = 6;
  static constexpr int kNR = 2 * Vec::size();
  static constexpr int64_t kKC = 256;
  // a block: kMC x kKC accumulators (144 x 256 floats = 144 KB, within a 512 KB L2);
  // b block: kKC x kNC (1.5 MB of floats, in L3). Multiples of kMR and kNR.
  static constexpr int64_t kMC = std::is_same_v<Acc, double> ? 72 : 144;
  static constexpr int64_t kNC = std::is_same_v<Acc, double> ? 768 : 1536;
};

inline int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// 16-bit inputs widened by their bits (no c10 conversion functions: see above).
inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float widen_bf16(uint16_t h) {
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}
inline float widen_fp16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf, nan
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return bits_to_float(sign);  // +-0
  // subnormal: man * 2^-24, exact in float
  const float mag = static_cast<float>(man) * 0x1p-24f;
  return sign ? -mag : mag;
}

template <typename Acc, typename T>
inline Acc widen(T x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    return widen_bf16(x.x);
  else if constexpr (std::is_same_v<T, c10::Half>)
    return widen_fp16(x.x);
  else
    return x;
}

// a block (mc x kc, strides rs/cs) into MR-tall panels: panel i holds, for each k, its MR rows.
template <typename Acc, typename T>
void pack_a(const T* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, Acc* dst) {
  constexpr int MR = Blocking<Acc>::kMR;
  for (int64_t i0 = 0; i0 < mc; i0 += MR) {
    const int rows = static_cast<int>(imin(MR, mc - i0));
    const T* src = a + i0 * rs;
    if (rows == MR) {
      for (int64_t p = 0; p < kc; ++p) {
        for (int r = 0; r < MR; ++r) dst[r] = widen<Acc>(src[r * rs + p * cs]);
        dst += MR;
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        for (int r = 0; r < MR; ++r) dst[r] = r < rows ? widen<Acc>(src[r * rs + p * cs]) : Acc(0);
        dst += MR;
      }
    }
  }
}

// b block (kc x nc, strides rs/cs) into NR-wide panels: panel j holds, for each k, its NR columns.
template <typename Acc, typename T>
void pack_b(const T* b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, Acc* dst) {
  constexpr int NR = Blocking<Acc>::kNR;
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    const int cols = static_cast<int>(imin(NR, nc - j0));
    const T* src = b + j0 * cs;
    if (cols == NR && cs == 1 && std::is_same_v<T, Acc>) {
      for (int64_t p = 0; p < kc; ++p) {
        std::memcpy(dst, src + p * rs, sizeof(Acc) * NR);
        dst += NR;
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const T* row = src + p * rs;
        for (int c = 0; c < NR; ++c) dst[c] = c < cols ? widen<Acc>(row[c * cs]) : Acc(0);
        dst += NR;
      }
    }
  }
}

// c[0:MR, 0:NR] (row stride ldc) = (accumulate ? c : 0) + a_panel @ b_panel over kc steps.
template <typename Acc>
inline void micro_kernel(int64_t kc, const Acc* __restrict__ ap, const Acc* __restrict__ bp,
                         Acc* __restrict__ c, int64_t ldc, bool accumulate) {
  using Vec = at::vec::Vectorized<Acc>;
  constexpr int MR = Blocking<Acc>::kMR, V = Vec::size();
  Vec acc0[MR], acc1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = Vec(Acc(0));
  for (int64_t p = 0; p < kc; ++p) {
    const Vec b0 = Vec::loadu(bp), b1 = Vec::loadu(bp + V);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const Vec a(ap[r]);
      acc0[r] = at::vec::fmadd(a, b0, acc0[r]);
      acc1[r] = at::vec::fmadd(a, b1, acc1[r]);
    }
    ap += MR;
    bp += 2 * V;
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    Acc* row = c + r * ldc;
    if (accumulate) {
      acc0[r] = acc0[r] + Vec::loadu(row);
      acc1[r] = acc1[r] + Vec::loadu(row + V);
    }
    acc0[r].store(row);
    acc1[r].store(row + V);
  }
}

// The same for a partial tile (rows x cols of MR x NR): through a padded buffer.
template <typename Acc>
void edge_kernel(int64_t kc, const Acc* ap, const Acc* bp, Acc* c, int64_t ldc, bool accumulate, int rows,
                 int cols) {
  constexpr int MR = Blocking<Acc>::kMR, NR = Blocking<Acc>::kNR;
  alignas(64) Acc tile[MR * NR];
  micro_kernel<Acc>(kc, ap, bp, tile, NR, false);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) c[r * ldc + j] = (accumulate ? c[r * ldc + j] : Acc(0)) + tile[r * NR + j];
}

template <typename T, typename Acc>
void gemm_block_impl(const GemmParams& p, int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                     void* work) {
  using B = Blocking<Acc>;
  constexpr int MR = B::kMR, NR = B::kNR;
  const T* a = static_cast<const T*>(p.a) + bi * p.a_bs;
  const T* b = static_cast<const T*>(p.b) + bi * p.b_bs;
  Acc* c = static_cast<Acc*>(p.c) + bi * p.c_bs + m0 * p.c_rs + n0;
  const int64_t M = m1 - m0, N = n1 - n0, K = p.k, ldc = p.c_rs;
  if (M <= 0 || N <= 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = Acc(0);
    return;
  }
  Acc* a_pack = static_cast<Acc*>(work);
  Acc* b_pack = a_pack + B::kMC * B::kKC;
  for (int64_t jc = 0; jc < N; jc += B::kNC) {
    const int64_t nc = imin(B::kNC, N - jc);
    for (int64_t pc = 0; pc < K; pc += B::kKC) {
      const int64_t kc = imin(B::kKC, K - pc);
      const bool accumulate = pc > 0;
      pack_b<Acc>(b + pc * p.b_rs + (n0 + jc) * p.b_cs, p.b_rs, p.b_cs, kc, nc, b_pack);
      for (int64_t ic = 0; ic < M; ic += B::kMC) {
        const int64_t mc = imin(B::kMC, M - ic);
        pack_a<Acc>(a + (m0 + ic) * p.a_rs + pc * p.a_cs, p.a_rs, p.a_cs, mc, kc, a_pack);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const Acc* bp = b_pack + (jr / NR) * kc * NR;
          const int cols = static_cast<int>(imin(NR, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const Acc* ap = a_pack + (ir / MR) * kc * MR;
            Acc* ct = c + (ic + ir) * ldc + jc + jr;
            const int rows = static_cast<int>(imin(MR, mc - ir));
            if (rows == MR && cols == NR)
              micro_kernel<Acc>(kc, ap, bp, ct, ldc, accumulate);
            else
              edge_kernel<Acc>(kc, ap, bp, ct, ldc, accumulate, rows, cols);
          }
        }
      }
    }
  }
}

// Packed operands (GemmPackedFns): k in slices of kKC; slice s of a holds its row panels
// (ceil(m / MR) x kc x MR), of b its column panels (ceil(n / NR) x kc x NR).
template <typename Acc>
int64_t packed_a_size(int64_t m, int64_t k) {
  constexpr int MR = Blocking<Acc>::kMR;
  return (m + MR - 1) / MR * MR * k;
}
template <typename Acc>
int64_t packed_b_size(int64_t k, int64_t n) {
  constexpr int NR = Blocking<Acc>::kNR;
  return (n + NR - 1) / NR * NR * k;
}

template <typename T, typename Acc>
void pack_a_all(const void* a, int64_t rs, int64_t cs, int64_t m, int64_t k, void* dst) {
  constexpr int64_t KC = Blocking<Acc>::kKC;
  const int64_t panels = packed_a_size<Acc>(m, 1);
  for (int64_t pc = 0; pc < k; pc += KC)
    pack_a<Acc>(static_cast<const T*>(a) + pc * cs, rs, cs, m, imin(KC, k - pc),
                static_cast<Acc*>(dst) + panels * pc);
}

template <typename T, typename Acc>
void pack_b_all(const void* b, int64_t rs, int64_t cs, int64_t k, int64_t n, void* dst) {
  constexpr int64_t KC = Blocking<Acc>::kKC;
  const int64_t panels = packed_b_size<Acc>(1, n);
  for (int64_t pc = 0; pc < k; pc += KC)
    pack_b<Acc>(static_cast<const T*>(b) + pc * rs, rs, cs, imin(KC, k - pc), n,
                static_cast<Acc*>(dst) + panels * pc);
}

template <typename Acc>
void multiply_packed(int64_t m, int64_t n, int64_t k, const void* a_packed, const void* b_packed, void* c_out,
                     int64_t ldc, bool accumulate) {
  constexpr int MR = Blocking<Acc>::kMR, NR = Blocking<Acc>::kNR;
  constexpr int64_t KC = Blocking<Acc>::kKC;
  Acc* c = static_cast<Acc*>(c_out);
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = Acc(0);
    return;
  }
  const int64_t a_panels = packed_a_size<Acc>(m, 1), b_panels = packed_b_size<Acc>(1, n);
  for (int64_t pc = 0; pc < k; pc += KC) {
    const int64_t kc = imin(KC, k - pc);
    const Acc* ap0 = static_cast<const Acc*>(a_packed) + a_panels * pc;
    const Acc* bp0 = static_cast<const Acc*>(b_packed) + b_panels * pc;
    for (int64_t jr = 0; jr < n; jr += NR) {
      const Acc* bp = bp0 + (jr / NR) * kc * NR;
      const int cols = static_cast<int>(imin(NR, n - jr));
      for (int64_t ir = 0; ir < m; ir += MR) {
        const Acc* ap = ap0 + (ir / MR) * kc * MR;
        const int rows = static_cast<int>(imin(MR, m - ir));
        const bool add = accumulate || pc > 0;
        if (rows == MR && cols == NR)
          micro_kernel<Acc>(kc, ap, bp, c + ir * ldc + jr, ldc, add);
        else
          edge_kernel<Acc>(kc, ap, bp, c + ir * ldc + jr, ldc, add, rows, cols);
      }
    }
  }
}

template <typename T, typename Acc>
GemmPackedFns packed_fns() {
  return {&packed_a_size<Acc>, &packed_b_size<Acc>, &pack_a_all<T, Acc>, &pack_b_all<T, Acc>,
          &multiply_packed<Acc>};
}

}  // namespace

GemmPackedFns gemm_packed(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return packed_fns<float, float>();
    case DType::kFloat64:
      return packed_fns<double, double>();
    case DType::kFloat16:
      return packed_fns<c10::Half, float>();
    case DType::kBFloat16:
      return packed_fns<c10::BFloat16, float>();
    case DType::kFloat8E4M3:  // (no kernel: the ops' checks refuse it)
      break;
  }
  return {};
}

int64_t gemm_work_bytes(DType dtype) {
  if (dtype == DType::kFloat64)
    return (Blocking<double>::kMC + Blocking<double>::kNC) * Blocking<double>::kKC * 8;
  return (Blocking<float>::kMC + Blocking<float>::kNC) * Blocking<float>::kKC * 4;
}

GemmBlockFn gemm_block(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &gemm_block_impl<float, float>;
    case DType::kFloat64:
      return &gemm_block_impl<double, double>;
    case DType::kFloat16:
      return &gemm_block_impl<c10::Half, float>;
    case DType::kBFloat16:
      return &gemm_block_impl<c10::BFloat16, float>;
    case DType::kFloat8E4M3:  // (no kernel: the ops' checks refuse it)
      break;
  }
  return nullptr;
}

}  // namespace OPFORGE_CPU_VARIANT_NS
}  // namespace opforge
