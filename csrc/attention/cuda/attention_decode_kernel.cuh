// attention CUDA decode (sm_80+): few query rows (the GQA group x Sq <= decode_max_rows) against a
// long KV cache, split over the keys. A block is one (key chunk, kv head, batch row); it stages
// 64-key K and V tiles in shared memory (cp.async, two or three stages) and every warp reads them
// there, so each KV head is read from memory once for its whole query group. The rows run on tensor
// cores as one, two or four m16 tiles (attention_decode_mma_kernel). Only the tiles a sequence's
// queries may see are visited (a sliding window reads its last W keys; per-sequence key counts bound
// each sequence's own), tiles the segments or a block mask leave empty are neither read nor computed,
// partial ones test each element. Each block writes its rows' partial (max, sum, output) to a float
// workspace; a second kernel merges them (in a fixed order: deterministic) into the output and the
// LSE.
#pragma once

#include "attention/cuda/attention_decode_merge.cuh"
#include "attention/cuda/attention_decode_staging.cuh"

namespace opforge {
namespace attention_cuda {

// The decode kernel, on tensor cores (mma.sync): the block's query rows are kMTiles m16 tiles
// (padded with zeros); warp w takes m tile w / kKeyWarps and keys [kWarpKeys * (w % kKeyWarps),
// + kWarpKeys) of every staged tile (S = Q K^T and O += P V by mma.sync, P reused from the
// accumulators) and keeps its own softmax state; the warps of an m tile are combined in shared
// memory into the block's one partial state of its rows. No element conversions or redundant
// per-row work: the kernel reads K and V at the memory's pace for every row count it takes.
//   kStages: K/V tiles staged at once (kStages - 1 in flight while one is computed). Two at one m
//     tile (three blocks an SM at head dim 128, kMinBlocks, paged caches too); three for paged caches
//     at head dims 64 and 256.
//   kMTiles: 1, 2 or 4 m tiles (up to 16, 32, 64 rows; decode_max_rows(kD) the most a head dim
//     takes). kKeyWarps = 4 / kMTiles warps share a tile's 64 keys.
//   kQInRegisters: the rows' A fragments kept in registers for every tile (else read from shared
//     memory each tile: at head dim 256 with more than one m tile, where registers would spill).
//   kMinBlocks: blocks an SM must hold (registers capped for them; 1: no cap). Three at one m tile,
//     head dim 128 and two stages (218 registers would hold two; at 168 ptxas spills ~80 bytes, a few
//     L1 accesses a tile): B8 x 32k keys 300 us against 315 at two blocks and 329 at three stages
//     (H200, LOG.md "Serving (issue 47), session 2").
template <int kD_, int kStages_ = 2, int kMTiles_ = 1,
          int kMinBlocks_ = (kMTiles_ == 1 && kD_ == 128 && kStages_ == 2 ? 3 : 1)>
struct DecodeMmaTraits {
  static constexpr int kD = kD_;
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kRows = 16 * kMTiles_;
  static constexpr int kKeyWarps = kDecodeWarps / kMTiles_;
  static constexpr int kWarpKeys = kDecodeTile / kKeyWarps;
  static constexpr bool kQInRegisters = kMTiles_ == 1 || kD_ <= 128;
  static constexpr int kStages = kStages_;
  static constexpr int kRowBytes = kD_ * 2 + 16;  // staged K / V rows padded: ldmatrix rows in distinct banks
  static constexpr int kTileBytes = kDecodeTile * kRowBytes;
  static constexpr int smem_bytes() { return kRows * kRowBytes + kStages * 2 * kTileBytes; }
  static constexpr int kMinBlocks = kMinBlocks_;
  static_assert(kMTiles_ == 1 || kMTiles_ == 2 || kMTiles_ == 4);
  // (the stages hold the warps' states for the in-block combine after the last tile)
  static_assert((kDecodeWarps - kMTiles_) * (kD_ / 8 + 1) * 32 * 16 <= kStages * 2 * kTileBytes);
};

template <typename Tr, typename T>
__global__ void __launch_bounds__(kDecodeThreads, Tr::kMinBlocks)
    attention_decode_mma_kernel(const AttentionCudaArgs a, const DecodeSplit s) {
  constexpr int kD = Tr::kD, kSteps = kD / 16, kNd = kD / 8;
  constexpr int kKeyWarps = Tr::kKeyWarps, kWarpKeys = Tr::kWarpKeys, kN = kWarpKeys / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionParams& p = a.g.fwd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mt = warp / kKeyWarps, kw = warp % kKeyWarps;  // this warp's m tile and key share
  const DecodeWork work = decode_block_work(p, s);
  if (work.b < 0) return;
  const int64_t b = work.b, hk = work.hk, c = work.c;
  const AttentionPattern pat = p.pattern.at_unpacked(b);
  const int64_t group = p.heads / p.kv_heads, sq = pat.sq;
  const int rows = s.rows;
  unsigned char* sq_rows = smem;
  unsigned char* stages = smem + Tr::kRows * Tr::kRowBytes;

  // The rows (row r: head hk * group + r / sq, query r % sq), zeros past `rows`.
  for (int idx = threadIdx.x; idx < Tr::kRows * (kD / 8); idx += kDecodeThreads) {
    const int r = idx / (kD / 8), chunk = idx % (kD / 8);
    const bool in = r < rows;
    const int64_t h = hk * group + (in ? r / sq : 0), i = in ? r % sq : 0;
    cuda::cp_async16(sq_rows + r * Tr::kRowBytes + chunk * 16,
                     static_cast<const T*>(p.q) + b * p.q_bs + h * p.q_hs + i * p.q_ss + chunk * 8,
                     in ? 16 : 0);
  }
  cuda::cp_async_commit();

  int t0, t1;
  decode_chunk_tiles(pat, work.chunks, c, t0, t1);
  const SegmentRange q_range =
      pat.q_segments ? block_segment_range(pat.q_seg_blocks, pat.q_seg_nblocks, b, 0, sq) : SegmentRange{};

  const T* kbase = static_cast<const T*>(p.k) + hk * p.k_hs;
  const T* vbase = static_cast<const T*>(p.v) + hk * p.v_hs;
  // (a paged cache: each staging call takes the rows fetched one tile ahead)
  const auto fetch_pages = [&](int tile, int64_t sk) { return fetch_decode_page_rows<kD>(p, b, tile, sk); };
  DecodePageRows pages = fetch_pages(t0, pat.sk);
  const auto load_tile = [&](int tile, int stage) {
    const BlockKind kind =
        stage_decode_tile<Tr>(p, pat, b, hk, group, q_range, kbase, vbase, stages, stage, tile, pages);
    pages = fetch_pages(tile + 1, tile + 1 < t1 ? pat.sk : 0);
    return kind;
  };

  // Rows g and g + 8 of this warp's m tile: their heads and queries (for element tests), -1 for
  // padding rows.
  int64_t row_h[2], row_i[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = 16 * mt + g + 8 * half;
    row_h[half] = r < rows ? hk * group + r / sq : -1;
    row_i[half] = r < rows ? r % sq : 0;
  }
  // The m tile's A fragment of k step kk (ldmatrix from the staged rows).
  const auto load_q = [&](uint32_t(&frag)[4], int kk) {
    const int r = 16 * mt + (lane % 8) + 8 * ((lane / 8) % 2), col = kk * 16 + 8 * (lane / 16);
    cuda::ldmatrix_x4(frag, sq_rows + r * Tr::kRowBytes + col * 2);
  };
  uint32_t qa[Tr::kQInRegisters ? kSteps : 1][4];
  float o[kNd][4] = {}, m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
  const float scale = a.scale, cap = a.cap_log2 != 0.f ? a.cap_log2 / cuda::kLog2eFloat : 0.f;

  // The kinds of the staged tiles, two bits a stage (a register, not an indexed array).
  uint32_t kinds = 0;
#pragma unroll
  for (int st = 0; st < Tr::kStages - 1; ++st) {
    if (t0 + st < t1) {
      kinds |= static_cast<uint32_t>(load_tile(t0 + st, st)) << (2 * st);
    } else {
      cuda::cp_async_commit();  // (an empty group: the waits count groups)
    }
  }
  for (int tile = t0, it = 0; tile < t1; ++tile, ++it) {
    const int stage = it % Tr::kStages;
    const int ahead = tile + Tr::kStages - 1, ahead_stage = (it + Tr::kStages - 1) % Tr::kStages;
    if (ahead < t1) {
      kinds = (kinds & ~(3u << (2 * ahead_stage))) |
              (static_cast<uint32_t>(load_tile(ahead, ahead_stage)) << (2 * ahead_stage));
    } else {
      cuda::cp_async_commit();
    }
    cuda::cp_async_wait<Tr::kStages - 1>();  // this tile (and the rows) landed
    __syncthreads();
    const BlockKind kind = static_cast<BlockKind>((kinds >> (2 * stage)) & 3u);
    if constexpr (Tr::kQInRegisters) {
      if (it == 0) {  // the rows' A fragments, kept for every tile
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) load_q(qa[kk], kk);
      }
    }
    const unsigned char* sk = stages + stage * 2 * Tr::kTileBytes;
    const unsigned char* sv = sk + Tr::kTileBytes;
    const int64_t j0 = int64_t{tile} * kDecodeTile, j1 = min(j0 + kDecodeTile, pat.sk);
    const int key0 = kw * kWarpKeys;  // this warp's first key of the tile
    if (kind != BlockKind::kEmpty) {
      // S (16 rows x this warp's keys): n tiles of 8 keys, two per ldmatrix.
      float sc[kN][4] = {};
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        uint32_t qk[4];
        if constexpr (!Tr::kQInRegisters) load_q(qk, kk);
        const uint32_t(&qf)[4] = Tr::kQInRegisters ? qa[kk] : qk;
#pragma unroll
        for (int n = 0; n < kN; n += 2) {
          uint32_t kb[4];
          const int key = key0 + 8 * n + (lane % 8) + 8 * (lane / 16), col = kk * 16 + 8 * ((lane / 8) % 2);
          cuda::ldmatrix_x4(kb, sk + key * Tr::kRowBytes + col * 2);
          cuda::mma_m16n8k16<T>(sc[n], qf, kb);
          cuda::mma_m16n8k16<T>(sc[n + 1], qf, kb + 2);
        }
      }
      // Scale, softcap, the element tests; the rows' running max (over the quad of a row). The rows
      // are the GQA group's heads x queries (row r: head hk * group + r / sq, query r % sq), not one
      // head's consecutive queries as mask_tile_bits' bit sets take them: a partial tile tests each
      // element with the pattern's own visible(). The softmax runs in the natural-log domain (the
      // scale first, __expf); softmax_step's log2-domain form (the scale in the exponent's FFMA)
      // would change this kernel's instructions and rounding: kept until measured on a GPU.
      float mx[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e / 2;
          const int64_t j = j0 + key0 + 8 * n + 2 * t + (e % 2);
          float x = sc[n][e] * scale;
          if (cap != 0.f) x = cap * cuda::fast_tanh(x / cap);
          if (row_h[half] < 0 ||
              (kind == BlockKind::kPartial && (j >= j1 || !pat.visible(b, row_h[half], row_i[half], j)))) {
            x = kNegInf;
          }
          sc[n][e] = x;
          mx[half] = fmaxf(mx[half], x);
        }
      }
      float alpha[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        mx[half] = quad_max(mx[half]);
        const float m_new = fmaxf(m[half], mx[half]);
        // (a row with nothing visible yet keeps m = -inf: its p are 0, alpha 1)
        alpha[half] = m_new == kNegInf ? 1.f : __expf(m[half] - m_new);
        m[half] = m_new;
        l[half] *= alpha[half];
      }
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e / 2;
          sc[n][e] = m[half] == kNegInf ? 0.f : __expf(sc[n][e] - m[half]);
          l[half] += sc[n][e];
        }
      }
      rescale_rows(o, alpha);
      // O += P V, 16 keys a step: P as the A operand (pairs of the accumulators), V (16 keys x kD)
      // two 8-column n tiles per transposed ldmatrix.
#pragma unroll
      for (int ks = 0; ks < kN / 2; ++ks) {
        uint32_t pa[4];
        acc_to_a<T>(pa, sc, ks);
#pragma unroll
        for (int nd = 0; nd < kNd; nd += 2) {
          uint32_t vb[4];
          const int key = key0 + 16 * ks + (lane % 8) + 8 * ((lane / 8) % 2), col = 8 * (nd + lane / 16);
          cuda::ldmatrix_x4_trans(vb, sv + key * Tr::kRowBytes + col * 2);
          cuda::mma_m16n8k16<T>(o[nd], pa, vb);
          cuda::mma_m16n8k16<T>(o[nd + 1], pa, vb + 2);
        }
      }
    }
    __syncthreads();  // (the stage is refilled next)
  }

  // The warps of an m tile combined (warps kw > 0 hand theirs to the m tile's first warp through the
  // idle stages, each lane's fragments side by side), then written as this block's partial state of
  // rows 16 mt + g, + 8.
#pragma unroll
  for (int half = 0; half < 2; ++half) l[half] = quad_sum(l[half]);
  cuda::cp_async_wait<0>();  // (no copy is left in flight where the states go, or when the block ends)
  if constexpr (kKeyWarps > 1) {
    // [m tile][warp kw 1 .. kKeyWarps - 1][kNd + 1][32 lanes]
    float4* handoff = reinterpret_cast<float4*>(stages) + mt * (kKeyWarps - 1) * (kNd + 1) * 32;
    if (kw > 0) {
      float4* mine = handoff + (kw - 1) * (kNd + 1) * 32 + lane;
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd) mine[nd * 32] = make_float4(o[nd][0], o[nd][1], o[nd][2], o[nd][3]);
      mine[kNd * 32] = make_float4(m[0], m[1], l[0], l[1]);
    }
    __syncthreads();
    if (kw > 0) return;
    float f[kKeyWarps][2];  // each warp's weight, per half
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mw[kKeyWarps], lw[kKeyWarps], mx = m[half];
      mw[0] = m[half], lw[0] = l[half];
#pragma unroll
      for (int w = 1; w < kKeyWarps; ++w) {
        const float4 ml = handoff[((w - 1) * (kNd + 1) + kNd) * 32 + lane];
        mw[w] = half == 0 ? ml.x : ml.y;
        lw[w] = half == 0 ? ml.z : ml.w;
        mx = fmaxf(mx, mw[w]);
      }
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) {
        f[w][half] = mw[w] == kNegInf ? 0.f : __expf(mw[w] - mx);
        sum += f[w][half] * lw[w];
      }
      m[half] = mx, l[half] = sum;
    }
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd) {
      o[nd][0] *= f[0][0], o[nd][1] *= f[0][0], o[nd][2] *= f[0][1], o[nd][3] *= f[0][1];
#pragma unroll
      for (int w = 1; w < kKeyWarps; ++w) {
        const float4 x = handoff[((w - 1) * (kNd + 1) + nd) * 32 + lane];
        o[nd][0] += f[w][0] * x.x, o[nd][1] += f[w][0] * x.y, o[nd][2] += f[w][1] * x.z,
            o[nd][3] += f[w][1] * x.w;
      }
    }
  }
  const int64_t task = (b * p.kv_heads + hk) * s.chunks + c;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = 16 * mt + g + 8 * half;
    if (r >= rows) continue;
    float* out = s.part + (task * rows + r) * decode_part_stride(kD);
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd) {
      *reinterpret_cast<float2*>(out + 8 * nd + 2 * t) = make_float2(o[nd][2 * half], o[nd][2 * half + 1]);
    }
    if (t == 0) out[kD] = m[half], out[kD + 1] = l[half];
  }
}

// The kernel's shared-memory limit raised to what it takes, once per device (cuda::configure_once; a
// binary without its code answers cudaErrorNoKernelImageForDevice).
template <typename Tr, typename T>
cudaError_t configure_decode_mma() {
  static signed char state[64] = {};
  return cuda::configure_once(attention_decode_mma_kernel<Tr, T>, Tr::smem_bytes(), state,
                              [](const cudaFuncAttributes&) { return true; });
}

template <typename Tr, typename T>
cudaError_t launch_decode_mma(const AttentionCudaArgs& a, DecodeSplit s, cudaStream_t stream) {
  constexpr int kD = Tr::kD;
  const AttentionParams& p = a.g.fwd;
  if (s.rows < 1 || s.rows > Tr::kRows) return cudaErrorInvalidValue;
  const cudaError_t err = configure_decode_mma<Tr, T>();
  if (err != cudaSuccess) return err;
  const dim3 grid = s.blocks ? dim3(static_cast<unsigned>(s.blocks))
                             : dim3(static_cast<unsigned>(s.chunks), static_cast<unsigned>(p.kv_heads),
                                    static_cast<unsigned>(p.batch));
  attention_decode_mma_kernel<Tr, T><<<grid, kDecodeThreads, Tr::smem_bytes(), stream>>>(a, s);
  cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  const int64_t rows = p.batch * p.kv_heads * s.rows;
  attention_decode_merge_kernel<kD, T><<<static_cast<unsigned>(rows), kMergeThreads, 0, stream>>>(a, s);
  return cudaGetLastError();
}

// The decode kernel for `rows` query rows: the fewest m tiles that hold them. Paged caches at one m
// tile: at head dim 128 two stages and three blocks an SM, as contiguous caches (B32 x U(4k, 8k) at
// pages of 16 and 64: 1.3x the three-stage kernel, LOG.md "Serving (issue 47), session 5"); at head
// dims 64 and 256 three stages (the page-table rows add latency a tile that two stages do not cover at
// two blocks an SM: 4-5 % at B8 x 32k, LOG.md "Serving (issue 32), session 2"); more m tiles keep two
// stages. `f` is called with a value of the traits type.
template <int kD, typename F>
decltype(auto) with_decode_traits(int rows, bool paged, F&& f) {
  static_assert(decode_max_rows(kD) == 2 * kDecodeMmaRows || decode_max_rows(kD) == 4 * kDecodeMmaRows);
  if constexpr (decode_max_rows(kD) > 2 * kDecodeMmaRows) {
    if (rows > 2 * kDecodeMmaRows) return f(DecodeMmaTraits<kD, 2, 4>{});
  }
  if (rows > kDecodeMmaRows) return f(DecodeMmaTraits<kD, 2, 2>{});
  if constexpr (kD != 128) {
    if (paged) return f(DecodeMmaTraits<kD, 3, 1>{});
  }
  return f(DecodeMmaTraits<kD, 2, 1>{});
}

template <int kD>
int run_decode(const AttentionCudaArgs& a, const DecodeSplit& s, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  return with_decode_traits<kD>(s.rows, a.g.fwd.block_table != nullptr, [&](auto tr) -> int {
    using Tr = decltype(tr);
    switch (a.g.fwd.dtype) {
      case DType::kBFloat16:
        return launch_decode_mma<Tr, __nv_bfloat16>(a, s, st);
      case DType::kFloat16:
        return launch_decode_mma<Tr, __half>(a, s, st);
      default:
        return cudaErrorInvalidValue;
    }
  });
}

// Resident decode blocks of `rows` query rows an SM holds, on a paged cache or not (the float16 and
// bfloat16 kernels use the same resources); 0 where the binary has no kernel for this GPU.
template <int kD>
int decode_blocks_per_sm(int rows, bool paged) {
  return with_decode_traits<kD>(rows, paged, [](auto tr) -> int {
    using Tr = decltype(tr);
    if (configure_decode_mma<Tr, __nv_bfloat16>() != cudaSuccess) return 0;
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, attention_decode_mma_kernel<Tr, __nv_bfloat16>,
                                                      kDecodeThreads, Tr::smem_bytes()) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return blocks;
  });
}

}  // namespace attention_cuda
}  // namespace opforge
