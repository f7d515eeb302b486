// Backward pass 2: dK and dV. One warpgroup CTA per (document, 64-key block, KV head) owns those
// keys' gradients; it walks the query heads of its KV group and, for each, the 64-query tiles
// (counted from the document start, tiling::kBwdQueryTile) that see its keys. Per tile, with the
// keys as rows (S^T and E^T come out of the tensor cores already transposed):
//   S^T = K codes . Q codes^T,  p_ij = 2^(S_ij 2^(ek_j + eq_i) scale log2(e) - LSE_i log2(e))
//   E^T = V codes . dO codes^T, E_ij = E^T_ji 2^(ev_j + eg_i),  U_ij = p_ij (E_ij - D_i)
//   dV_j += sum_i E4M3(p_ij 2^(boost + eg_i - gamma)) cg_i          (times 2^(gamma - boost))
//   dK_j += 2^tau_j sum_i E4M3(U_ij 2^(eq_i - tau_j)) cq_i,  tau_j: ceil scale of max_i |U_ij 2^eq_i|
// with gamma the document's largest dO exponent over the group's query heads and tau_j one scale
// per (key, query tile), as
// docs/NUMERICS.md and the emulation (reference::mxfp8_backward) define them. dK is scaled by the
// softmax scale at the end.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/tiling.h"
#include "cuda/sm90/accumulator.cuh"
#include "cuda/sm90/backward.h"
#include "cuda/sm90/document_span.cuh"
#include "cuda/sm90/fp8_math.cuh"
#include "cuda/sm90/smem_stage.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "formats/scales.h"

namespace flamia::cuda::sm90 {
namespace {

constexpr int kThreads = 128;                       // one warpgroup
constexpr int kKeyRows = 64;                        // keys per CTA: the m64 of every product
constexpr int kQueryTile = tiling::kBwdQueryTile;   // queries per step: tau's group
static_assert(kQueryTile == 64, "S^T is one m64n64 product per k-step");
static_assert(tiling::kBwdKeyTile % kKeyRows == 0, "a CTA's keys lie inside one backward key tile");

template <int D>
struct DkdvShared {
  uint8_t k[kKeyRows * D];     // rows form (A of S^T)
  uint8_t v[kKeyRows * D];     // rows form (A of E^T)
  uint8_t q[kQueryTile * D];   // rows form (B of S^T)
  uint8_t g[kQueryTile * D];   // rows form (B of E^T)
  uint8_t qt[D * kQueryTile];  // transposed form (B of dK)
  uint8_t gt[D * kQueryTile];  // transposed form (B of dV)
  float q_pow[kQueryTile];     // 2^eq_i
  float g_pow[kQueryTile];     // 2^eg_i
  float p_fold[kQueryTile];    // 2^(boost + eg_i - gamma)
  float lse2[kQueryTile];      // LSE_i log2(e)
  float delta[kQueryTile];     // D_i
};

template <int D>
__global__ void __launch_bounds__(kThreads) backward_dkdv_kernel(const BackwardParams p) {
  extern __shared__ __align__(128) uint8_t smem_bytes[];
  auto& sm = *reinterpret_cast<DkdvShared<D>*>(smem_bytes);
  constexpr float kLog2e = 1.4426950408889634f;

  const int doc = blockIdx.y, kvh = blockIdx.z;
  const DocumentSpan d = document_span(p.cu_seqlens, doc, p.total_tokens);
  const int k0 = blockIdx.x * kKeyRows;  // the first blocks see the most queries (causal): launched first
  if (k0 >= d.len) return;
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

  const int64_t kv_pitch = int64_t(p.kv_heads) * D, q_pitch = int64_t(p.q_heads) * D;
  const int64_t kv_offset = (int64_t(d.begin + k0) * p.kv_heads + kvh) * D;
  stage_code_tile<D, kKeyRows, kThreads>(p.k_codes + kv_offset, kv_pitch, d.len - k0, sm.k, nullptr);
  stage_code_tile<D, kKeyRows, kThreads>(p.v_codes + kv_offset, kv_pitch, d.len - k0, sm.v, nullptr);

  float dk_acc[D / 2], dv_acc[D / 2];
  zero(dk_acc);
  zero(dv_acc);
  const int q_begin = p.causal ? k0 : 0;  // k0 is a multiple of kQueryTile: a query tile start

  // gamma: the document's largest dO exponent over the group's query heads (each head's running
  // max at the document's last token; UE8M0 bytes order like exponents, NaN (0xFF) the largest).
  uint8_t gamma_code = 0;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h)
    gamma_code = uint8_t(max(int(gamma_code), int(p.g_scale_prefix_max[int64_t(d.end - 1) * p.q_heads + h])));
  const int gamma = scale_exponent(gamma_code);

  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int q0 = q_begin; q0 < d.len; q0 += kQueryTile) {
      __syncthreads();  // the previous tile's readers are done (its wgmmas were waited for)
      const int64_t q_offset = (int64_t(d.begin + q0) * p.q_heads + h) * D;
      stage_code_tile<D, kQueryTile, kThreads>(p.q_codes + q_offset, q_pitch, d.len - q0, sm.q, sm.qt);
      stage_code_tile<D, kQueryTile, kThreads>(p.g_codes + q_offset, q_pitch, d.len - q0, sm.g, sm.gt);
      for (int i = threadIdx.x; i < kQueryTile; i += blockDim.x) {
        const int64_t token = d.begin + min(q0 + i, d.len - 1);
        const int64_t s = token * p.q_heads + h;
        const int eg = scale_exponent(p.g_scales[s]);
        sm.q_pow[i] = pow2_of_scale(p.q_scales[s]);
        sm.g_pow[i] = pow2i(eg);
        sm.p_fold[i] = pow2i(gamma == kNaNExponent ? kNaNExponent : add_exponents(eg, p.p_boost_log2 - gamma));
        sm.lse2[i] = p.lse[int64_t(h) * p.total_tokens + token] * kLog2e;
        sm.delta[i] = p.delta[int64_t(h) * p.total_tokens + token];
      }
      fence_smem_for_async_proxy();
      __syncthreads();

      // S^T = K . Q^T and E^T = V . dO^T: 64 keys x 64 queries each, D/32 k-steps.
      float s[kQueryTile / 2], e[kQueryTile / 2];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < D / 32; ++ks)
        wgmma_m64n64k32_ss(s, smem_descriptor(sm.k + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>),
                           smem_descriptor(sm.q + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>), ks > 0);
#pragma unroll
      for (int ks = 0; ks < D / 32; ++ks)
        wgmma_m64n64k32_ss(e, smem_descriptor(sm.v + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>),
                           smem_descriptor(sm.g + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>), ks > 0);
      wgmma_commit();
      wgmma_wait_all();
      fence_accumulators(s);
      fence_accumulators(e);

      // In place: s becomes dV's operand p 2^(boost + eg - gamma), e becomes U 2^eq (dK's, before tau).
      float amax[2] = {0.f, 0.f};
#pragma unroll
      for (int x = 0; x < kQueryTile / 2; ++x) {
        const int r = (x >> 1) & 1, i = (x >> 2) * 8 + 2 * t + (x & 1), query = q0 + i;
        const bool visible = keys[r] < d.len && query < d.len && (!p.causal || keys[r] <= query);
        float pv = 0.f, w = 0.f;
        if (visible) {
          const float pij = exp2f(s[x] * k_factor[r] * sm.q_pow[i] - sm.lse2[i]);
          const float eij = e[x] * v_pow[r] * sm.g_pow[i];
          pv = pij * sm.p_fold[i];
          w = pij * (eij - sm.delta[i]) * sm.q_pow[i];
        }
        s[x] = pv;
        e[x] = w;
        amax[r] = nan_max(amax[r], fabsf(w));
      }
      float tau_pow[2], tau_inv[2];
      for (int r = 0; r < 2; ++r) {
        const int tau = scale_exponent(formats::scale_for_amax(double(quad_nan_max(amax[r])), formats::ScaleRule::kCeil));
        tau_pow[r] = pow2i(tau);
        tau_inv[r] = tau == kNaNExponent ? pow2i(kNaNExponent) : pow2i(-tau);
      }
      uint32_t pa[kQueryTile / 32][4], ua[kQueryTile / 32][4];
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 32; ++kk) {
        float pf[4][4], uf[4][4];
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
          for (int el = 0; el < 4; ++el) {
            const int x = (kk * 4 + b) * 4 + el;
            pf[b][el] = s[x];
            uf[b][el] = e[x] * tau_inv[el >> 1];
          }
        pack_a_step(pf, pa[kk]);
        pack_a_step(uf, ua[kk]);
      }

      // dV += P~^T . dO codes;  dK_tile = U~^T . Q codes (B: the transposed, permuted forms).
      float dk_tile[D / 2];
      zero(dk_tile);
      fence_accumulators(dv_acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 32; ++kk)
        wgmma_m64nNk32_rs<D>(dv_acc, pa[kk], smem_descriptor(sm.gt + kk * 2 * kCoreMatrixBytes, kTransposedFormStride<kQueryTile>));
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 32; ++kk)
        wgmma_m64nNk32_rs<D>(dk_tile, ua[kk], smem_descriptor(sm.qt + kk * 2 * kCoreMatrixBytes, kTransposedFormStride<kQueryTile>));
      wgmma_commit();
      wgmma_wait_all();
      fence_accumulators(dv_acc);
      fence_accumulators(dk_tile);
      add_scaled_rows(dk_acc, dk_tile, tau_pow);
    }
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

template <int D>
int launch(const BackwardParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = sizeof(DkdvShared<D>);
  if (const cudaError_t err = cudaFuncSetAttribute(backward_dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   int(kSmem));
      err != cudaSuccess)
    return int(err);
  const dim3 grid((p.max_seqlen + kKeyRows - 1) / kKeyRows, p.num_docs, p.kv_heads);
  backward_dkdv_kernel<D><<<grid, kThreads, kSmem, stream>>>(p);
  return int(cudaGetLastError());
}

}  // namespace

int launch_backward_dkdv(const BackwardParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 128) return launch<128>(p, s);
  if (p.head_dim == 64) return launch<64>(p, s);
  return int(cudaErrorInvalidValue);
}

}  // namespace flamia::cuda::sm90
