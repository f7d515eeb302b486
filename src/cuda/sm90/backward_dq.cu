// Backward pass 3: dQ. One CTA of two warpgroups per (document, 128-query tile, query head) owns
// those rows' dQ (64 rows per warpgroup, sharing every key tile in shared memory) and walks the
// 128-key tiles (counted from the document start, tiling::kBwdKeyTile) that its rows see. Per key
// tile:
//   S = Q codes . K codes^T,  p_ij = 2^(S_ij 2^(eq_i + ek_j) scale log2(e) - LSE_i log2(e))
//   E = dO codes . V codes^T, E_ij = E_ij 2^(eg_i + ev_j),  U_ij = p_ij (E_ij - D_i)
//   dQ_i += 2^sigma_i sum_j E4M3(U_ij 2^(ek_j - sigma_i)) ck_j,  sigma_i: ceil scale of max_j |U_ij 2^ek_j|
// one sigma per (row, key tile), as the emulation defines it; dQ is scaled by the softmax scale at
// the end. A row reads only its visible keys, and its sum runs in a fixed order: dQ_i is
// deterministic and, in prefix mode, independent of everything after i.
// Key tiles are double-buffered cp.async copies (K rows, V rows, and K^T from the quantizer's
// transposed layout); the next tile's copies and scales are in flight while one is computed.
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

constexpr int kWarpgroups = 2;                 // both read each key tile: half the L2 traffic of one
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kWarpgroupRows = 64;             // the m64 of every product
constexpr int kQueryRows = kWarpgroupRows * kWarpgroups;  // rows per CTA
constexpr int kKeyTile = tiling::kBwdKeyTile;  // keys per step: sigma's group
static_assert(kKeyTile == 128, "S is one m64n128 product per k-step");
static_assert(kKeyTile % kQueryRows == 0, "a CTA's rows share their diagonal key tile");
static_assert(kThreads >= kKeyTile, "one thread loads each key's scales");

// One key tile's codes and scales: the double buffer holds two.
template <int D>
struct DqKeyStage {
  uint8_t k[kKeyTile * D];   // rows form (B of S)
  uint8_t v[kKeyTile * D];   // rows form (B of E)
  uint8_t kt[D * kKeyTile];  // transposed form, keys permuted (B of dQ)
  float k_pow[kKeyTile];     // 2^ek_j
  float v_pow[kKeyTile];     // 2^ev_j
};
template <int D>
struct DqShared {
  uint8_t q[kQueryRows * D];  // rows form (A of S)
  uint8_t g[kQueryRows * D];  // rows form (A of E)
  DqKeyStage<D> stage[2];
};
static_assert(sizeof(DqShared<128>) + 1024 <= 228 * 1024, "a CTA must fit in shared memory");

// Key k0 + threadIdx.x's scale codes (clamped into the document: masked keys' values are unused;
// threads past the tile load nothing).
struct KeyScaleCodes {
  uint8_t k, v;
};
__device__ __forceinline__ KeyScaleCodes load_key_scales(const BackwardParams& p, const DocumentSpan& d, int kvh, int k0) {
  if (threadIdx.x >= kKeyTile) return {};
  const int64_t s = int64_t(d.begin + min(k0 + int(threadIdx.x), d.len - 1)) * p.kv_heads + kvh;
  return {p.k_scales[s], p.v_scales[s]};
}
template <int D>
__device__ __forceinline__ void store_key_scales(const KeyScaleCodes& c, DqKeyStage<D>& st) {
  if (threadIdx.x >= kKeyTile) return;
  st.k_pow[threadIdx.x] = pow2_of_scale(c.k);
  st.v_pow[threadIdx.x] = pow2_of_scale(c.v);
}

template <int D>
__device__ __forceinline__ void copy_key_tile_async(const BackwardParams& p, const DocumentSpan& d, int64_t kt_doc_row,
                                                    int kvh, int k0, DqKeyStage<D>& st) {
  const int64_t kv_pitch = int64_t(p.kv_heads) * D, kv_offset = (int64_t(d.begin + k0) * p.kv_heads + kvh) * D;
  copy_tile_async<kKeyTile, D, kThreads>(p.k_codes + kv_offset, kv_pitch, d.len - k0, D, st.k);
  copy_tile_async<kKeyTile, D, kThreads>(p.v_codes + kv_offset, kv_pitch, d.len - k0, D, st.v);
  copy_tile_async<D, kKeyTile, kThreads>(p.k_codes_t + kt_doc_row + k0, p.t_pitch, D, d.len - k0, st.kt);
}

// Per-row constants of the U computation.
struct DqRows {
  float q_factor[2];  // 2^eq_i scale log2(e)
  float g_pow[2];     // 2^eg_i
  float lse2[2];      // LSE_i log2(e)
  float delta[2];     // D_i
};

// A masked tile (keys some row must not see), element by element as the emulation states it:
// s becomes U_ij 2^ek_j on visible pairs, 0 elsewhere; amax its row max of |.|.
template <int D>
__device__ __forceinline__ void masked_u(float (&s)[kKeyTile / 2], const float (&e)[kKeyTile / 2], const DqKeyStage<D>& st,
                                         const DqRows& rw, const int (&rows)[2], const DocumentSpan& d, int k0,
                                         bool causal, int t, float (&amax)[2]) {
#pragma unroll
  for (int x = 0; x < kKeyTile / 2; ++x) {
    const int r = (x >> 1) & 1, j = (x >> 2) * 8 + 2 * t + (x & 1), key = k0 + j;
    const bool visible = rows[r] < d.len && key < d.len && (!causal || key <= rows[r]);
    float w = 0.f;
    if (visible) {
      const float pij = exp2f(s[x] * rw.q_factor[r] * st.k_pow[j] - rw.lse2[r]);
      const float eij = e[x] * rw.g_pow[r] * st.v_pow[j];
      w = pij * (eij - rw.delta[r]) * st.k_pow[j];
    }
    s[x] = w;
    amax[r] = nan_max(amax[r], fabsf(w));
  }
}

// An interior tile (every key visible to every row): the same numbers with fewer instructions per
// element, which bound the kernel: no mask; the exponent s 2^ek q_factor - lse2 as one fused
// multiply-add (one rounding instead of two); 2^x on the MUFU unit with subnormal results flushed
// (p < 2^-126 moves dQ by less than 2^-126 |E - D| 2^ek, nothing next to the tiles that hold the
// row's probability mass, which sums to 1); fmaxf for the row max (a NaN U element still makes
// its E4M3 code, and so the row's dQ, NaN).
template <int D>
__device__ __forceinline__ void interior_u(float (&s)[kKeyTile / 2], const float (&e)[kKeyTile / 2],
                                           const DqKeyStage<D>& st, const DqRows& rw, int t, float (&amax)[2]) {
  const float neg_lse2[2] = {-rw.lse2[0], -rw.lse2[1]};
  // Two partial maxima per row (exact in any order): shorter dependency chains.
  float part_max[2][2] = {{amax[0], amax[0]}, {amax[1], amax[1]}};
#pragma unroll
  for (int nb = 0; nb < kKeyTile / 8; ++nb) {
    const float2 kp = *reinterpret_cast<const float2*>(st.k_pow + nb * 8 + 2 * t);
    const float2 vp = *reinterpret_cast<const float2*>(st.v_pow + nb * 8 + 2 * t);
#pragma unroll
    for (int el = 0; el < 4; ++el) {
      const int r = el >> 1, x = nb * 4 + el;
      const float k_pow = (el & 1) ? kp.y : kp.x, v_pow = (el & 1) ? vp.y : vp.x;
      const float pij = exp2_ftz(fmaf(s[x] * k_pow, rw.q_factor[r], neg_lse2[r]));
      const float w = pij * (e[x] * v_pow * rw.g_pow[r] - rw.delta[r]) * k_pow;
      s[x] = w;
      part_max[r][nb & 1] = fmaxf(part_max[r][nb & 1], fabsf(w));
    }
  }
  for (int r = 0; r < 2; ++r) amax[r] = fmaxf(part_max[r][0], part_max[r][1]);
}

template <int D>
__global__ void __launch_bounds__(kThreads) backward_dq_kernel(const BackwardParams p) {
  extern __shared__ __align__(128) uint8_t smem_bytes[];
  auto& sm = *reinterpret_cast<DqShared<D>*>(smem_bytes);
  constexpr float kLog2e = 1.4426950408889634f;

  const int h = blockIdx.y;
  DocumentTile work;
  if (!document_tile(p.cu_seqlens, p.num_docs, p.total_tokens, kQueryRows, blockIdx.x, work)) return;
  const int doc = work.doc;
  const DocumentSpan d = work.span;
  const int q0 = (work.tiles - 1 - work.tile) * kQueryRows;  // later (costlier, causal) tiles launch first
  const int kvh = h / (p.q_heads / p.kv_heads);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const float scale_log2e = p.softmax_scale * kLog2e;
  DqRows rw;
  for (int r = 0; r < 2; ++r) {
    const int64_t token = d.begin + min(rows[r], d.len - 1);
    const int64_t s = token * p.q_heads + h;
    rw.q_factor[r] = pow2_of_scale(p.q_scales[s]) * scale_log2e;
    rw.g_pow[r] = pow2_of_scale(p.g_scales[s]);
    rw.lse2[r] = p.lse[int64_t(h) * p.total_tokens + token] * kLog2e;
    rw.delta[r] = p.delta[int64_t(h) * p.total_tokens + token];
  }

  // Prologue: the CTA's Q and dO rows (once) and key tile 0; tile i of the loop uses stage i % 2.
  const int64_t q_offset = (int64_t(d.begin + q0) * p.q_heads + h) * D, q_pitch = int64_t(p.q_heads) * D;
  const int64_t kt_doc_row = int64_t(kvh) * D * p.t_pitch + layout::transposed_document_start(d.begin, doc);
  copy_tile_async<kQueryRows, D, kThreads>(p.q_codes + q_offset, q_pitch, d.len - q0, D, sm.q);
  copy_tile_async<kQueryRows, D, kThreads>(p.g_codes + q_offset, q_pitch, d.len - q0, D, sm.g);
  copy_key_tile_async(p, d, kt_doc_row, kvh, 0, sm.stage[0]);
  cp_async_commit();
  store_key_scales(load_key_scales(p, d, kvh, 0), sm.stage[0]);

  float dq_acc[D / 2];
  zero(dq_acc);
  const int last_key = p.causal ? min(q0 + kQueryRows, d.len) - 1 : d.len - 1;
  for (int k0 = 0, i = 0; k0 <= last_key; k0 += kKeyTile, ++i) {
    const DqKeyStage<D>& st = sm.stage[i % 2];
    cp_async_wait_all();
    fence_smem_for_async_proxy();  // the copies are generic-proxy writes; wgmma reads via the async proxy
    __syncthreads();  // tile i and its scales are in shared memory; the other stage is free
    const bool has_next = k0 + kKeyTile <= last_key;
    KeyScaleCodes next_scales{};
    if (has_next) {
      copy_key_tile_async(p, d, kt_doc_row, kvh, k0 + kKeyTile, sm.stage[(i + 1) % 2]);
      cp_async_commit();
      next_scales = load_key_scales(p, d, kvh, k0 + kKeyTile);
    }

    // S = Q . K^T and E = dO . V^T: 64 queries x 128 keys each, D/32 k-steps.
    float s[kKeyTile / 2], e[kKeyTile / 2];
    wgmma_fence();
    const int wg_row = threadIdx.x / 128 * kWarpgroupRows;  // this warpgroup's first row in the tile
    rows_product<D, kKeyTile>(s, sm.q + wg_row * D, st.k);
    rows_product<D, kKeyTile>(e, sm.g + wg_row * D, st.v);
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(s);
    fence_accumulators(e);

    // In place: s becomes U 2^ek (dQ's operand before sigma). Interior: every key visible to every
    // row (inside the document and, causal, at or before the CTA's first row; rows past the
    // document end compute values that are never stored, and rows do not mix in dQ = U.K).
    float amax[2] = {0.f, 0.f};
    const bool interior = k0 + kKeyTile <= d.len && (!p.causal || k0 + kKeyTile - 1 <= q0);
    if (interior) {
      interior_u(s, e, st, rw, t, amax);
    } else {
      masked_u(s, e, st, rw, rows, d, k0, p.causal, t, amax);
    }
    float sigma_pow[2], sigma_inv[2];
    for (int r = 0; r < 2; ++r) {
      const int sigma = scale_exponent(formats::scale_for_amax(double(quad_nan_max(amax[r])), formats::ScaleRule::kCeil));
      sigma_pow[r] = pow2i(sigma);
      sigma_inv[r] = sigma == kNaNExponent ? pow2i(kNaNExponent) : pow2i(-sigma);
    }
    uint32_t ua[kKeyTile / 32][4];
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 32; ++kk) {
      float uf[4][4];
#pragma unroll
      for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int el = 0; el < 4; ++el) uf[b][el] = s[(kk * 4 + b) * 4 + el] * sigma_inv[el >> 1];
      pack_a_step(uf, ua[kk]);
    }

    // dQ_tile = U~ . K codes (B: K transposed, keys permuted).
    float dq_tile[D / 2];
    zero(dq_tile);
    wgmma_fence();
    register_product<D, kKeyTile>(dq_tile, ua, st.kt);
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(dq_tile);
    add_scaled_rows(dq_acc, dq_tile, sigma_pow);
    // Nobody reads the other stage until the next step's barrier.
    if (has_next) store_key_scales(next_scales, sm.stage[(i + 1) % 2]);
  }

  auto* dq = static_cast<__nv_bfloat16*>(p.dq);
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= d.len) continue;
    const int64_t token = d.begin + rows[r];
    store_row_bf16(dq_acc, r, p.softmax_scale, dq + token * p.dq_stride_token + h * p.dq_stride_head, t);
  }
}

}  // namespace

int launch_backward_dq(const BackwardParams& p, void* stream) {
  return for_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return launch_over_tile_slots(backward_dq_kernel<D>, p, sizeof(DqShared<D>), kThreads, p.total_tokens, p.num_docs, kQueryRows, p.q_heads,
                                  static_cast<cudaStream_t>(stream));
  });
}

}  // namespace flamia::cuda::sm90
