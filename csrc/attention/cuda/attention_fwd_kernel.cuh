// attention CUDA forward, mma.sync (sm_80+): one block per kBlockM queries of one (batch, head),
// one warp per 16 query rows. Q stays in shared memory (or registers); K and V tiles of kBlockN
// keys stream through a two-stage cp.async ring, the next visible tile's copy under this one's
// work. Per tile: S = Q K^T on tensor cores, the partial tiles' masked elements -inf, online
// softmax in the log2 domain (row max and sum in registers, the quad's lanes combined by
// shuffles), O += P V with P rounded to the operand type. Tiles the pattern leaves empty are never
// visited, full tiles take no mask arithmetic. Rows that see nothing give zeros and LSE -inf.
#pragma once

#include "attention/cuda/attention_mask.cuh"
#include "attention/cuda/attention_softmax.cuh"
#include "attention/cuda/attention_tile.cuh"
#include "attention/cuda/attention_walk.cuh"

namespace opforge {
namespace attention_cuda {

// The shipped forward configurations: tile shape by head dim.
template <int kD_, int kBlockM_, int kBlockN_>
struct FwdTraits {
  static constexpr int kD = kD_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarps = kBlockM / 16, kThreads = kWarps * 32;
  static constexpr bool kQInRegisters = kD <= 128;  // 16 kD / 32 ... registers a thread
  static constexpr int kQBytes = kBlockM * kD * 2, kKVBytes = kBlockN * kD * 2;
  static constexpr int kSmemBytes = kQBytes + 4 * kKVBytes;  // Q; K and V of two stages
};
using FwdTraitsD64 = FwdTraits<64, 128, 128>;
using FwdTraitsD128 = FwdTraits<128, 128, 64>;
using FwdTraitsD256 = FwdTraits<256, 64, 32>;

template <typename Tr, typename T>
__global__ void __launch_bounds__(Tr::kThreads, 1) attention_fwd_kernel(const AttentionCudaArgs a) {
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kThreads = Tr::kThreads;
  constexpr int kNT = kBN / 8, kDT = kD / 8, kKK = kD / 16;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sQ = cuda::smem_addr(smem), sKV = sQ + Tr::kQBytes;
  const AttentionParams& p = a.g.fwd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int64_t h = blockIdx.y;
  int64_t b, qb;  // the last query blocks (the most keys when causal) first
  if (!block_tile(p, false, kBM, gridDim.x - 1 - blockIdx.x, blockIdx.z, b, qb)) return;
  const AttentionPattern pat = p.pattern.at(b);
  const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
  const T* qg = static_cast<const T*>(p.q) + p.q_at(b, h);

  load_rows<kBM, kD, kThreads>(sQ, qg, p.q_ss, i0, pat.sq, tid);
  cuda::cp_async_commit();
  KeyWalk<kBN, kD, kThreads, T> walk(p, pat, b, h, i0, i1);
  TileClass tc, tn_class;
  int tile = walk.next(walk.begin, tc, lane);
  if (tile < walk.end)
    walk.load(sKV, tile, tid, walk.rows_of(tile, tid));
  else
    cuda::cp_async_commit();  // (an empty group: the wait below counts two)
  // The next visible tile, and (a paged cache) its rows' pages, found one tile ahead.
  int tn = walk.next(tile + 1, tn_class, lane);
  auto tn_rows = walk.rows_of(tn, tid);

  float o[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.f, 0.f};
  uint32_t qf[Tr::kQInRegisters ? kKK : 1][4];
  cuda::cp_async_wait<1>();  // Q landed (the K/V group may still be in flight)
  __syncthreads();
  if constexpr (Tr::kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < kKK; ++kk) frag_a<kD>(qf[kk], sQ, warp * 16, kk, lane);
  }

  int stage = 0;
  while (tile < walk.end) {
    cuda::cp_async_wait<0>();
    __syncthreads();  // this stage landed; every warp is done with the other one
    if (tn < walk.end) walk.load(sKV + (stage ^ 1) * 2 * Tr::kKVBytes, tn, tid, tn_rows);
    TileClass tnn_class;
    const int tnn = walk.next(tn + 1, tnn_class, lane);
    tn_rows = walk.rows_of(tnn, tid);
    const uint32_t sK = sKV + stage * 2 * Tr::kKVBytes, sV = sK + Tr::kKVBytes;

    float s[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKK; ++kk) {
      uint32_t af[4];
      if constexpr (Tr::kQInRegisters) {
#pragma unroll
        for (int e = 0; e < 4; ++e) af[e] = qf[kk][e];
      } else {
        frag_a<kD>(af, sQ, warp * 16, kk, lane);
      }
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t bf[4];
        frag_b<kD>(bf, sK, np * 16, kk, lane);
        mma_m16n8k16<T>(s[2 * np], af, bf);
        mma_m16n8k16<T>(s[2 * np + 1], af, bf + 2);
      }
    }
    scores_log2(s, a);
    if (tc.kind == BlockKind::kPartial) {
      mask_tile<false, kBN>(s, pat, tc, b, h, i0 + warp * 16, int64_t{tile} * kBN, lane);
    }
    online_softmax(s, o, m_run, l_run);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t af[4];
      acc_to_a<T>(af, s, kk);
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t bf[4];
        frag_b_trans<kD>(bf, sV, kk * 16, dp, lane);
        mma_m16n8k16<T>(o[2 * dp], af, bf);
        mma_m16n8k16<T>(o[2 * dp + 1], af, bf + 2);
      }
    }
    tile = tn, tn = tnn;
    tc = tn_class, tn_class = tnn_class;
    stage ^= 1;
  }

  // Epilogue: O / l through this warp's rows of the Q tile (no other warp reads them) to 16-byte
  // stores; the LSE (natural log) by the quad's first lane.
  float inv[2];
  finish_rows(m_run, l_run, inv, p, pat.sq, b, h, i0 + warp * 16, lane);
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kDT; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + 8 * r;
      cuda::st_shared_u32(sQ + tile_offset<kD>(row, n) + t4 * 4,
                          pack2<T>(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]));
    }
  }
  __syncwarp();
  T* og = static_cast<T*>(p.out) + p.o_at(b, h);
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int n = 0; n < 16 * kChunks / 32; ++n) {
    const int idx = lane + n * 32, r = idx / kChunks, c = idx % kChunks;
    const int64_t i = i0 + warp * 16 + r;
    if (i < pat.sq) {
      const uint4 v = *reinterpret_cast<const uint4*>(smem + tile_offset<kD>(warp * 16 + r, c));
      *reinterpret_cast<uint4*>(og + i * p.o_ss + c * 8) = v;
    }
  }
}

template <typename Tr, typename T>
cudaError_t launch_fwd(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  const cudaError_t err = prepare_kernel(attention_fwd_kernel<Tr, T>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  int64_t x, z;
  tile_grid(a.g.fwd, false, Tr::kBlockM, x, z);
  if (x > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(a.g.fwd.heads), static_cast<unsigned>(z));
  attention_fwd_kernel<Tr, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename Tr>
int run_fwd(const AttentionCudaArgs& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.g.fwd.dtype) {
    case DType::kBFloat16:
      return launch_fwd<Tr, __nv_bfloat16>(a, s);
    case DType::kFloat16:
      return launch_fwd<Tr, __half>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace attention_cuda
}  // namespace opforge
