// Backward pass 2: dK and dV. One CTA of two warpgroups per (document, 128-key block, KV head) owns
// those keys' gradients (64 keys per warpgroup, sharing every query tile in shared memory); it walks
// the query heads of its KV group and, for each, the 64-query tiles (counted from the document
// start, tiling::kBwdQueryTile) that see its keys. Per tile, with the keys as rows (S^T and E^T come
// out of the tensor cores already transposed):
//   S^T = K codes . Q codes^T,  p_ij = 2^(S_ij 2^(ek_j + eq_i) scale log2(e) - LSE_i log2(e))
//   E^T = V codes . dO codes^T, E_ij = E^T_ji 2^(ev_j + eg_i),  U_ij = p_ij (E_ij - D_i)
//   dV_j += sum_i E4M3(p_ij 2^(boost + eg_i - gamma)) cg_i          (times 2^(gamma - boost))
//   dK_j += 2^tau_j sum_i E4M3(U_ij 2^(eq_i - tau_j)) cq_i,  tau_j: ceil scale of max_i |U_ij 2^eq_i|
// with gamma the document's largest dO exponent over the group's query heads and tau_j one scale
// per (key, query tile), as
// docs/NUMERICS.md and the emulation (reference::mxfp8_backward) define them. dK is scaled by the
// softmax scale at the end.
// Query tiles are double-buffered cp.async copies (Q and dO rows, and Q^T, dO^T from the
// quantizer's transposed layouts), with their per-query constants loaded one tile ahead.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/operand_layout.h"
#include "core/tiling.h"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/sm90/backward.h"
#include "cuda/document_span.cuh"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/launch.cuh"
#include "cuda/sm90/smem_stage.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kWarpgroups = 2;                      // both read each query tile: half the L2 traffic of one
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kWarpgroupRows = 64;                  // keys per warpgroup: the m64 of every product
constexpr int kKeyRows = kWarpgroupRows * kWarpgroups;  // keys per CTA
constexpr int kQueryTile = tiling::kBwdQueryTile;   // queries per step: tau's group
static_assert(kQueryTile == 64, "S^T is one m64n64 product per k-step");
static_assert(tiling::kBwdKeyTile % kKeyRows == 0, "a CTA's keys lie inside one backward key tile");
static_assert(kQueryTile <= kThreads, "one thread loads each query's constants");

// Per-query constants of a tile: {2^eq_i, 2^eg_i, 2^(boost + eg_i - gamma), -LSE_i log2(e)}, D_i.
struct QueryTileConsts {
  float4 c[kQueryTile];
  float delta[kQueryTile];
};

// One query tile's operands: the double buffer holds two.
template <int D>
struct DkdvQueryStage {
  uint8_t q[kQueryTile * D];   // rows form (B of S^T)
  uint8_t g[kQueryTile * D];   // rows form (B of E^T)
  uint8_t qt[D * kQueryTile];  // transposed form, queries permuted (B of dK)
  uint8_t gt[D * kQueryTile];  // transposed form, queries permuted (B of dV)
  QueryTileConsts consts;
};
template <int D>
struct DkdvShared {
  uint8_t k[kKeyRows * D];  // rows form (A of S^T)
  uint8_t v[kKeyRows * D];  // rows form (A of E^T)
  DkdvQueryStage<D> stage[2];
};
static_assert(sizeof(DkdvShared<128>) + 1024 <= 228 * 1024, "a CTA must fit in shared memory");

// The (query head, query tile) steps of a CTA, in order: each head of the KV group, and for it the
// 64-query tiles (counted from the document start) from q_begin to the document end.
struct QuerySteps {
  int first_head, q_begin, tiles_per_head;
  __device__ int head(int step) const { return first_head + step / tiles_per_head; }
  __device__ int q0(int step) const { return q_begin + step % tiles_per_head * kQueryTile; }
};

// Query q0 + threadIdx.x's inputs to its constants (threads below kQueryTile; clamped into the
// document: masked queries' values are unused).
struct QueryInputs {
  uint8_t q_scale, g_scale;
  float lse, delta;
};
__device__ __forceinline__ QueryInputs load_query_inputs(const BackwardParams& p, const DocumentSpan& d, int h, int q0) {
  if (threadIdx.x >= kQueryTile) return {};
  const int64_t token = d.begin + min(q0 + int(threadIdx.x), d.len - 1);
  const int64_t s = token * p.q_heads + h;
  return {p.q_scales[s], p.g_scales[s], p.lse[int64_t(h) * p.total_tokens + token],
          p.delta[int64_t(h) * p.total_tokens + token]};
}
__device__ __forceinline__ void store_query_consts(const QueryInputs& in, int gamma, int p_boost_log2,
                                                   QueryTileConsts& c) {
  if (threadIdx.x >= kQueryTile) return;
  constexpr float kLog2e = 1.4426950408889634f;
  const int eg = scale_exponent(in.g_scale);
  const float p_fold = pow2i(gamma == kNaNExponent ? kNaNExponent : add_exponents(eg, p_boost_log2 - gamma));
  c.c[threadIdx.x] = make_float4(pow2_of_scale(in.q_scale), pow2i(eg), p_fold, -(in.lse * kLog2e));
  c.delta[threadIdx.x] = in.delta;
}

template <int D>
__device__ __forceinline__ void copy_query_tile_async(const BackwardParams& p, const DocumentSpan& d, int64_t doc_slot,
                                                      int h, int q0, DkdvQueryStage<D>& st) {
  const int64_t q_pitch = int64_t(p.q_heads) * D, q_offset = (int64_t(d.begin + q0) * p.q_heads + h) * D;
  const int64_t t_offset = int64_t(h) * D * p.t_pitch + doc_slot + q0;
  copy_tile_async<kQueryTile, D, kThreads>(p.q_codes + q_offset, q_pitch, d.len - q0, D, st.q);
  copy_tile_async<kQueryTile, D, kThreads>(p.g_codes + q_offset, q_pitch, d.len - q0, D, st.g);
  copy_tile_async<D, kQueryTile, kThreads>(p.q_codes_t + t_offset, p.t_pitch, D, d.len - q0, st.qt);
  copy_tile_async<D, kQueryTile, kThreads>(p.g_codes_t + t_offset, p.t_pitch, D, d.len - q0, st.gt);
}

// A masked tile (pairs some key must not enter), element by element as the emulation states it:
// P~ = E4M3(p 2^(boost + eg - gamma)) packed into pa (dV's A operand) step by step, so that S^T's
// registers free up early (dK, dV and S^T, E^T would not fit in registers together at D = 128);
// e becomes U 2^eq (dK's, before tau); both 0 on invisible pairs; amax the key row's max of |U 2^eq|.
__device__ __forceinline__ void masked_pu(const float (&s)[kQueryTile / 2], float (&e)[kQueryTile / 2],
                                          const QueryTileConsts& qc, const float (&k_factor)[2],
                                          const float (&v_pow)[2], const int (&keys)[2], const DocumentSpan& d, int q0,
                                          bool causal, int t, float (&amax)[2], uint32_t (&pa)[kQueryTile / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kQueryTile / 32; ++kk) {
    float pf[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
#pragma unroll
      for (int el = 0; el < 4; ++el) {
        const int x = (kk * 4 + b) * 4 + el;
        const int r = el >> 1, i = (kk * 4 + b) * 8 + 2 * t + (el & 1), query = q0 + i;
        const bool visible = keys[r] < d.len && query < d.len && (!causal || keys[r] <= query);
        float pv = 0.f, w = 0.f;
        if (visible) {
          const float4 c = qc.c[i];  // q_pow, g_pow, p_fold, -lse2
          const float pij = exp2f(s[x] * k_factor[r] * c.x + c.w);
          const float eij = e[x] * v_pow[r] * c.y;
          pv = pij * c.z;
          w = pij * (eij - qc.delta[i]) * c.x;
        }
        pf[b][el] = pv;
        e[x] = w;
        amax[r] = nan_max(amax[r], fabsf(w));
      }
    }
    pack_a_step(pf, pa[kk]);
  }
}

// An interior tile (every pair visible): the same numbers with fewer instructions per element, as
// in backward_dq.cu's interior_u: no mask, the exponent as one fused multiply-add, 2^x on the MUFU
// unit with subnormal results flushed (p < 2^-126 moves dK and dV by less than 2^-126 times
// |E - D| 2^eq or 2^(boost + eg - gamma): nothing next to the rows' probability mass), fmaxf for
// the max (a NaN U element still makes its E4M3 code, and so the key's dK, NaN).
__device__ __forceinline__ void interior_pu(const float (&s)[kQueryTile / 2], float (&e)[kQueryTile / 2],
                                            const QueryTileConsts& qc, const float (&k_factor)[2],
                                            const float (&v_pow)[2], int t, float (&amax)[2],
                                            uint32_t (&pa)[kQueryTile / 32][4]) {
  // Two partial maxima per row (exact in any order): shorter dependency chains.
  float part_max[2][2] = {{amax[0], amax[0]}, {amax[1], amax[1]}};
#pragma unroll
  for (int kk = 0; kk < kQueryTile / 32; ++kk) {
    float pf[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int nb = kk * 4 + b;
      const float4 c2[2] = {qc.c[nb * 8 + 2 * t], qc.c[nb * 8 + 2 * t + 1]};
      const float2 dl = *reinterpret_cast<const float2*>(qc.delta + nb * 8 + 2 * t);
#pragma unroll
      for (int el = 0; el < 4; ++el) {
        const int r = el >> 1, x = nb * 4 + el;
        const float4 c = c2[el & 1];
        const float pij = exp2_ftz(fmaf(s[x] * c.x, k_factor[r], c.w));
        const float w = pij * (e[x] * v_pow[r] * c.y - ((el & 1) ? dl.y : dl.x)) * c.x;
        pf[b][el] = pij * c.z;
        e[x] = w;
        part_max[r][b & 1] = fmaxf(part_max[r][b & 1], fabsf(w));
      }
    }
    pack_a_step(pf, pa[kk]);
  }
  for (int r = 0; r < 2; ++r) amax[r] = fmaxf(part_max[r][0], part_max[r][1]);
}

template <int D>
__global__ void __launch_bounds__(kThreads) backward_dkdv_kernel(const BackwardParams p) {
  extern __shared__ __align__(128) uint8_t smem_bytes[];
  auto& sm = *reinterpret_cast<DkdvShared<D>*>(smem_bytes);
  constexpr float kLog2e = 1.4426950408889634f;

  const int kvh = blockIdx.y;
  DocumentTile work;
  if (!document_tile(p.cu_seqlens, p.num_docs, p.total_tokens, kKeyRows, blockIdx.x, work)) return;
  const int doc = work.doc;
  const DocumentSpan d = work.span;
  const int k0 = work.tile * kKeyRows;  // the first blocks see the most queries (causal): launched first
  const int group = p.q_heads / p.kv_heads;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int keys[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  const float scale_log2e = p.softmax_scale * kLog2e;
  float k_factor[2], v_pow[2];  // 2^ek_j scale log2(e), 2^ev_j
  for (int r = 0; r < 2; ++r) {
    const int64_t s = int64_t(d.begin + min(keys[r], d.len - 1)) * p.kv_heads + kvh;
    k_factor[r] = pow2_of_scale(p.k_scales[s]) * scale_log2e;
    v_pow[r] = pow2_of_scale(p.v_scales[s]);
  }

  // gamma: the document's largest dO exponent over the group's query heads (each head's running
  // max at the document's last token; UE8M0 bytes order like exponents, NaN (0xFF) the largest).
  uint8_t gamma_code = 0;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h)
    gamma_code = uint8_t(max(int(gamma_code), int(p.g_scale_prefix_max[int64_t(d.end - 1) * p.q_heads + h])));
  const int gamma = scale_exponent(gamma_code);

  // Prologue: the CTA's K and V rows (once) and the first query step; step i uses stage i % 2.
  const int64_t kv_pitch = int64_t(p.kv_heads) * D, kv_offset = (int64_t(d.begin + k0) * p.kv_heads + kvh) * D;
  const int64_t doc_slot = layout::transposed_document_start(d.begin, doc);
  const int q_begin = p.causal ? k0 : 0;  // k0 is a multiple of kQueryTile: a query tile start
  const QuerySteps steps{kvh * group, q_begin, (d.len - q_begin + kQueryTile - 1) / kQueryTile};
  const int num_steps = group * steps.tiles_per_head;
  copy_tile_async<kKeyRows, D, kThreads>(p.k_codes + kv_offset, kv_pitch, d.len - k0, D, sm.k);
  copy_tile_async<kKeyRows, D, kThreads>(p.v_codes + kv_offset, kv_pitch, d.len - k0, D, sm.v);
  copy_query_tile_async(p, d, doc_slot, steps.head(0), steps.q0(0), sm.stage[0]);
  cp_async_commit();
  store_query_consts(load_query_inputs(p, d, steps.head(0), steps.q0(0)), gamma, p.p_boost_log2, sm.stage[0].consts);

  float dk_acc[D / 2], dv_acc[D / 2];
  zero(dk_acc);
  zero(dv_acc);
  for (int step = 0; step < num_steps; ++step) {
    const int q0 = steps.q0(step);
    const DkdvQueryStage<D>& st = sm.stage[step % 2];
    cp_async_wait_all();
    fence_smem_for_async_proxy();  // the copies are generic-proxy writes; wgmma reads via the async proxy
    __syncthreads();  // step's tiles and constants are in shared memory; the other stage is free
    const bool has_next = step + 1 < num_steps;
    QueryInputs next_inputs{};
    if (has_next) {
      copy_query_tile_async(p, d, doc_slot, steps.head(step + 1), steps.q0(step + 1), sm.stage[(step + 1) % 2]);
      cp_async_commit();
      next_inputs = load_query_inputs(p, d, steps.head(step + 1), steps.q0(step + 1));
    }

    // S^T = K . Q^T and E^T = V . dO^T: 64 keys x 64 queries each, D/32 k-steps.
    float s[kQueryTile / 2], e[kQueryTile / 2];
    wgmma_fence();
    const int wg_row = threadIdx.x / 128 * kWarpgroupRows;  // this warpgroup's first key in the block
    rows_product<D, kQueryTile>(s, sm.k + wg_row * D, st.q);
    rows_product<D, kQueryTile>(e, sm.v + wg_row * D, st.g);
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(s);
    fence_accumulators(e);

    // P~ into pa (dV's operand), e in place becomes dK's before tau. Interior: every (key, query)
    // pair of the warpgroup visible (queries inside the document and, causal, its last key before
    // the first query; the branch is uniform over the warpgroup).
    float amax[2] = {0.f, 0.f};
    uint32_t pa[kQueryTile / 32][4], ua[kQueryTile / 32][4];
    const bool interior = q0 + kQueryTile <= d.len && (!p.causal || k0 + wg_row + kWarpgroupRows - 1 <= q0);
    if (interior) {
      interior_pu(s, e, st.consts, k_factor, v_pow, t, amax, pa);
    } else {
      masked_pu(s, e, st.consts, k_factor, v_pow, keys, d, q0, p.causal, t, amax, pa);
    }
    float tau_pow[2], tau_inv[2];
    for (int r = 0; r < 2; ++r) {
      const int tau = scale_exponent(formats::scale_for_amax(double(quad_nan_max(amax[r])), formats::ScaleRule::kCeil));
      tau_pow[r] = pow2i(tau);
      tau_inv[r] = tau == kNaNExponent ? pow2i(kNaNExponent) : pow2i(-tau);
    }
#pragma unroll
    for (int kk = 0; kk < kQueryTile / 32; ++kk) {
      float uf[4][4];
#pragma unroll
      for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int el = 0; el < 4; ++el) uf[b][el] = e[(kk * 4 + b) * 4 + el] * tau_inv[el >> 1];
      pack_a_step(uf, ua[kk]);
    }

    // dV += P~^T . dO codes;  dK += 2^tau (U~^T . Q codes) (B: the transposed, permuted forms).
    // At D = 128 the dK tile is two halves of the features one after the other: dK, dV and a whole
    // dK tile would hold 192 accumulator registers at once.
    constexpr int kHalves = D == 128 ? 2 : 1, kHalfCols = D / kHalves;
    fence_accumulators(dv_acc);
    wgmma_fence();
    register_product<D, kQueryTile>(dv_acc, pa, st.gt);
    wgmma_commit();
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      float dk_tile[kHalfCols / 2];
      zero(dk_tile);
      wgmma_fence();
      const uint8_t* qt = st.qt + half * (kHalfCols / 8) * kTransposedFormStride<kQueryTile>;  // its feature rows
      register_product<kHalfCols, kQueryTile>(dk_tile, ua, qt);
      wgmma_commit();
      wgmma_wait_all();
      fence_accumulators(dk_tile);
      add_scaled_rows(*reinterpret_cast<float(*)[kHalfCols / 2]>(dk_acc + half * kHalfCols / 2), dk_tile, tau_pow);
    }
    fence_accumulators(dv_acc);
    // Nobody reads the other stage until the next step's barrier.
    if (has_next) store_query_consts(next_inputs, gamma, p.p_boost_log2, sm.stage[(step + 1) % 2].consts);
  }

  const float dv_factor = gamma == kNaNExponent ? pow2i(kNaNExponent) : pow2i(gamma - p.p_boost_log2);
  auto* dk = static_cast<__nv_bfloat16*>(p.dk);
  auto* dv = static_cast<__nv_bfloat16*>(p.dv);
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= d.len) continue;
    const int64_t token = d.begin + keys[r];
    store_row_bf16(dk_acc, r, p.softmax_scale, dk + token * p.dk_stride_token + kvh * p.dk_stride_head, t);
    store_row_bf16(dv_acc, r, dv_factor, dv + token * p.dv_stride_token + kvh * p.dv_stride_head, t);
  }
}

}  // namespace

int launch_backward_dkdv(const BackwardParams& p, void* stream) {
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return launch_over_tile_slots(backward_dkdv_kernel<D>, p, sizeof(DkdvShared<D>), kThreads, p.total_tokens, p.num_docs, kKeyRows, p.kv_heads,
                                  static_cast<cudaStream_t>(stream));
  });
}

}  // namespace flamia::cuda::sm90
