// attention CUDA forward for Hopper in FP8 (sm_90a): q, k, v in float8_e4m3fn with FlashAttention-3's
// descale factors (AttentionParams::q_descale..., (batch, kv_heads)), the output bfloat16.
// FlashAttention-3's design on the one-item kernel's pieces (attention_fwd_hopper_kernel.cuh):
//   - S = Q K^T by 8-bit wgmma (k 32 a step), both tiles K-major as TMA lands them (128 columns of
//     a 128-byte row a panel); q's and k's descales and the softmax scale in the exponent's factor;
//   - P V: 8-bit wgmma reads its B operand K-major only, so V (keys x head dim in memory) is
//     transposed in shared memory. The TMA lands a raw V tile in a ring of its own (FwdSmem::vraw,
//     FwdSmem::pvr); the producer warpgroup's warps 1-3 (kTransposeWarps) transpose it into the
//     stage's V slot (head dim rows of 128 keys) and hand that to the consumers (their arrivals on
//     the stage's full barrier), warp 0 issuing the copies as in the 16-bit kernel;
//   - P is rounded to e4m3 in registers (acc_to_a): an 8-bit A fragment holds 4 consecutive k of a
//     row, the accumulator pairs of columns, so the transposed tile's keys come in P's order
//     (fp8_key_of) and no register moves between lanes; P is scaled by 2^kPOffset (256: the row
//     max offset by 8 in exp2, FA3's choice) so that probabilities down to 2^-17 stay normal e4m3;
//   - the output O / l times v's descale, staged through the raw V ring (free once the last tile's
//     transposes are done) and stored as bfloat16.
// The plain form only (no block mask, no KV cache), head dims 128 (the launcher zero-pads narrower
// ones): attention_fp8_cuda (attention_cuda.cpp) refuses the rest.
#pragma once

#include "attention/cuda/attention_fwd_hopper_launch.cuh"

namespace opforge {
namespace attention_cuda {

// One warp's share (tw of Tr::kTransposeWarps) of a V tile's transpose: src, the raw tile (kBlockN
// key rows of kDV bytes in TMA's 128-byte swizzle, 128-column panels kBlockN * 128 bytes apart) into
// dst, kDV rows of the tile's keys (128-key panels of Tr::kVPanelBytes, the same swizzle), position
// 4 c + i of each 16-key group holding key 2 c + (i & 1) + 8 (i >> 1) of it (fp8_key_of).
// A warp step is one 16-key group g and 32 columns (8 quads m of 4 bytes): lane (m, c) reads 4
// words (rows 16 g + fp8_key_of(4 c + i), bytes 4 m ..), transposes them by byte permutes and
// writes 4 words (rows 4 m + j, positions 4 c ..). Both sides are free of bank conflicts: a read's
// 32 lanes cover 8 rows' different 16-byte chunks times 4 words; a write's lanes start at different
// j (rotated by (m / 2) % 4), so that their 8 rows fall in 8 different chunks.
template <typename Tr>
__device__ __forceinline__ void fwd_transpose_v_fp8(const unsigned char* src, unsigned char* dst, int tw,
                                                    int lane) {
  constexpr int kBN = Tr::kBlockN, kDV = Tr::kDV;
  constexpr int kSteps = (kBN / 16) * (kDV / 32);
  const int c = lane % 4, mi = lane / 4, rot = (mi >> 1) & 3;
  const uint32_t s0 = cuda::smem_addr(src), d0 = cuda::smem_addr(dst);
#pragma unroll 2
  for (int step = tw; step < kSteps; step += Tr::kTransposeWarps) {
    const int g = step / (kDV / 32), m = (step % (kDV / 32)) * 8 + mi;
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * g + fp8_key_of(4 * c + i);
      const int col = (m * 4) % 128;  // (the byte in the panel's row)
      w[i] = cuda::ld_shared_u32(s0 + (m / 32) * (kBN * 128) + r * 128 +
                                 (cuda::swizzle128_chunk(r, col / 16) * 16) + col % 16);
    }
    // 4 x 4 bytes transposed: out[j] = byte j of w[0..3]
    const uint32_t t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
    uint32_t out[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632), __byte_perm(t1, t3, 0x5410),
                       __byte_perm(t1, t3, 0x7632)};
    // slot s holds out[(s + rot) % 4]
    if (rot & 1) {
      const uint32_t x = out[0];
      out[0] = out[1], out[1] = out[2], out[2] = out[3], out[3] = x;
    }
    if (rot & 2) {
      uint32_t x = out[0];
      out[0] = out[2], out[2] = x;
      x = out[1];
      out[1] = out[3], out[3] = x;
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int row = 4 * m + ((s + rot) & 3), pg = g % 8;  // (the group within its 128-key panel)
      cuda::st_shared_u32(
          d0 + (g / 8) * Tr::kVPanelBytes + row * 128 + cuda::swizzle128_chunk(row, pg) * 16 + c * 4, out[s]);
    }
  }
}

template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    attention_fwd_hopper_fp8_kernel(const __grid_constant__ CUtensorMap map_q,
                                    const __grid_constant__ CUtensorMap map_k,
                                    const __grid_constant__ CUtensorMap map_v, const AttentionCudaArgs a,
                                    const int group_pairs) {
#ifdef OPFORGE_ATTENTION_WGMMA_DEVICE
  static_assert(Tr::kFp8, "the FP8 form's traits");
  using T = __nv_fp8_e4m3;
  constexpr int kD = Tr::kD, kBM = Tr::kBlockM, kBN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kDT = Tr::kDV / 8;
  using cuda::smem_addr;
  using State = cuda::PipelineState<kStages>;
  extern __shared__ unsigned char smem_raw[];
  const FwdSmem<Tr> sm(cuda::align_shared<1024>(smem_raw));
  const AttentionParams& p = a.g.fwd;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  int64_t b, h, qb;
  if (!fwd_block_item<Tr>(p, group_pairs, b, h, qb)) return;
  const AttentionPattern pat = p.pattern.at(b);
  const int64_t i0 = qb * kBM, i1 = min(i0 + kBM, pat.sq);
  if (threadIdx.x == 0) {
    cuda::mbar_init(smem_addr(sm.q_full), 1);
    sm.pk.init(Tr::kConsumers);
    sm.pv.init(Tr::kConsumers, Tr::kTransposeWarps);  // (filled by the transposing warps' arrivals)
    sm.pvr.init(Tr::kTransposeWarps);
    cuda::fence_mbarrier_init();
  }
  __syncthreads();
  const int hk = static_cast<int>(h / (p.heads / p.kv_heads));

  if (wg == 0) {
    cuda::setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp != 0) {  // the transposing warps: each raw V tile into its stage's V slot, to the end flag
      State r;
      for (;; r.advance()) {
        sm.pvr.consumer_wait(r);
        if (sm.vinfo[r.index].x < 0) break;
        sm.pv.producer_acquire(r);
        fwd_transpose_v_fp8<Tr>(sm.vraw + r.index * Tr::kVRawBytes,
                                sm.kv + r.index * Tr::kStageBytes + Tr::kKVBytes, warp - 1, lane);
        // (the stores before the consumers' wgmma reads, the raw tile's reads before its next copy)
        cuda::fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) {
          sm.pv.producer_arrive(r);
          sm.pvr.consumer_release(r);
        }
      }
      return;
    }
    KeyWalk<kBN, kD, 32, T> walk(p, pat, b, h, i0, i1);
    const int tb = static_cast<int>(p.pattern.tensor_batch(b));
    const int q_row0 = static_cast<int>(p.pattern.q_start(b)),
              k_row0 = static_cast<int>(p.pattern.k_start(b));
    if (lane == 0) {
      cuda::mbar_arrive_expect_tx(smem_addr(sm.q_full), Tr::kQBytes);
#pragma unroll
      for (int pn = 0; pn < Tr::kPanels; ++pn) {
        cuda::tma_load_4d(smem_addr(sm.q + pn * Tr::kQPanelBytes), &map_q, pn * Tr::kPanelCols,
                          q_row0 + static_cast<int>(i0), static_cast<int>(h), tb, smem_addr(sm.q_full));
      }
    }
    TileClass tc;
    State w;
    for (int tile = walk.next(walk.begin, tc, lane); tile < walk.end;
         tile = walk.next(tile + 1, tc, lane), w.advance()) {
      if (lane == 0) {
        unsigned char* const sK = sm.kv + w.index * Tr::kStageBytes;
        sm.pk.producer_acquire(w);
        sm.info[w.index] = make_int4(tile, tile_class_bits(tc), 0, 0);
        const uint32_t kb = sm.pk.producer_commit(w, Tr::kKVBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kPanels; ++pn) {
          cuda::tma_load_4d(smem_addr(sK + pn * Tr::kKVPanelBytes), &map_k, pn * Tr::kPanelCols,
                            k_row0 + tile * kBN, hk, tb, kb);
        }
        sm.pvr.producer_acquire(w);
        sm.vinfo[w.index] = make_int4(1, 0, 0, 0);
        const uint32_t vb = sm.pvr.producer_commit(w, Tr::kVRawBytes);
#pragma unroll
        for (int pn = 0; pn < Tr::kDV / Tr::kPanelCols; ++pn) {
          cuda::tma_load_4d(smem_addr(sm.vraw + w.index * Tr::kVRawBytes + pn * kBN * 128), &map_v,
                            pn * Tr::kPanelCols, k_row0 + tile * kBN, hk, tb, vb);
        }
      }
      __syncwarp();
    }
    if (lane == 0) {  // the end: a K stage with no tile, a raw V stage with the end flag
      sm.pk.producer_acquire(w);
      sm.info[w.index] = make_int4(-1, 0, 0, 0);
      cuda::mbar_arrive(smem_addr(&sm.pk.full[w.index]));
      sm.pvr.producer_acquire(w);
      sm.vinfo[w.index] = make_int4(-1, 0, 0, 0);
      cuda::mbar_arrive(smem_addr(&sm.pvr.full[w.index]));
    }
    return;
  }

  cuda::setmaxnreg_inc<Tr::kConsumerRegs>();
  const int half = __shfl_sync(0xffffffffu, wg, 0) - 1, next = (half + 1) % Tr::kConsumers;
  const int64_t row0 = i0 + half * 64 + warp * 16;
  float o[kDT][4];
#pragma unroll
  for (int n = 0; n < kDT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.f, 0.f};
  const int64_t di = b * p.kv_heads + hk;  // (the descales' entry)
  const float descale_qk = (p.q_descale ? p.q_descale[di] : 1.f) * (p.k_descale ? p.k_descale[di] : 1.f);
  const float descale_v = p.v_descale ? p.v_descale[di] : 1.f;
  cuda::mbar_wait(smem_addr(sm.q_full), 0);
  if (Tr::kPingPong && half == Tr::kConsumers - 1) cuda::named_barrier_arrive<256>(kFwdBarTurn);
  // (the raw scores' factor: the softmax scale times q's and k's descales; raw scores need it > 0)
  const float scale_qk = a.scale_log2 * descale_qk;
  const bool raw_scores = a.cap_log2 == 0.f && scale_qk > 0.f;
  const float k = raw_scores ? scale_qk : 1.f;
  State rk, rv;
  fwd_consumer_item<Tr, T>(sm, a, pat, b, h, row0, half, next, t, rk, rv, o, m_run, l_run, raw_scores, k,
                           descale_qk);
  // (P and so O carry 2^kPOffset: the sums divided by it give the LSE and the sinks' totals, and
  // the output's factor takes it out of O with v's descale)
  l_run[0] = ldexpf(l_run[0], -Tr::kPOffset), l_run[1] = ldexpf(l_run[1], -Tr::kPOffset);
  float inv[2];
  finish_rows(m_run, l_run, inv, p, pat.sq, b, h, row0, lane, k);
  const float out_factor = ldexpf(descale_v, -Tr::kPOffset);
  inv[0] *= out_factor, inv[1] *= out_factor;
  store_accumulator_rows<Tr::kDV, __nv_bfloat16>(o, inv, sm.vraw + half * 64 * 2 * Tr::kDV, 64 * 128,
                                                 static_cast<__nv_bfloat16*>(p.out) + p.o_at(b, h), p.o_ss,
                                                 i0 + half * 64, pat.sq, t, 1 + half);
#else
  __trap();
#endif
}

template <typename Tr>
cudaError_t launch_hopper_fwd_fp8(const AttentionCudaArgs& a, cudaStream_t stream) {
  static signed char state[64] = {};
  const cudaError_t err = prepare_hopper(attention_fwd_hopper_fp8_kernel<Tr>, Tr::kSmemBytes, state);
  if (err != cudaSuccess) return err;
  return launch_fwd_items<Tr>(attention_fwd_hopper_fp8_kernel<Tr>, a, stream);
}

// The FP8 forward of traits Tr (the generated instantiations' entry): float8_e4m3fn operands only.
template <typename Tr>
int run_hopper_fwd_fp8(const AttentionCudaArgs& a, void* stream) {
  if (a.g.fwd.dtype != DType::kFloat8E4M3) return cudaErrorInvalidValue;
  return launch_hopper_fwd_fp8<Tr>(a, static_cast<cudaStream_t>(stream));
}

}  // namespace attention_cuda
}  // namespace opforge
