// Backward pass 3: dQ. One warpgroup CTA per (document, 64-query tile, query head) owns those rows'
// dQ and walks the 128-key tiles (counted from the document start, tiling::kBwdKeyTile) that its
// rows see. Per key tile:
//   S = Q codes . K codes^T,  p_ij = 2^(S_ij 2^(eq_i + ek_j) scale log2(e) - LSE_i log2(e))
//   E = dO codes . V codes^T, E_ij = E_ij 2^(eg_i + ev_j),  U_ij = p_ij (E_ij - D_i)
//   dQ_i += 2^sigma_i sum_j E4M3(U_ij 2^(ek_j - sigma_i)) ck_j,  sigma_i: ceil scale of max_j |U_ij 2^ek_j|
// one sigma per (row, key tile), as the emulation defines it; dQ is scaled by the softmax scale at
// the end. A row reads only its visible keys, and its sum runs in a fixed order: dQ_i is
// deterministic and, in prefix mode, independent of everything after i.
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

constexpr int kThreads = 128;                  // one warpgroup
constexpr int kQueryRows = 64;                 // rows per CTA: the m64 of every product
constexpr int kKeyTile = tiling::kBwdKeyTile;  // keys per step: sigma's group
static_assert(kKeyTile == 128, "S is one m64n128 product per k-step");
static_assert(kKeyTile % kQueryRows == 0, "a CTA's rows share their diagonal key tile");

template <int D>
struct DqShared {
  uint8_t q[kQueryRows * D];  // rows form (A of S)
  uint8_t g[kQueryRows * D];  // rows form (A of E)
  uint8_t k[kKeyTile * D];    // rows form (B of S)
  uint8_t v[kKeyTile * D];    // rows form (B of E)
  uint8_t kt[D * kKeyTile];   // transposed form (B of dQ)
  float k_pow[kKeyTile];      // 2^ek_j
  float v_pow[kKeyTile];      // 2^ev_j
};

template <int D>
__global__ void __launch_bounds__(kThreads) backward_dq_kernel(const BackwardParams p) {
  extern __shared__ __align__(128) uint8_t smem_bytes[];
  auto& sm = *reinterpret_cast<DqShared<D>*>(smem_bytes);
  constexpr float kLog2e = 1.4426950408889634f;

  const int doc = blockIdx.y, h = blockIdx.z;
  const DocumentSpan d = document_span(p.cu_seqlens, doc, p.total_tokens);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kQueryRows;  // later (costlier, causal) tiles launch first
  if (q0 >= d.len) return;
  const int kvh = h / (p.q_heads / p.kv_heads);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const float scale_log2e = p.softmax_scale * kLog2e;
  float q_factor[2], g_pow[2], lse2[2], delta[2];  // 2^eq_i scale log2(e), 2^eg_i, LSE_i log2(e), D_i
  for (int r = 0; r < 2; ++r) {
    const int64_t token = d.begin + min(rows[r], d.len - 1);
    const int64_t s = token * p.q_heads + h;
    q_factor[r] = pow2_of_scale(p.q_scales[s]) * scale_log2e;
    g_pow[r] = pow2_of_scale(p.g_scales[s]);
    lse2[r] = p.lse[int64_t(h) * p.total_tokens + token] * kLog2e;
    delta[r] = p.delta[int64_t(h) * p.total_tokens + token];
  }

  const int64_t q_offset = (int64_t(d.begin + q0) * p.q_heads + h) * D, q_pitch = int64_t(p.q_heads) * D;
  stage_code_tile<D, kQueryRows, kThreads>(p.q_codes + q_offset, q_pitch, d.len - q0, sm.q, nullptr);
  stage_code_tile<D, kQueryRows, kThreads>(p.g_codes + q_offset, q_pitch, d.len - q0, sm.g, nullptr);

  float dq_acc[D / 2];
  zero(dq_acc);
  const int last_key = p.causal ? min(q0 + kQueryRows, d.len) - 1 : d.len - 1;
  const int64_t kv_pitch = int64_t(p.kv_heads) * D;
  for (int k0 = 0; k0 <= last_key; k0 += kKeyTile) {
    __syncthreads();  // the previous tile's readers are done (its wgmmas were waited for)
    const int64_t kv_offset = (int64_t(d.begin + k0) * p.kv_heads + kvh) * D;
    stage_code_tile<D, kKeyTile, kThreads>(p.k_codes + kv_offset, kv_pitch, d.len - k0, sm.k, sm.kt);
    stage_code_tile<D, kKeyTile, kThreads>(p.v_codes + kv_offset, kv_pitch, d.len - k0, sm.v, nullptr);
    for (int j = threadIdx.x; j < kKeyTile; j += blockDim.x) {
      const int64_t s = int64_t(d.begin + min(k0 + j, d.len - 1)) * p.kv_heads + kvh;
      sm.k_pow[j] = pow2_of_scale(p.k_scales[s]);
      sm.v_pow[j] = pow2_of_scale(p.v_scales[s]);
    }
    fence_smem_for_async_proxy();
    __syncthreads();

    // S = Q . K^T and E = dO . V^T: 64 queries x 128 keys each, D/32 k-steps.
    float s[kKeyTile / 2], e[kKeyTile / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 32; ++ks)
      wgmma_m64n128k32_ss(s, smem_descriptor(sm.q + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>),
                          smem_descriptor(sm.k + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>), ks > 0);
#pragma unroll
    for (int ks = 0; ks < D / 32; ++ks)
      wgmma_m64n128k32_ss(e, smem_descriptor(sm.g + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>),
                          smem_descriptor(sm.v + ks * 2 * kCoreMatrixBytes, kRowsFormStride<D>), ks > 0);
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(s);
    fence_accumulators(e);

    // In place: s becomes U 2^ek (dQ's operand before sigma).
    float amax[2] = {0.f, 0.f};
#pragma unroll
    for (int x = 0; x < kKeyTile / 2; ++x) {
      const int r = (x >> 1) & 1, j = (x >> 2) * 8 + 2 * t + (x & 1), key = k0 + j;
      const bool visible = rows[r] < d.len && key < d.len && (!p.causal || key <= rows[r]);
      float w = 0.f;
      if (visible) {
        const float pij = exp2f(s[x] * q_factor[r] * sm.k_pow[j] - lse2[r]);
        const float eij = e[x] * g_pow[r] * sm.v_pow[j];
        w = pij * (eij - delta[r]) * sm.k_pow[j];
      }
      s[x] = w;
      amax[r] = nan_max(amax[r], fabsf(w));
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
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 32; ++kk)
      wgmma_m64nNk32_rs<D>(dq_tile, ua[kk], smem_descriptor(sm.kt + kk * 2 * kCoreMatrixBytes, kTransposedFormStride<kKeyTile>));
    wgmma_commit();
    wgmma_wait_all();
    fence_accumulators(dq_tile);
    add_scaled_rows(dq_acc, dq_tile, sigma_pow);
  }

  auto* dq = static_cast<__nv_bfloat16*>(p.dq);
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= d.len) continue;
    const int64_t token = d.begin + rows[r];
    store_row_bf16(dq_acc, r, p.softmax_scale, dq + token * p.dq_stride_token + h * p.dq_stride_head, t);
  }
}

template <int D>
int launch(const BackwardParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = sizeof(DqShared<D>);
  if (const cudaError_t err = cudaFuncSetAttribute(backward_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   int(kSmem));
      err != cudaSuccess)
    return int(err);
  const dim3 grid((p.max_seqlen + kQueryRows - 1) / kQueryRows, p.num_docs, p.q_heads);
  backward_dq_kernel<D><<<grid, kThreads, kSmem, stream>>>(p);
  return int(cudaGetLastError());
}

}  // namespace

int launch_backward_dq(const BackwardParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 128) return launch<128>(p, s);
  if (p.head_dim == 64) return launch<64>(p, s);
  return int(cudaErrorInvalidValue);
}

}  // namespace flamia::cuda::sm90
